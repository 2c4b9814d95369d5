"""Precision facts: autocast regions (device, dtype, enabled-ness), the engine's statically known
precision, the file's fp16 paths, and the dtypes models' parameters are cast to.

Dtypes are the words "fp16", "bf16" and "fp32"; None means "not statically known" (a dtype or a
device taken from a variable, a precision read from a config file or the command line). Rules
ask these questions through functions that take the `Model`; each fact is built once per module
(`model.memo`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from linter.model.cst_util import (
    code,
    dotted,
    has_star_kwargs,
    is_false,
    keyword,
    last_part,
    positional,
    string_value,
    walk,
)
from linter.model.functions import Stmt
from linter.model.kinds import EngineKind, FrameKind, RegionKind
from linter.model.loops import Region
from linter.model.setup import Engine, Scaler

FP16, BF16, FP32 = "fp16", "bf16", "fp32"
DTYPES = {  # the dtype word of a torch dtype
    "torch.float16": FP16,
    "torch.half": FP16,
    "torch.bfloat16": BF16,
    "torch.float32": FP32,
    "torch.float": FP32,
}
_DEVICE_DEFAULT = {"cuda": FP16, "cpu": BF16}  # autocast's dtype when none is written
_ENGINE_DTYPE = {"fp16": FP16, "bf16": BF16, "no": FP32}
_OLD_API = {"torch.cuda.amp.autocast": "cuda", "torch.cpu.amp.autocast": "cpu"}
_NO_GRAD = {"torch.no_grad", "torch.inference_mode"}
# An `enabled=` expression that names a dtype or precision follows the fp16 choice.
_PRECISION_WORDS = re.compile(r"fp16|float16|half|dtype|precision", re.I)
_FP16_NAME = re.compile(r"(^|_)(fp16|float16)($|_)", re.I)
_FP16_STRINGS = {"fp16", "float16", "half", "16", "16-mixed"}
_MODULE_METHODS = {"to", "half", "bfloat16", "float", "cuda", "cpu", "requires_grad_", "train"}


# autocast regions --------------------------------------------------------------------------
@dataclass(eq=False)
class Autocast:
    """One autocast region and what it runs in."""

    region: Region
    device: str | None  # "cuda" / "cpu"; None when taken from a variable
    dtype: str | None  # written, or the device's default; None when not statically known
    explicit: bool  # a dtype is written at the call
    enabled: bool | None  # False for a literal `enabled=False`; None: decided at runtime
    engine: Engine | None = None  # the engine of `accelerator.autocast()`
    switch: cst.BaseExpression | None = None  # the `enabled=` expression decided at runtime
    handed_in: bool = False  # `with autocast():` where `autocast` is not torch's (a parameter)

    @property
    def by_engine(self) -> bool:
        return self.region.kind == RegionKind.ENGINE_AUTOCAST

    @property
    def may_be_fp16(self) -> bool:
        """fp16, or a dtype the linter cannot see (written as a variable, or the default of a
        device taken from a variable)."""
        return self.dtype == FP16 or self.dtype is None

    @property
    def fp16_by_default(self) -> bool:
        """No dtype written and the device is not known to be the CPU: torch's CUDA default,
        float16, applies (not for a region factory handed in, whose defaults are unknown)."""
        return not self.explicit and not self.handed_in and self.dtype in (FP16, None)


def autocasts(model) -> list[Autocast]:
    """Every autocast region of the module (user regions and `accelerator.autocast()`)."""
    return model.memo("precision.autocasts", _build_autocasts)


def autocast_of(model, region: Region) -> Autocast | None:
    for cast in autocasts(model):
        if cast.region is region:
            return cast
    return None


def innermost_autocast(model, stmt: Stmt) -> Autocast | None:
    """The autocast region nearest around a statement (lexically): an `enabled=False` island
    inside a region is what the statement runs under."""
    order = {id(f.node): i for i, f in enumerate(stmt.frames) if f.kind == FrameKind.WITH}
    regions = model.regions_around(stmt, RegionKind.AUTOCAST) + model.regions_around(
        stmt, RegionKind.ENGINE_AUTOCAST
    )
    if not regions:
        return None
    nearest = max(regions, key=lambda r: order[id(r.with_node)])
    return autocast_of(model, nearest)


def under_no_grad(model, region: Region) -> bool:
    """Whether the region runs with gradients off (`with torch.no_grad(), autocast(...):` or a
    `no_grad` block around it): an inference region."""
    calls = [i.item for f in region.frames if f.kind == FrameKind.WITH for i in f.node.items]
    scope = _scope_of(model, region)
    if scope is not None and isinstance(scope.node, cst.FunctionDef):
        calls += [d.decorator for d in scope.node.decorators]
    for call in calls:
        func = call.func if isinstance(call, cst.Call) else call
        if (model.imports.qualify(func) or "") in _NO_GRAD:
            return True
    return False


def _build_autocasts(model) -> list[Autocast]:
    found = []
    for region in model.regions:
        if region.kind == RegionKind.AUTOCAST:
            found.append(_user_autocast(model, region))
        elif region.kind == RegionKind.ENGINE_AUTOCAST:
            found.append(_engine_autocast(model, region))
    return found


def _user_autocast(model, region: Region) -> Autocast:
    call = region.call
    qual = model.imports.qualify(call.func) or ""
    args = positional(call)
    old_api = qual in _OLD_API  # positional `(enabled, dtype, ...)`, not `(device, dtype, ...)`
    handed_in = "." not in qual and not model.imports.is_imported(call.func)
    if old_api:
        device = _OLD_API[qual]
    else:
        device_arg = keyword(call, "device_type") or (args[0] if args else None)
        device = _device(model, device_arg, region)
    dtype_arg = keyword(call, "dtype") or (args[1] if len(args) > 1 else None)
    enabled_arg = keyword(call, "enabled")
    if enabled_arg is None:
        index = 0 if old_api else 2
        enabled_arg = args[index] if len(args) > index else None
    if dtype_arg is not None:
        dtype = DTYPES.get(model.imports.qualify(dtype_arg) or "")
    else:
        dtype = None if handed_in else _DEVICE_DEFAULT.get(device or "")
    enabled = _literal_bool(enabled_arg)
    switch = enabled_arg if enabled is None else None
    explicit = dtype_arg is not None
    return Autocast(region, device, dtype, explicit, enabled, switch=switch, handed_in=handed_in)


def _engine_autocast(model, region: Region) -> Autocast:
    engine = model.engine_for(region.receiver, _scope_of(model, region))
    precision = engine_precision_of(engine) if engine is not None else None
    return Autocast(region, None, _ENGINE_DTYPE.get(precision or ""), True, True, engine)


def region_scope(model, region: Region):
    """The function (or the module) whose body holds the region."""
    return _scope_of(model, region)


def _scope_of(model, region: Region):
    for scope in model.scopes:
        if any(w is region.with_node for w, _ in scope.withs):
            return scope
    return None


def _device(model, node: cst.BaseExpression | None, region: Region) -> str | None:
    """ "cuda" / "cpu" for a literal (or a name bound once to one); None otherwise."""
    if node is None:
        return None
    value = string_value(node)
    if value is None and dotted(node) is not None:
        defs = model.module_defs(dotted(node))
        if len(defs) == 1 and defs[0].op == "=" and defs[0].tuple_index is None:
            value = string_value(defs[0].value)
    if value is None:
        return None
    head = value.split(":", 1)[0]
    return head if head in _DEVICE_DEFAULT else None


def _literal_bool(node: cst.BaseExpression | None) -> bool | None:
    if node is None:
        return True
    if is_false(node):
        return False
    if isinstance(node, cst.Name) and node.value == "True":
        return True
    return None


# the engine's precision ----------------------------------------------------------------------
def engine_precision_of(engine: Engine) -> str | None:
    """ "fp16" / "bf16" / "no" / "fp8" when written at the engine's construction; a guard
    engine built without one runs in "no"; None when read from a config file or the CLI."""
    if engine.mixed_precision is not None or engine.node is None:
        return engine.mixed_precision
    if engine.kind != EngineKind.GUARD or not isinstance(engine.node, cst.Call):
        return None
    call = engine.node
    args = positional(call)
    if keyword(call, "mixed_precision") is None and not args and not has_star_kwargs(call):
        return "no"
    value = string_value(args[0]) if args else None
    return value if value in _ENGINE_DTYPE else None


def engines(model) -> list[Engine]:
    """The Accelerators and guard engines the module constructs."""
    return [
        e
        for e in model.setup.engines.values()
        if e.kind in (EngineKind.ACCELERATE, EngineKind.GUARD) and e.node is not None
    ]


def engine_precision(model) -> str | None:
    """The precision every engine of the module is statically set to, else None (no engine,
    engines that disagree, or one whose precision is not statically known)."""
    found = {engine_precision_of(e) for e in engines(model)}
    return found.pop() if len(found) == 1 else None


# scalers and fp16 paths --------------------------------------------------------------------
def live_scalers(model) -> list[Scaler]:
    """GradScalers the module builds that may be enabled (all but a literal `enabled=False`)."""
    return [s for s in model.setup.scalers.values() if s.enabled is not False]


def scaler_follows_fp16(model, scaler: Scaler) -> bool:
    """`GradScaler(enabled=args.fp16)` / `enabled=(dtype == torch.float16)`: the scaler is on
    exactly when the run is fp16 (also through a name bound once to such an expression)."""
    if scaler.enabled is not None or not isinstance(scaler.node, cst.Call):
        return False
    enabled = keyword(scaler.node, "enabled")
    texts = [code(enabled)] if enabled is not None else []
    for sub in walk(enabled) if enabled is not None else ():
        text = dotted(sub)
        if text is not None:
            texts.extend(code(d.value) for d in model.module_defs(text) if d.value is not None)
    return any(_PRECISION_WORDS.search(t) for t in texts)


def scalers_on_under_bf16(model) -> list[Scaler]:
    """Scalers that are on whenever the module's bf16 regions are: always enabled, or switched
    by the same expression as a bf16 autocast (`enabled=args.amp` on both). A scaler switched
    by something else (`enabled=torch.cuda.is_available()`) is left to the runtime check, and
    one that follows the fp16 choice is right."""
    switches = {code(c.switch) for c in autocasts(model) if c.dtype == BF16 and c.switch}
    found = []
    for scaler in live_scalers(model):
        if scaler.enabled is True:
            found.append(scaler)
        elif not scaler_follows_fp16(model, scaler) and isinstance(scaler.node, cst.Call):
            enabled = keyword(scaler.node, "enabled")
            if enabled is not None and code(enabled) in switches:
                found.append(scaler)
    return found


def has_fp16_path(model) -> bool:
    """Whether the file can run in fp16 anywhere: an autocast that may be fp16, an engine in
    fp16 or of unknown precision, or a mention of fp16 (`torch.float16`, `.half()`, `args.fp16`,
    a `"fp16"` choice)."""
    return model.memo("precision.fp16_path", _build_fp16_path)


def _build_fp16_path(model) -> bool:
    if any(c.may_be_fp16 and c.enabled is not False for c in autocasts(model) if not c.by_engine):
        return True
    if any(engine_precision_of(e) in ("fp16", None) for e in engines(model)):
        return True
    for node in walk(model.module, into_scopes=True):
        if isinstance(node, (cst.Attribute, cst.Name)):
            text = dotted(node)
            if text is None:
                continue
            if DTYPES.get(model.imports.qualify(node) or "") == FP16:
                return True
            if _FP16_NAME.search(last_part(text)) or last_part(text) == "half":
                return True
        elif isinstance(node, cst.SimpleString) and string_value(node) in _FP16_STRINGS:
            return True
    return False


def bf16_sources(model) -> list[str]:
    """What makes the module train in bf16: bf16 autocast regions and bf16 engines."""
    found = []
    for cast in autocasts(model):
        if cast.dtype == BF16 and cast.enabled is not False:
            found.append(f"bf16 autocast on line {model.line(cast.region.item.item)}")
    for engine in engines(model):
        if engine_precision_of(engine) == "bf16":
            found.append(f"`{engine.name}` in bf16 (line {model.line(engine.node)})")
    return found


# --show-loops ---------------------------------------------------------------------------------
def describe(model, loop, param_casts: list) -> dict:
    """The precision facts ACL105/106/107/202/204 rely on, for one loop: the engines' precision,
    the autocast regions inside the loop and the dtypes models' parameters are cast to
    (`param_dtypes.param_casts`, handed in: that module builds on this one)."""
    regions = [
        _describe_autocast(model, c)
        for c in autocasts(model)
        if any(f.node is loop.node for f in c.region.frames)
    ]
    casts = [
        {
            "model": c.name,
            "dtype": c.dtype,
            "trained": c.trained,
            "frozen": c.frozen,
            "line": model.line(c.node),
        }
        for c in param_casts
    ]
    precision = engine_precision(model) if engines(model) else "no engine"
    return {
        "engine_precision": precision or "not statically known",
        "autocast": regions,
        "parameter_dtypes": casts,
        "fp16_path": has_fp16_path(model),
    }


def _describe_autocast(model, cast: Autocast) -> dict:
    enabled = {True: "yes", False: "no", None: "at runtime"}[cast.enabled]
    return {
        "code": code(cast.region.item.item),
        "device": cast.device or ("engine" if cast.by_engine else "not statically known"),
        "dtype": cast.dtype or "not statically known",
        "dtype_source": "written" if cast.explicit else "device default",
        "enabled": enabled,
        "line": model.line(cast.region.item.item),
    }
