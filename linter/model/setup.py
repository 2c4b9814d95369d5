"""Setup facts: which names hold an engine, a GradScaler, optimizers, schedulers, DDP models,
and which objects went through `prepare(...)`.

Names are keyed by their expression text (`accelerator`, `self.accelerator`), module-wide: a
training script rarely reuses one name for two different roles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from linter.model.callgraph import CallGraph
from linter.model.cst_util import (
    code,
    dotted,
    has_star_kwargs,
    is_false,
    keyword,
    last_part,
    method_call,
    positional,
    string_value,
)
from linter.model.evaluates import constructions
from linter.model.functions import Def, Scope
from linter.model.kinds import BuiltKind, EngineKind
from linter.model.names import Imports

ENGINE_CLASSES = {
    "Accelerator": EngineKind.ACCELERATE,
    "Engine": EngineKind.GUARD,
    "Fabric": EngineKind.FABRIC,
}
# Packages whose engine class the qualified name must come from (a bare name is trusted).
_ENGINE_PACKAGES = ("accelerate", "guard", "lightning", "lightning_fabric", "pytorch_lightning")
_PRECISIONS = {"fp16", "bf16", "no", "fp8"}


@dataclass(eq=False)
class Engine:
    name: str
    kind: EngineKind
    node: cst.CSTNode | None  # None for one recognised only by its name
    mixed_precision: str | None = None  # literal value, None when not statically known
    accum: cst.BaseExpression | None = None  # the gradient_accumulation_steps expression


@dataclass(eq=False)
class Scaler:
    name: str
    node: cst.CSTNode
    enabled: bool | None  # False only for a literal `enabled=False`; None: decided at runtime


@dataclass(eq=False)
class Prepared:
    name: str
    original: str
    engine: str
    node: cst.CSTNode
    scope: Scope | None = None


@dataclass
class Setup:
    engines: dict[str, Engine] = field(default_factory=dict)
    scalers: dict[str, Scaler] = field(default_factory=dict)
    optimizers: dict[str, cst.CSTNode] = field(default_factory=dict)
    schedulers: dict[str, cst.CSTNode] = field(default_factory=dict)
    ddp_models: dict[str, cst.CSTNode] = field(default_factory=dict)
    prepared: dict[str, Prepared] = field(default_factory=dict)
    prepared_defs: set[Def] = field(default_factory=set)  # every assignment of a prepare(...)

    def constructs_engine(self) -> bool:
        return any(
            e.kind in (EngineKind.ACCELERATE, EngineKind.GUARD) for e in self.engines.values()
        )


_OPTIMIZER_FACTORIES = re.compile(r"(^|\.)(create_optimizer\w*|configure_optimizers)$")
_SCHEDULER_FACTORIES = re.compile(r"(^|\.)(get_\w*schedule\w*|get_scheduler)$")


def built_kind(qual: str) -> BuiltKind | None:
    """What a constructor call builds, from its qualified name."""
    last = last_part(qual)
    if last in ("GradScaler", "ShardedGradScaler"):
        return BuiltKind.SCALER
    if engine_kind(qual) is not None:
        return BuiltKind.ENGINE
    if last in ("DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP"):
        return BuiltKind.DDP
    if qual.startswith("torch.optim.lr_scheduler.") or _SCHEDULER_FACTORIES.search(qual):
        return BuiltKind.SCHEDULER
    if _OPTIMIZER_FACTORIES.search(qual):
        return BuiltKind.OPTIMIZER
    if qual.startswith(("torch.optim.", "bnb.optim.", "bitsandbytes.optim.")):
        return BuiltKind.OPTIMIZER
    if qual in ("transformers.AdamW", "transformers.optimization.AdamW", "AdamW", "Adafactor"):
        return BuiltKind.OPTIMIZER
    return None


def engine_kind(qual: str) -> EngineKind | None:
    """The library of an engine class (`Accelerator`, `Engine`, `Fabric`) a call constructs."""
    last = last_part(qual)
    if last in ENGINE_CLASSES and (qual == last or qual.split(".")[0] in _ENGINE_PACKAGES):
        return ENGINE_CLASSES[last]
    return None


class SetupCollector:
    def __init__(self, scopes: list[Scope], imports: Imports, graph: CallGraph) -> None:
        self.imports = imports
        self.graph = graph
        self.setup = Setup()
        self._plugins: dict[str, cst.BaseExpression] = {}
        defs = [d for scope in scopes for ds in scope.defs.values() for d in ds]
        defs.sort(key=lambda d: d.stmt.order)
        for d in defs:
            self._plugin(d)
        for d in defs:
            self._constructed(d)
        for d in defs:
            self._prepared(d)

    def _constructors(self, d: Def) -> list[cst.Call]:
        """The calls an assignment's value may evaluate to (`X(...) if c else None`, and what
        the module's own helper it calls returns, for a single target)."""
        single = d.tuple_index is None  # `a, b = helper()`: which part is which is not followed
        return list(constructions(self.graph, d.value, d.stmt.scope, helpers=single))

    def _plugin(self, d: Def) -> None:
        for call in self._constructors(d):
            if last_part(self.imports.qualify(call.func)) == "GradientAccumulationPlugin":
                steps = keyword(call, "num_steps")
                if steps is not None:
                    self._plugins[d.target] = steps

    def _constructed(self, d: Def) -> None:
        if d.op != "=":
            return
        for call in self._constructors(d):
            qual = self.imports.qualify(call.func) or ""
            if last_part(qual) == "initialize" and qual.startswith("deepspeed"):
                if d.tuple_index in (0, None):
                    self.setup.engines[d.target] = Engine(d.target, EngineKind.DEEPSPEED, call)
                continue
            kind = built_kind(qual)
            if d.tuple_index is not None and kind != BuiltKind.OPTIMIZER:
                continue
            if kind == BuiltKind.ENGINE:
                self.setup.engines[d.target] = self._engine(d.target, engine_kind(qual), call)
            elif kind == BuiltKind.SCALER:
                enabled = keyword(call, "enabled")
                state = None if enabled is not None and not _is_true(enabled) else True
                if is_false(enabled):
                    state = False
                self.setup.scalers[d.target] = Scaler(d.target, call, state)
            elif kind == BuiltKind.OPTIMIZER:
                self.setup.optimizers[d.target] = call
            elif kind == BuiltKind.SCHEDULER:
                self.setup.schedulers[d.target] = call
            elif kind == BuiltKind.DDP:
                self.setup.ddp_models[d.target] = call

    def _engine(self, name: str, kind: EngineKind, call: cst.Call) -> Engine:
        engine = Engine(name, kind, call)
        precision = keyword(call, "mixed_precision")
        value = string_value(precision)
        if value in _PRECISIONS:
            engine.mixed_precision = value
        elif precision is None and _is_true(keyword(call, "fp16")):
            engine.mixed_precision = "fp16"
        if has_star_kwargs(call):
            engine.mixed_precision = None
        engine.accum = keyword(call, "gradient_accumulation_steps")
        plugin = keyword(call, "gradient_accumulation_plugin")
        if engine.accum is None and plugin is not None:
            if isinstance(plugin, cst.Call):
                engine.accum = keyword(plugin, "num_steps")
            else:
                engine.accum = self._plugins.get(dotted(plugin) or "")
        return engine

    def _prepared(self, d: Def) -> None:
        if d.op != "=" or not isinstance(d.value, cst.Call):
            return
        if not is_prepare_call(d.value):
            return
        engine = dotted(method_call(d.value)[0]) or ""
        if engine not in self.setup.engines and "accelerat" not in engine:
            return
        args = positional(d.value)
        index = d.tuple_index if d.tuple_index is not None else 0
        if index < len(args) and (d.tuple_index is not None or len(args) == 1):
            original = code(args[index])
            self.setup.prepared[d.target] = Prepared(
                d.target, original, engine, d.value, d.stmt.scope
            )
            self.setup.prepared_defs.add(d)
            for table in (self.setup.optimizers, self.setup.schedulers, self.setup.ddp_models):
                if original in table:
                    table.setdefault(d.target, table[original])


# Accelerate's one-object forms, by the kind of object they prepare; `prepare(...)` takes any.
PREPARE_ONE = {
    "model": "prepare_model",
    "data_loader": "prepare_data_loader",
    "optimizer": "prepare_optimizer",
    "scheduler": "prepare_scheduler",
}


def is_prepare(method: str | None, *kinds: str) -> bool:
    """Whether calling `method` prepares objects: the one definition of a prepare call.

    `prepare(...)` always does; the one-object form of a kind (`prepare_data_loader` for
    "data_loader") only where the caller asks for that kind."""
    return method == "prepare" or any(method == PREPARE_ONE[kind] for kind in kinds)


def is_prepare_call(value: cst.CSTNode, kinds: tuple[str, ...] = ("model",)) -> bool:
    """`accelerator.prepare(...)`, or `accelerator.prepare_model(...)` for the default kind."""
    pair = method_call(value)
    return pair is not None and is_prepare(pair[1], *kinds)


def _is_true(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"
