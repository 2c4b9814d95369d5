"""Distributed facts: DDP-wrapped models, their `no_sync` regions and sync toggles, world-size
expressions, and `DistributedSampler`s with the loaders and epoch loops that use them.

Names resolve as Python does (the function's own assignments, the arguments its callers pass,
the enclosing function, `self.<attr>` of the same class), so a `train(model, ...)` helper sees
the DDP model its caller built. Facts are built once per module through `model.memo`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import (
    code,
    dotted,
    is_false,
    keyword,
    last_part,
    method_call,
    positional,
    string_value,
    walk,
)
from linter.model.functions import CallSite, Def, Scope, Stmt
from linter.model.loops import BACKWARD_KINDS, STEP_KINDS

if TYPE_CHECKING:
    from linter.model import Model, TrainingLoop

_DDP_CLASSES = {"DistributedDataParallel", "DDP"}
# Wrappers named like DDP that have no `no_sync()` or do not all-reduce in DDP's hooks.
_NOT_TORCH_DDP = {"apex", "fairscale", "horovod", "deepspeed"}
# An imported helper that wraps a model in DDP (YOLOv5's `smart_DDP`, `wrap_ddp`).
_DDP_HELPER = re.compile(r"(^|_)ddp$", re.I)
_SYNC_WORDS = {"no_sync", "require_backward_grad_sync"}
_WORLD_SIZE_NAME = re.compile(r"^(\w+_)?world_size$|^num_processes$|^n_?gpus$", re.I)
_MAX_DEPTH = 4
_FORWARD_HELPER = re.compile(r"loss|forward|step|train|run|batch", re.I)
_LOADER_CALLEE = re.compile(r"loader|sampler|prefetch|tqdm|iter|enumerate", re.I)


@dataclass(eq=False)
class DDPModel:
    """A name bound to `DistributedDataParallel(...)` (directly, in one arm of a conditional,
    or through a same-module helper that returns one)."""

    name: str
    call: cst.Call
    scope: Scope
    bound: Def


@dataclass(eq=False)
class Sampler:
    call: cst.Call
    stmt: Stmt
    name: str | None  # None when built inline as a loader argument
    loaders: list[str] = field(default_factory=list)  # in the order they are built


# DDP models ---------------------------------------------------------------------------------
def is_ddp_call(model: Model, node: cst.CSTNode | None) -> bool:
    """`DistributedDataParallel(...)` / `DDP(...)` of torch, under any import alias, or an
    imported helper named for it (`smart_DDP(model)`). FSDP, DeepSpeed, apex and fairscale
    wrappers are other engines."""
    if not isinstance(node, cst.Call):
        return False
    qual = model.imports.qualify(node.func) or ""
    if qual.split(".", 1)[0] in _NOT_TORCH_DDP:
        return False
    if last_part(qual) in _DDP_CLASSES:
        return True
    return model.imports.is_imported(node.func) and bool(_DDP_HELPER.search(last_part(qual)))


def ddp_models(model: Model) -> list[DDPModel]:
    return model.memo("ddp_models", _find_ddp_models)


def _find_ddp_models(model: Model) -> list[DDPModel]:
    found = []
    for scope in model.scopes:
        for defs in scope.defs.values():
            for d in defs:
                if d.op != "=" or d.tuple_index is not None:
                    continue
                call = _ddp_value(model, d.value, scope, 0)
                if call is not None:
                    found.append(DDPModel(d.target, call, scope, d))
    return found


def _ddp_value(model: Model, value, scope: Scope, depth: int) -> cst.Call | None:
    """The DDP call a value evaluates to: `DDP(m)`, `DDP(m) if dist else m`, `wrap(m)` where
    the module's `def wrap` returns a DDP model."""
    if depth > 2 or value is None:
        return None
    if isinstance(value, cst.IfExp):
        return _ddp_value(model, value.body, scope, depth) or _ddp_value(
            model, value.orelse, scope, depth
        )
    if not isinstance(value, cst.Call):
        return None
    if is_ddp_call(model, value):
        return value
    helper = model.local_function(value.func, scope)
    if helper is None:
        return None
    for returned, stmt in helper.returns:
        call = _ddp_value(model, returned, helper, depth + 1)
        text = dotted(returned)
        if call is None and text is not None:
            for d in helper.defs_before(text, stmt.order + 1):
                if d.op == "=" and d.tuple_index is None:
                    call = call or _ddp_value(model, d.value, helper, depth + 1)
        if call is not None:
            return call
    return None


def wrapped_on_every_path(model: Model, held: DDPModel) -> bool:
    """Whether the name is a DDP model on every run: not `if ddp: model = DDP(model)` nor
    `DDP(m) if distributed else m`, where a single-process run keeps a plain module (which
    has no `no_sync()`)."""
    d = held.bound
    if isinstance(d.value, cst.IfExp) or any(f.kind == "if" for f in d.stmt.frames):
        return False
    later = [x for x in held.scope.defs.get(held.name, ()) if x.stmt.order > d.stmt.order]
    return not later


def ddp_held_by(model: Model, text: str | None, scope: Scope, depth: int = 0) -> DDPModel | None:
    """The DDP model an expression holds at this point of `scope`, or None."""
    if not text or depth > _MAX_DEPTH:
        return None
    known = ddp_models(model)
    if text.startswith("self."):
        same = [m for m in known if m.name == text and m.scope.class_name == scope.class_name]
        return same[0] if same else None
    defs = scope.defs.get(text)
    if defs:
        for m in known:
            if any(m.bound is d for d in defs):
                return m
        for d in defs:  # `net = model` or `model = model.to(device)` keep what `model` held
            source = _alias_source(d)
            if source is not None and source != text:
                held = ddp_held_by(model, source, scope, depth + 1)
                if held is not None:
                    return held
        return None
    if text in scope.params:
        sites = model.argument_sites(scope, text)
        if not sites:  # called from elsewhere: the module's model of that name, if one
            same = [m for m in known if m.name == text]
            return same[0] if same else None
        for expr, stmt in sites:
            held = ddp_held_by(model, dotted(expr), stmt.scope, depth + 1)
            if held is not None:
                return held
        return None
    if scope.parent is not None:
        return ddp_held_by(model, text, scope.parent, depth)
    return None


def _alias_source(d: Def) -> str | None:
    if d.op != "=" or d.tuple_index is not None:
        return None
    value = d.value
    pair = method_call(value)
    if pair is not None and pair[1] in ("to", "cuda", "train"):
        value = pair[0]
    return dotted(value)


def forward_calls(model: Model, calls: list[CallSite], held: DDPModel | str) -> list[CallSite]:
    """Calls that run a model's forward: `model(x)`, `model.forward(x)`, a call handed the
    model (`compute_loss(model, batch)`), or a call of a module function that does one of
    these (timm's nested `_forward()`). `held` is a DDP model, or the text of a model that is
    not one (`accelerator.no_sync(model)` of a prepared model)."""
    return [c for c in calls if _runs_forward(model, c.call, c.stmt.scope, held, 0)]


def calls_handed(model: Model, calls: list[CallSite], held: DDPModel | str) -> list[CallSite]:
    """Calls given the model as an argument (`criterion(model, batch)`, whatever the callee's
    name): in a `no_sync()` block that holds the backward, such a call may run the forward."""
    return [
        c
        for c in calls
        if any(_is_model(model, dotted(a.value), c.stmt.scope, held) for a in c.call.args)
    ]


def _is_model(model: Model, text: str | None, scope: Scope, held: DDPModel | str) -> bool:
    if isinstance(held, str):
        return text == held
    return ddp_held_by(model, text, scope) is held


def _runs_forward(model: Model, call: cst.Call, scope: Scope, held, depth: int) -> bool:
    func = dotted(call.func)
    if func is not None and func.endswith(".forward"):
        func = func[: -len(".forward")]
    if _is_model(model, func, scope, held):
        return True
    callee = model.local_function(call.func, scope)
    if callee is None:
        # an imported helper handed the model runs its forward when named for it
        # (`compute_loss(model, batch)`), not `unwrap_ddp(model)` or `save(model)`
        handed = any(_is_model(model, dotted(arg.value), scope, held) for arg in call.args)
        return handed and bool(_FORWARD_HELPER.search(last_part(func)))
    if depth >= 2:
        return False
    return any(_runs_forward(model, c.call, callee, held, depth + 1) for c in callee.calls)


def module_calls(model: Model, held: DDPModel, calls: list[CallSite]) -> list[CallSite]:
    """`<ddp>.module(...)` and `<ddp>.module.forward(...)`: forwards that bypass DDP's hooks."""
    found = []
    for c in calls:
        func = dotted(c.call.func) or ""
        for suffix in (".module", ".module.forward"):
            if func.endswith(suffix):
                owner = func[: -len(suffix)]
                if ddp_held_by(model, owner, c.stmt.scope) is held:
                    found.append(c)
    return found


def loop_calls(model: Model, loop: TrainingLoop) -> list[CallSite]:
    """The calls in a training loop's own body (its function's statements inside it)."""
    return [c for c in loop.scope.calls if _inside(c.stmt, loop.node)]


_GRAD_OFF = {"torch.no_grad", "torch.inference_mode", "torch.set_grad_enabled"}


def _grad_free(model: Model, stmt: Stmt) -> bool:
    """Under `torch.no_grad()` / `inference_mode()` / `set_grad_enabled(...)` (which may be off)."""
    for frame in stmt.frames:
        if frame.kind == "with":
            for item in frame.node.items:
                func = item.item.func if isinstance(item.item, cst.Call) else None
                if (model.imports.qualify(func) or "") in _GRAD_OFF:
                    return True
    return False


def inside(stmt: Stmt, node: cst.CSTNode) -> bool:
    """In the loop `node`, or anywhere in the function when the function is the owner."""
    return node is stmt.scope.node or any(f.node is node for f in stmt.frames)


_inside = inside


def ddp_models_in(model: Model, loop: TrainingLoop) -> list[tuple[DDPModel, CallSite]]:
    """Each DDP model the loop runs forward with gradients on every micro-step (a teacher under
    `no_grad` never all-reduces; a forward only on the update step syncs once), with its first
    such forward call in the loop."""
    calls = [
        c
        for c in loop_calls(model, loop)
        if not _grad_free(model, c.stmt) and not model.on_update_step(loop, c.stmt)
    ]
    found: list[tuple[DDPModel, CallSite]] = []
    for held in ddp_models(model):
        if any(h is held for h, _ in found):
            continue
        forwards = forward_calls(model, calls, held)
        if forwards:
            found.append((held, forwards[0]))
    return found


# no_sync regions and sync toggles --------------------------------------------------------
@dataclass(eq=False)
class NoSync:
    """A `with` whose context is (or may be) a `no_sync()`: `model.no_sync()`,
    `accelerator.no_sync(model)`, `nullcontext() if last else model.no_sync()`."""

    with_node: cst.With
    item: cst.WithItem
    call: cst.Call  # the no_sync() call itself
    conditional: bool  # one arm of a conditional expression
    target: str | None  # the model it is for
    frames: tuple = ()  # the frames of the block's statements (the `with` included)
    bound: Def | None = None  # `ctx = <context>` when the `with` enters a name (`with ctx:`)

    @property
    def where(self) -> cst.CSTNode:
        """Where to report: the `no_sync()` call, or the name in `with ctx:`."""
        return self.call if self.bound is None else self.item.item

    def spelled(self, line: int) -> str:
        """How a message names the region (`line`: the line of the name's binding)."""
        if self.bound is None:
            return f"`{code(self.call)}`"
        name = code(self.item.item)
        verb = "may be" if self.conditional else "is"
        return f"`with {name}:` (`{name}` {verb} `{code(self.call)}`, line {line})"


def no_sync_regions(model: Model, scope: Scope) -> list[NoSync]:
    found = []
    for with_node, frames in scope.withs:
        for item in with_node.items:
            contexts = _entered(model, item.item, scope, frames)
            for context, bound in contexts:
                for node, conditional in _context_calls(context, len(contexts) > 1):
                    enters, target = _no_sync_target(node)
                    if enters:
                        region = NoSync(with_node, item, node, conditional, target, frames, bound)
                        found.append(region)
    return found


def _entered(model: Model, expr, scope: Scope, frames: tuple) -> list[tuple]:
    """(context, the binding it comes from) for each context a `with` may enter: `with ctx:`
    after `ctx = nullcontext() if last else model.no_sync()` enters that value (the region
    code resolves `with ctx:` for autocast alike). Bindings in branches the `with` is not in
    are alternatives, back to one that always runs before it."""
    text = dotted(expr)
    if text is None:
        return [(expr, None)]
    body = [s.order for s in scope.stmts if frames[-1] in s.frames]
    defs = scope.defs_before(text, min(body)) if body else []
    if not defs and text not in scope.defs and text not in scope.params:
        defs = model.module_defs(text)
    found = []
    for d in reversed(defs):
        if d.op != "=" or d.tuple_index is not None:
            break
        found.append((d.value, d))
        if d.stmt.scope is scope and _dominates(d.stmt.frames, frames):
            break
    return found or [(expr, None)]


def _dominates(binding: tuple, block: tuple) -> bool:
    """A binding whose frames all surround the block runs on every path to it."""
    return block[: len(binding)] == binding


def _context_calls(node, conditional: bool):
    if isinstance(node, cst.IfExp):
        yield from _context_calls(node.body, True)
        yield from _context_calls(node.orelse, True)
    elif isinstance(node, cst.Call):
        yield node, conditional


def mentions_sync_control(model: Model, loop: TrainingLoop) -> bool:
    """Whether the loop controls DDP's gradient sync in any way: `no_sync` or
    `require_backward_grad_sync` in its body (an `ExitStack`, a conditional context), in a
    module function it calls, or in a name it reads (`ctx = model.no_sync if ... else ...`)."""
    if _mentions(loop.node):
        return True
    if isinstance(loop.node, cst.FunctionDef) and _caller_controls_sync(model, loop.scope):
        return True
    for c in loop_calls(model, loop):
        callee = model.local_function(c.call.func, c.stmt.scope)
        if callee is not None and _mentions(callee.node):
            return True
    read = {n.value for n in walk(loop.node) if isinstance(n, cst.Name)}
    scope = loop.scope
    while scope is not None:
        for name in read:
            if any(d.value is not None and _mentions(d.value) for d in scope.defs.get(name, ())):
                return True
        scope = scope.parent
    return False


def _caller_controls_sync(model: Model, scope: Scope) -> bool:
    """A per-batch function whose callers run it under `accumulate()` or in a loop that
    controls the sync (`sync_context = partial(accelerator.no_sync, model=model)`)."""
    for call in callers_of(model, scope):
        if model.regions_around(call.stmt, "accumulate"):
            return True
        loops = call.stmt.loops()
        if loops and _mentions(loops[-1]):
            return True
        names = {n.value for n in walk(loops[-1]) if isinstance(n, cst.Name)} if loops else set()
        defs = [d for name in names for d in call.stmt.scope.defs.get(name, ())]
        if any(d.value is not None and _mentions(d.value) for d in defs):
            return True
    return False


def _mentions(node: cst.CSTNode) -> bool:
    """`.no_sync` / `.require_backward_grad_sync`, also spelled as a string
    (`getattr(model, "no_sync", nullcontext)`, `hasattr(model, "no_sync")`)."""
    for n in walk(node, into_scopes=True):
        if isinstance(n, cst.Attribute) and n.attr.value in _SYNC_WORDS:
            return True
        if isinstance(n, cst.SimpleString) and string_value(n) in _SYNC_WORDS:
            return True
    return False


def _no_sync_target(call: cst.Call) -> tuple[bool, str | None]:
    """(whether the call enters `no_sync`, the model it is for): `m.no_sync()`,
    `accelerator.no_sync(m)`, `getattr(m, "no_sync", nullcontext)()`."""
    pair = method_call(call)
    if pair is not None and pair[1] == "no_sync":
        args = positional(call)
        return True, dotted(args[0]) if args else dotted(pair[0])
    inner = call.func
    if isinstance(inner, cst.Call) and dotted(inner.func) == "getattr":
        args = positional(inner)
        if len(args) >= 2 and string_value(args[1]) == "no_sync":
            return True, dotted(args[0])
    return False, None


def syncs_each_batch(model: Model) -> bool:
    """`sync_each_batch=True` (an explicit choice to all-reduce every micro-step)."""
    return model.memo("sync_each_batch", _sync_each_batch)


def _sync_each_batch(model: Model) -> bool:
    return any(
        (value := keyword(c.call, "sync_each_batch")) is not None and not is_false(value)
        for c in model.calls
    )


def sync_toggles(model: Model, loop: TrainingLoop) -> list[tuple[Def, DDPModel]]:
    """`<ddp>.require_backward_grad_sync = <expr>` assignments in the loop."""
    found = []
    for name, defs in loop.scope.defs.items():
        if not name.endswith(".require_backward_grad_sync"):
            continue
        held = ddp_held_by(model, name.rsplit(".", 1)[0], loop.scope)
        for d in defs:
            if held is not None and d.op == "=" and _inside(d.stmt, loop.node):
                found.append((d, held))
    return found


def has_comm_hook(model: Model) -> bool:
    """A registered communication hook decides itself how gradients are combined (a summing
    hook makes a 1/W on the loss necessary)."""
    return model.memo("comm_hook", lambda m: any(c.method == "register_comm_hook" for c in m.calls))


def reduces_gradients_by_hand(model: Model, scope: Scope) -> bool:
    """`dist.all_reduce(p.grad)` in the function: manual gradient averaging, where 1/W is due."""
    for c in scope.calls:
        if last_part(c.func) == "all_reduce" and c.call.args:
            if ".grad" in code(c.call.args[0].value):
                return True
    return False


# world size ---------------------------------------------------------------------------------
def is_world_size(model: Model, node: cst.CSTNode, scope: Scope, depth: int = 0) -> bool:
    """`dist.get_world_size()`, `accelerator.num_processes`, `args.world_size`,
    `int(os.environ["WORLD_SIZE"])`, or a name bound to one of them."""
    if depth > 2:
        return False
    if isinstance(node, cst.Call):
        qual = model.imports.qualify(node.func) or ""
        if last_part(qual) == "get_world_size":
            return True
        if qual in ("int", "float") and node.args:
            return is_world_size(model, node.args[0].value, scope, depth + 1)
        if last_part(qual) in ("getenv", "get") and node.args:
            return string_value(node.args[0].value) == "WORLD_SIZE"
        return False
    if isinstance(node, cst.Subscript):
        return any(
            isinstance(e.slice, cst.Index) and string_value(e.slice.value) == "WORLD_SIZE"
            for e in node.slice
        )
    text = dotted(node)
    if text is None:
        return False
    if _WORLD_SIZE_NAME.match(last_part(text)):
        return True
    defs = scope.defs.get(text) or model.module_defs(text)
    values = [d.value for d in defs if d.op == "=" and d.tuple_index is None]
    return bool(values) and all(is_world_size(model, v, scope, depth + 1) for v in values)


# samplers -------------------------------------------------------------------------------------
def shuffling_samplers(model: Model) -> list[Sampler]:
    return model.memo("samplers", _find_samplers)


def _find_samplers(model: Model) -> list[Sampler]:
    found = []
    for c in model.calls:
        if last_part(model.imports.qualify(c.call.func)) != "DistributedSampler":
            continue
        if _shuffle_off(c.call):
            continue
        name = _bound_name(c)
        sampler = Sampler(c.call, c.stmt, name)
        sampler.loaders = _loaders_of(model, c, name)
        found.append(sampler)
    return found


def _shuffle_off(call: cst.Call) -> bool:
    shuffle = keyword(call, "shuffle")
    args = positional(call)
    if shuffle is None and len(args) > 3:
        shuffle = args[3]
    return is_false(shuffle)


def _bound_name(c: CallSite) -> str | None:
    """The name a call is assigned to, also as one arm of a conditional (`sampler =
    RandomSampler(ds) if single else DistributedSampler(ds)`)."""
    node = c.stmt.node
    value = getattr(node, "value", None)
    arms = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
    if isinstance(node, (cst.Assign, cst.AnnAssign)) and any(arm is c.call for arm in arms):
        targets = node.targets if isinstance(node, cst.Assign) else [node]
        texts = [dotted(t.target) for t in targets]
        return texts[0] if len(texts) == 1 else None
    return None


def _loaders_of(model: Model, c: CallSite, name: str | None) -> list[str]:
    """The names bound to a call that takes the sampler (a `DataLoader(sampler=...)`, a
    `BatchSampler(sampler, ...)` then its loader, a `build_loader(ds, sampler)` helper)."""
    loaders: list[str] = []
    holders = {name} if name else set()
    frontier = [c.call]
    for _ in range(3):
        takers = []
        for other in model.calls:
            if other.call is c.call:
                continue
            if _builds_loader(other, frontier, holders):
                takers.append(other)
        frontier = []
        for taker in takers:
            bound = _bound_name(taker)
            if bound is not None and bound not in holders:
                holders.add(bound)
                loaders.append(bound)
            elif bound is None:
                frontier.append(taker.call)
    return loaders


def _builds_loader(c: CallSite, frontier: list, holders: set[str]) -> bool:
    """A call that builds a loader from the sampler (or from a loader built from it): handed
    as `sampler=` / `batch_sampler=`, or to a callee named for loading or iterating
    (`BatchSampler`, `create_loader`, `tqdm`). `len(loader)` or `train(loader)` give other
    values, not loaders."""
    for arg in c.call.args:
        value = arg.value
        if not any(value is f for f in frontier) and dotted(value) not in holders:
            continue
        if arg.keyword is not None and arg.keyword.value in ("sampler", "batch_sampler"):
            return True
        if _LOADER_CALLEE.search(last_part(c.func)):
            return True
    return False


def prepared_by_engine(model: Model, text: str) -> bool:
    """A loader handed to `accelerator.prepare(...)` (Accelerate sets the epoch itself)."""
    for c in model.calls:
        if c.method in ("prepare", "prepare_data_loader"):
            if any(dotted(a.value) == text for a in c.call.args):
                return True
    return text in model.setup.prepared


def trains(model: Model, node: cst.CSTNode, scope: Scope) -> bool:
    """Whether a loop trains: it reaches a backward and a `.step()` (in its body or in module
    functions it calls). Only a training loader's order matters: evaluation, or gradients
    summed for analysis with no update (head importance), visit the samples in any order."""
    kinds = _reached_kinds(model, node, scope, 0)
    return bool(kinds & set(BACKWARD_KINDS)) and "step" in kinds


def _reached_kinds(model: Model, node: cst.CSTNode, scope: Scope, depth: int) -> set[str]:
    kinds = {s.kind for s in model.sites[id(scope)] if _inside(s.stmt, node)}
    for c in scope.calls:
        if not _inside(c.stmt, node):
            continue
        if c.method == "step":
            kinds.add("step")
        callee = model.local_function(c.call.func, scope) if depth < 2 else None
        if callee is not None:
            kinds |= _reached_kinds(model, callee.node, callee, depth + 1)
    return kinds


def sets_epoch(model: Model, node: cst.CSTNode, scope: Scope, foreign: set[str], depth=0) -> bool:
    """A `.set_epoch(` call in `node` (or in a module function called there) on anything but
    another known sampler or loader (`foreign`)."""
    calls = [(c.call, c.method, c.receiver) for c in scope.calls if _inside(c.stmt, node)]
    calls += [_call_parts(call) for call in _header_calls(node)]
    for call, method, receiver in calls:
        if method == "set_epoch" and not _names_foreign(receiver, foreign):
            return True
        callee = model.local_function(call.func, scope) if depth < 2 else None
        if callee is not None and sets_epoch(model, callee.node, callee, foreign, depth + 1):
            return True
    return False


def _header_calls(node: cst.CSTNode):
    """Calls in the headers of loops, `if`s and `with`s nested in `node`: they run once per
    pass of `node` too (`for x, y in start_epoch(loader, epoch):` in the epoch loop), but the
    scope's calls hold only those of small statements."""
    for sub in walk(node):
        if sub is node:
            continue  # the epoch loop's own header runs once, before the first epoch
        if isinstance(sub, cst.For):
            headers = [sub.iter]
        elif isinstance(sub, (cst.While, cst.If)):
            headers = [sub.test]
        elif isinstance(sub, cst.With):
            headers = [item.item for item in sub.items]
        else:
            continue
        for header in headers:
            yield from (n for n in walk(header) if isinstance(n, cst.Call))


def _call_parts(call: cst.Call) -> tuple[cst.Call, str | None, str | None]:
    pair = method_call(call)
    return call, pair[1] if pair else None, dotted(pair[0]) if pair else None


def _names_foreign(receiver: str | None, foreign: set[str]) -> bool:
    if not receiver:
        return False
    head = receiver.removesuffix(".batch_sampler.sampler").removesuffix(".sampler")
    return receiver in foreign or head in foreign


def step_sites(loop: TrainingLoop):
    return loop.of_kind(*STEP_KINDS)


@dataclass(eq=False)
class EpochLoop:
    """A loop that makes repeated passes over a sampled training loader."""

    node: cst.For | cst.While  # the loop right around the pass (reported)
    outer: cst.CSTNode  # the outermost loop around it (where a `set_epoch` may sit)
    scope: Scope
    helper: Scope | None  # the function that iterates the loader, when the loop calls it


def epoch_loops(model: Model, loader: str) -> list[EpochLoop]:
    """The loops around each training pass over `loader`: around `for b in loader:` in the
    same function, or around a call handing the loader to a function that trains on it."""
    found: list[EpochLoop] = []
    for scope in model.scopes:
        for node in scope.loops:
            if isinstance(node, cst.For) and _iterates(model, node.iter, scope, loader):
                if trains(model, node, scope):
                    found.extend(_around(model, node, scope, None))
        for c in scope.calls:
            if _hands_loader_to_training(model, c, loader):
                callee = model.local_function(c.call.func, scope)
                found.extend(_around(model, c.stmt, scope, callee, within=True))
    unique: dict[int, EpochLoop] = {}
    for loop in found:
        unique.setdefault(id(loop.node), loop)
    return list(unique.values())


def _iterates(model: Model, iterable, scope: Scope, loader: str) -> bool:
    for node in walk(iterable):
        text = dotted(node)
        if text is not None and _holds_loader(model, text, scope, loader, 0):
            return True
    return False


def _holds_loader(model: Model, text: str, scope: Scope, loader: str, depth: int) -> bool:
    if text == loader and (text in _visible_names(scope) or text.startswith("self.")):
        return True
    if depth < 2 and text in scope.params:
        return any(
            _holds_loader(model, dotted(e) or "", s.scope, loader, depth + 1)
            for e, s in model.argument_sites(scope, text)
        )
    return False


def _visible_names(scope: Scope) -> set[str]:
    names: set[str] = set()
    while scope is not None:
        names.update(scope.defs)
        scope = scope.parent
    return names


def _hands_loader_to_training(model: Model, c: CallSite, loader: str) -> bool:
    """`train_one_epoch(model, loader, ...)`: a module function that trains on the loader, or
    an imported one named for training (MAE and DINO keep the pass in another file)."""
    if not any(dotted(a.value) == loader for a in c.call.args):
        return False
    callee = model.local_function(c.call.func, c.stmt.scope)
    if callee is not None:
        return False  # its own loop over the parameter is found directly
    return "train" in last_part(c.func).lower()


def _around(
    model: Model, inner, scope: Scope, helper: Scope | None, within: bool = False
) -> list[EpochLoop]:
    """The epoch loop(s) around a pass: enclosing loops in this function, else the loops
    around this function's calls (a `train_one_epoch` called once per epoch)."""
    chain = _enclosing(scope, inner, within)
    if chain:
        return [EpochLoop(chain[-1], chain[0], scope, helper)]
    if not isinstance(scope.node, cst.FunctionDef):
        return []
    found = []
    for call in callers_of(model, scope):
        loops = call.stmt.loops()
        if loops:
            found.append(EpochLoop(loops[-1], loops[0], call.stmt.scope, scope))
    return found


def _enclosing(scope: Scope, inner, within: bool) -> list[cst.CSTNode]:
    """Loops around a loop node (or around a statement, `within=True`), outermost first."""
    if within:
        return inner.loops()
    for stmt in scope.stmts:
        chain = stmt.loops()
        if inner in chain:
            return chain[: chain.index(inner)]
    return []


def callers_of(model: Model, scope: Scope) -> list[CallSite]:
    """This module's calls of the function `scope` (built once per module)."""
    table = model.memo("callers", _callers)
    return table.get(id(scope), [])


def _callers(model: Model) -> dict[int, list[CallSite]]:
    table: dict[int, list[CallSite]] = {}
    for c in model.calls:
        callee = model.local_function(c.call.func, c.stmt.scope)
        if callee is not None:
            table.setdefault(id(callee), []).append(c)
    return table


# evaluating a sync flag ------------------------------------------------------------------
def never_true_on_step(model: Model, loop: TrainingLoop, expr: cst.BaseExpression) -> bool:
    """Whether a `require_backward_grad_sync` value is False on every micro-step that steps the
    optimizer (`micro_step == K` in `for micro_step in range(K)`). Only what can be evaluated
    counts: a literal, the micro-step index against K, or the loop index under a `% K` gate, for
    K in a few sample values; anything else may be True."""
    if is_false(expr):
        return True
    gate = loop.gate
    if gate is None or gate.k is None:
        return False
    k_text = code(gate.k)
    for k in (2, 3, 8):
        steps = _step_environments(loop, gate, k_text, k)
        if steps is None:
            return False
        values = [_evaluate(expr, env) for env in steps]
        if any(v is None or v for v in values):
            return False
    return True


def _step_environments(loop: TrainingLoop, gate, k_text: str, k: int) -> list[dict] | None:
    """Values of the loop's index on the micro-steps that step, for K = k."""
    if gate.kind == "micro-loop":
        index = _range_index(gate.node)
        return [{index: k - 1, k_text: k}] if index else None
    if gate.kind != "modulo" or gate.test is None:
        return None
    index = _loop_index(loop.node)
    if index is None:
        return None
    envs = []
    for i in range(4 * k):
        env = {index: i, k_text: k}
        holds = _evaluate(gate.test, env)
        if holds is None:
            return None
        if bool(holds) == gate.holds:
            envs.append(env)
    return envs


def _range_index(node) -> str | None:
    """`v` of `for v in range(K)`."""
    if not isinstance(node, cst.For) or not isinstance(node.target, cst.Name):
        return None
    call = node.iter
    if isinstance(call, cst.Call) and dotted(call.func) == "range" and len(call.args) == 1:
        return node.target.value
    return None


def _loop_index(node) -> str | None:
    """`i` of `for i, batch in enumerate(dl)` or `for i in range(n)`."""
    if not isinstance(node, cst.For):
        return None
    call, target = node.iter, node.target
    name = dotted(call.func) if isinstance(call, cst.Call) else None
    if name == "enumerate" and isinstance(target, cst.Tuple) and len(call.args) == 1:
        first = target.elements[0].value
        return first.value if isinstance(first, cst.Name) else None
    if name == "range" and isinstance(target, cst.Name):
        return target.value
    return None


_ARITHMETIC = {
    cst.Add: lambda a, b: a + b,
    cst.Subtract: lambda a, b: a - b,
    cst.Multiply: lambda a, b: a * b,
    cst.FloorDivide: lambda a, b: a // b if b else None,
    cst.Modulo: lambda a, b: a % b if b else None,
}
_COMPARE = {
    cst.Equal: lambda a, b: a == b,
    cst.NotEqual: lambda a, b: a != b,
    cst.LessThan: lambda a, b: a < b,
    cst.LessThanEqual: lambda a, b: a <= b,
    cst.GreaterThan: lambda a, b: a > b,
    cst.GreaterThanEqual: lambda a, b: a >= b,
}


def _evaluate(node, env: dict):
    """The value of a small integer/boolean expression, or None when it reads anything else."""
    if isinstance(node, cst.Integer):
        return int(node.value.replace("_", ""), 0)
    text = dotted(node)
    if text is not None:
        return {"True": True, "False": False}.get(text, env.get(text))
    if isinstance(node, cst.BinaryOperation) and type(node.operator) in _ARITHMETIC:
        left, right = _evaluate(node.left, env), _evaluate(node.right, env)
        if left is None or right is None:
            return None
        return _ARITHMETIC[type(node.operator)](left, right)
    if isinstance(node, cst.UnaryOperation):
        value = _evaluate(node.expression, env)
        if value is None:
            return None
        return (not value) if isinstance(node.operator, cst.Not) else -value
    if isinstance(node, cst.BooleanOperation):
        left, right = _evaluate(node.left, env), _evaluate(node.right, env)
        if left is None or right is None:
            return None
        return (left and right) if isinstance(node.operator, cst.And) else (left or right)
    if isinstance(node, cst.Comparison):
        return _compare(node, env)
    return None


def _compare(node: cst.Comparison, env: dict):
    left = _evaluate(node.left, env)
    result = True
    for target in node.comparisons:
        right = _evaluate(target.comparator, env)
        if left is None or right is None or type(target.operator) not in _COMPARE:
            return None
        result = result and _COMPARE[type(target.operator)](left, right)
        left = right
    return result


# world-size divisions on a loss's path ---------------------------------------------------
@dataclass(eq=False)
class WorldSizeDivision:
    """`loss / W`, `loss /= W` or `loss / (W * K)` on the way to a backward."""

    node: cst.BinaryOperation | None  # the division expression (None for `/=`)
    divisor: cst.BaseExpression
    world_size: cst.BaseExpression  # W itself (the divisor, or one factor of it)
    rest: cst.BaseExpression | None  # K of `W * K`, else None
    bound: Def | None  # the assignment the division happens in (None: in the backward itself)


@dataclass
class _Path:
    divisions: list[WorldSizeDivision] = field(default_factory=list)
    multiplies_world_size: bool = False  # `loss * W / n_tokens`: a global normalisation


_THROUGH = {
    "mean",
    "sum",
    "float",
    "double",
    "half",
    "bfloat16",
    "to",
    "squeeze",
    "clone",
    "contiguous",
    "view",
    "reshape",
    "cuda",
    "cpu",
}


def world_size_divisions(model: Model, loss, stmt: Stmt) -> list[WorldSizeDivision]:
    """The divisions of a backward's loss by the world size, along its assignments in the
    function. None when the path also multiplies by W (`loss * W / n_items` normalises by a
    global count)."""
    path = _Path()
    _walk_loss(model, loss, stmt.scope, stmt.order, None, path, 0)
    return [] if path.multiplies_world_size else path.divisions


def _walk_loss(model: Model, node, scope: Scope, order: int, bound, path: _Path, depth: int):
    if depth > _MAX_DEPTH or node is None:
        return
    text = dotted(node)
    if text is not None:
        defs = scope.defs_before(text, order)
        if defs:
            _walk_def(model, defs[-1], scope, path, depth + 1)
        return
    if isinstance(node, cst.BinaryOperation):
        _walk_binary(model, node, scope, order, bound, path, depth)
    elif isinstance(node, cst.UnaryOperation):
        _walk_loss(model, node.expression, scope, order, bound, path, depth)
    elif isinstance(node, cst.Call):
        scaled = model.scaled_loss(node, scope)
        pair = method_call(node)
        if scaled is not None:
            _walk_loss(model, scaled, scope, order, bound, path, depth)
        elif pair is not None and pair[1] in _THROUGH:
            _walk_loss(model, pair[0], scope, order, bound, path, depth)


def _walk_def(model: Model, d: Def, scope: Scope, path: _Path, depth: int) -> None:
    if d.tuple_index is not None:
        return
    if d.op == "=":
        _walk_loss(model, d.value, scope, d.stmt.order, d, path, depth)
        return
    if d.op == "/=":
        split = _world_size_factor(model, d.value, scope)
        if split is not None:
            path.divisions.append(WorldSizeDivision(None, d.value, split[0], split[1], d))
    elif d.op == "*=" and _has_world_size_factor(model, d.value, scope):
        path.multiplies_world_size = True
    previous = scope.defs_before(d.target, d.stmt.order)
    if previous:
        _walk_def(model, previous[-1], scope, path, depth + 1)


def _walk_binary(model: Model, node, scope: Scope, order: int, bound, path: _Path, depth: int):
    op = node.operator
    if isinstance(op, cst.Divide):
        split = _world_size_factor(model, node.right, scope)
        if split is not None:
            path.divisions.append(WorldSizeDivision(node, node.right, split[0], split[1], bound))
        _walk_loss(model, node.left, scope, order, bound, path, depth)
    elif isinstance(op, cst.Multiply):
        for side in (node.left, node.right):
            if _has_world_size_factor(model, side, scope):
                path.multiplies_world_size = True
            _walk_loss(model, side, scope, order, bound, path, depth)
    elif isinstance(op, (cst.Add, cst.Subtract)):
        _walk_loss(model, node.left, scope, order, bound, path, depth)
        _walk_loss(model, node.right, scope, order, bound, path, depth)


def _world_size_factor(model: Model, divisor, scope: Scope):
    """(W, the other factor or None) when the divisor is W or a product of W and one more."""
    if is_world_size(model, divisor, scope):
        return divisor, None
    if isinstance(divisor, cst.BinaryOperation) and isinstance(divisor.operator, cst.Multiply):
        for mine, other in ((divisor.left, divisor.right), (divisor.right, divisor.left)):
            if is_world_size(model, mine, scope) and not _has_world_size_factor(
                model, other, scope
            ):
                return mine, other
    return None


def _has_world_size_factor(model: Model, node, scope: Scope) -> bool:
    if is_world_size(model, node, scope):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return any(_has_world_size_factor(model, s, scope) for s in (node.left, node.right))
    return False


# --show-loops -----------------------------------------------------------------------------
def describe(model: Model, loop: TrainingLoop) -> dict:
    """What the distributed rules understood about one training loop."""
    ddp = [
        {
            "name": held.name,
            "line": model.line(held.call),
            "forward_line": model.line(forward.call),
            "wrapped_on_every_path": wrapped_on_every_path(model, held),
        }
        for held, forward in ddp_models_in(model, loop)
    ]
    return {
        "ddp_models": ddp,
        "sync_control": mentions_sync_control(model, loop),
        "samplers": _samplers_of(model, loop),
    }


def _samplers_of(model: Model, loop: TrainingLoop) -> list[dict]:
    found = []
    for sampler in shuffling_samplers(model):
        epochs = []
        for loader in sampler.loaders:
            for epoch in epoch_loops(model, loader):
                if _runs_within(loop, epoch):
                    told = sets_epoch(model, epoch.outer, epoch.scope, set()) or (
                        epoch.helper is not None
                        and sets_epoch(model, epoch.helper.node, epoch.helper, set())
                    )
                    epochs.append({"line": model.line(epoch.node), "set_epoch": told})
        if epochs:
            found.append(
                {
                    "name": sampler.name or code(sampler.call),
                    "line": model.line(sampler.call),
                    "loaders": list(sampler.loaders),
                    "epoch_loops": epochs,
                }
            )
    return found


def _runs_within(loop: TrainingLoop, epoch: EpochLoop) -> bool:
    """The training loop is the pass of this epoch loop (inside it, or its helper)."""
    if epoch.helper is loop.scope:
        return True
    return any(
        f.node is epoch.node for s in loop.scope.stmts if _inside(s, loop.node) for f in s.frames
    )
