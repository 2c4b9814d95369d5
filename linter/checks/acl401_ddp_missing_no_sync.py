"""ACL401: a DDP model that all-reduces on every micro-step of a manual accumulation window."""

from __future__ import annotations

import libcst as cst

from linter import edits
from linter.context import RuleContext, make_fix
from linter.model import distributed as dist
from linter.model import fsdp2_models as fsdp2
from linter.model.config_space import gate_configuration
from linter.model.cst_util import code, dotted, int_value, keyword, walk
from linter.model.kinds import GateKind, RegionKind
from linter.types import Configuration


def check(ctx: RuleContext) -> None:
    model = ctx.model
    if dist.syncs_each_batch(model):
        return  # an explicit choice to all-reduce on every micro-step
    for loop in model.loops:
        gate = _accumulation_gate(model, loop)
        late = _too_late_regions(ctx, loop, gate)
        if not late and gate is not None and not dist.mentions_sync_control(model, loop):
            _missing_no_sync(ctx, loop, gate)
            _fsdp2_without_sync_switch(ctx, loop, gate)


def _accumulation_gate(model, loop):
    """The step gate of a manual accumulation window (K > 1) around a backward of the loop;
    None under `accelerator.accumulate()`, which applies `no_sync` itself."""
    for stmt in [s.stmt for s in loop.backwards] + loop.delegated:  # `self.backward(loss)`
        if model.regions_around(stmt, RegionKind.ACCUMULATE) or model.on_update_step(loop, stmt):
            continue
        gate = model.gate_for(loop, stmt)
        if (
            gate is None
            or gate.k is None
            or gate.kind not in (GateKind.MODULO, GateKind.COUNTER, GateKind.MICRO_LOOP)
        ):
            continue
        value = model.fixed_int(gate.k)
        if value is None or value > 1:
            return gate
    return None


# `with m.no_sync():` around the backward only -------------------------------------------------
def _too_late_regions(ctx, loop, gate) -> bool:
    """`with m.no_sync():` blocks that hold a backward but not the forward: DDP reads the flag
    in forward, so the block changes nothing. Blocks that hold the forward (or a call handed
    the model, which may run it) are correct."""
    model = ctx.model
    found = False
    for region in dist.no_sync_regions(model, loop.scope):
        if not any(f.node is loop.node for f in region.frames):
            continue
        inside = [s for s in loop.backwards if _in_with(s.stmt, region.with_node)]
        if not inside or region.target is None or region.strategy_decides:
            continue
        if _fsdp1_model(model, region.target, loop.scope):
            continue  # FSDP reads the flag in its post-backward hook: the block is enough
        held = dist.ddp_held_by(model, region.target, loop.scope) or region.target
        calls = [c for c in model.calls_in_with(region.with_node)]
        if dist.forward_calls(model, calls, held) or dist.calls_handed(model, calls, held):
            continue
        forwards = dist.forward_calls(model, dist.loop_calls(model, loop), held)
        if not forwards and _forward_bypasses_ddp(model, loop, held):
            continue
        found = True
        fix, note = _move_forward_in(ctx, loop, gate, region, forwards)
        line = ctx.line_of(region.bound.stmt.line) if region.bound else 0
        ctx.report(
            region.where,
            f"{region.spelled(line)} holds the backward but not `{region.target}`'s forward: "
            "DDP decides in forward whether to all-reduce, so every micro-step still all-reduces",
            fix,
            notes=(note,) if note else (),
            configuration=gate_configuration(model, gate, loop.scope),
        )
    return found


def _fsdp1_model(model, target: str, scope) -> bool:
    """`target` is bound to `FullyShardedDataParallel(...)` (FSDP1) in its function or module,
    directly or by a module function that returns one (`model = setup_fsdp_sync(model)`)."""
    defs = list(scope.defs.get(target, ())) or list(model.module_defs(target))
    return any(_builds_fsdp1(model, d.value, d.stmt.scope, 0) for d in defs)


def _builds_fsdp1(model, value, scope, depth: int) -> bool:
    if not isinstance(value, cst.Call) or depth > 2:
        return False
    qual = model.imports.qualify(value.func) or ""
    if qual.rsplit(".", 1)[-1] == "FullyShardedDataParallel":
        return True
    helper = model.local_function(value.func, scope)
    if helper is None:
        return False
    for returned, stmt in helper.returns:
        text = dotted(returned)
        bound = helper.defs_before(text, stmt.order + 1) if text is not None else []
        values = [returned, *(d.value for d in bound)]
        if any(_builds_fsdp1(model, v, helper, depth + 1) for v in values):
            return True
    return False


def _forward_bypasses_ddp(model, loop, held) -> bool:
    """The loop runs the model only through `held.module(...)`: nothing all-reduces at all
    (ACL405's one finding); where `no_sync` must go is asked again once it calls `held`."""
    if not isinstance(held, dist.DDPModel):
        return False
    return bool(dist.module_calls(model, held, dist.loop_calls(model, loop)))


def _in_with(stmt, with_node) -> bool:
    return any(f.node is with_node for f in stmt.frames)


def _move_forward_in(ctx, loop, gate, region, forwards):
    if gate is None:
        return None, "no fix: no accumulation step gate was found to make `no_sync` conditional"
    if len(region.with_node.items) != 1 or not forwards:
        return None, "no fix: move the forward into the `no_sync()` block by hand"
    if region.bound is not None and not region.conditional:
        return None, f"no fix: move the forward into `with {code(region.item.item)}:` by hand"
    block, first, last = _common_block(loop, gate, [forwards[0].stmt.line, region.with_node])
    if block is None or block[last] is not region.with_node:
        return None, "no fix: the forward and the `no_sync()` block are in different blocks"
    if region.bound is not None and edits.index_holding(block, region.bound.stmt.line) in range(
        first, last
    ):
        name = code(region.item.item)
        return None, f"no fix: bind `{name}` first, then move the forward into `with {name}:`"
    context = _conditional_context(ctx, loop, gate, block, first, last, code(region.call))
    if isinstance(context, str):
        return None, context
    expr, import_edit = context
    if region.conditional:
        expr = code(region.item.item)
    edit = edits.move_into_with(ctx, block, first, region.with_node, expr)
    if edit is None:
        return None, "no fix: the block's layout cannot be rewritten cleanly"
    return _fix(edit, import_edit), None


# no `no_sync` at all ---------------------------------------------------------------------
def _missing_no_sync(ctx, loop, gate) -> None:
    model = ctx.model
    found = dist.ddp_models_in(model, loop)
    if not found:
        _prepared_without_sync(ctx, loop, gate)
        return
    held, forward = found[0]
    note = None
    fix = None
    if len(found) > 1:
        note = "no fix: several DDP models run in this loop; put each under `no_sync()`"
    else:
        fix, note = _wrap_micro_step(ctx, loop, gate, held, forward)
    k = code(gate.k) if int_value(gate.k) is not None else f"`{code(gate.k)}`"
    ctx.report(
        forward.call,
        f"DDP model `{held.name}` (line {ctx.line_of(held.call)}) all-reduces its gradients on "
        f"every micro-step, but the optimizer steps only every {k} micro-steps: run the "
        "forward and backward of the other micro-steps under `no_sync()`",
        fix,
        notes=(note,) if note else (),
        configuration=gate_configuration(ctx.model, gate, loop.scope),
    )


# Accelerate's prepared model is DDP only when the script is launched on several processes.
_MULTI_PROCESS = Configuration(
    affects_default=False,
    condition="under a multi-process launch (`accelerate launch`, `torchrun`), where the "
    "prepared model is DDP",
    knobs=("num_processes",),
)


def _prepared_without_sync(ctx, loop, gate) -> None:
    """A prepared model in a loop that gates the optimizer on K itself, with neither
    `accumulate()` nor `accelerator.no_sync(model)`: a warning, real under several processes."""
    found = dist.prepared_models_in(ctx.model, loop)
    if not found or _other_engine_plugin(ctx.model):
        return
    name, prepare, forward = found[0]
    engine = ctx.model.engine_in_scope(loop.scope) or "accelerator"
    k = code(gate.k) if int_value(gate.k) is not None else f"`{code(gate.k)}`"
    ctx.report(
        forward.call,
        f"`{name}` (prepared at line {ctx.line_of(prepare)}) is DDP under a multi-process "
        f"launch and then all-reduces its gradients on every micro-step, but the optimizer "
        f"steps only every {k} micro-steps: run the other micro-steps' forward and backward "
        f"under `{engine}.no_sync({name})`, or use `{engine}.accumulate({name})` with "
        "`gradient_accumulation_steps`",
        severity="warning",
        configuration=_under_several_processes(gate_configuration(ctx.model, gate, loop.scope)),
    )


_PLUGINS = ("deepspeed_plugin", "fsdp_plugin", "megatron_lm_plugin")


def _other_engine_plugin(model) -> bool:
    """An Accelerator built with a DeepSpeed, FSDP or Megatron-LM plugin: its prepared model
    is no DDP (the catalogue leaves FSDP and DeepSpeed alone)."""
    for engine in model.setup.engines.values():
        call = engine.node
        if isinstance(call, cst.Call) and any(
            (value := keyword(call, name)) is not None and code(value) != "None"
            for name in _PLUGINS
        ):
            return True
    return False


def _under_several_processes(k: Configuration | None) -> Configuration:
    """The multi-process launch, and K's own condition when K comes from a knob."""
    if k is None:
        return _MULTI_PROCESS
    return Configuration(
        affects_default=False,
        condition=f"{k.condition} and {_MULTI_PROCESS.condition}",
        knobs=(*k.knobs, *_MULTI_PROCESS.knobs),
    )


def _fsdp2_without_sync_switch(ctx, loop, gate) -> None:
    """An FSDP2 model reduce-scatters in every backward unless its gradient sync is switched
    off; the catalogue makes this a hint (info): skipping the sync keeps the unsharded
    gradients in memory until the last micro-step."""
    for sharded, forward in fsdp2.sharded_in(ctx.model, loop):
        k = code(gate.k) if int_value(gate.k) is not None else f"`{code(gate.k)}`"
        ctx.report(
            forward.call,
            f"FSDP2 model `{sharded.name}` (sharded on line {ctx.line_of(sharded.call)}) "
            f"reduce-scatters its gradients on every micro-step, but the optimizer steps only "
            f"every {k} micro-steps: call `{sharded.name}.set_requires_gradient_sync(False)` "
            "before the other micro-steps' backward and `True` before the last one's (that "
            "keeps their unsharded gradients in memory until then)",
            severity="info",
            configuration=gate_configuration(ctx.model, gate, loop.scope),
        )


def _wrap_micro_step(ctx, loop, gate, held, forward):
    """The forward-to-backward lines under `nullcontext() if <update step> else m.no_sync()`;
    a model wrapped in DDP only on distributed runs gets `getattr(m, "no_sync", nullcontext)()`,
    so single-process runs keep working."""
    if gate.caller is not None:
        return None, (
            f"no fix: the optimizer steps in `{gate.caller.name}`, which calls this function "
            "every micro-step; put the call under `no_sync()` on non-final micro-steps there"
        )
    backwards = [s.stmt for s in loop.backwards] + loop.delegated
    backwards = [s for s in backwards if not ctx.model.on_update_step(loop, s)]
    targets = [forward.stmt.line, *(s.line for s in backwards)]
    block, first, last = _common_block(loop, gate, targets)
    if block is None:
        return None, "no fix: the forward and the backward are in different blocks"
    owner = _owner_text(ctx.model, forward, held)
    no_sync = f"{owner}.no_sync()"
    if not dist.wrapped_on_every_path(ctx.model, held):
        no_sync = f'getattr({owner}, "no_sync", {{nullcontext}})()'
    context = _conditional_context(ctx, loop, gate, block, first, last, no_sync)
    if isinstance(context, str):
        return None, context
    expr, import_edit = context
    edit = edits.wrap_in_with(ctx, block[first], block[last], expr)
    if edit is None:
        return None, "no fix: the micro-step's lines cannot be re-indented cleanly"
    return _fix(edit, import_edit), None


def _fix(edit, import_edit):
    message = "Run the forward and backward of non-final micro-steps under `no_sync()`"
    edits = [edit] if import_edit is None else [import_edit, edit]
    return make_fix(message, *edits)


def _owner_text(model, forward, held) -> str:
    """How the loop spells the DDP model: the callee of `model(x)`, or the argument handed."""
    func = dotted(forward.call.func) or ""
    func = func.removesuffix(".forward")
    scope = forward.stmt.scope
    if dist.ddp_held_by(model, func, scope) is held:
        return func
    for arg in forward.call.args:
        if dist.ddp_held_by(model, dotted(arg.value), scope) is held:
            return dotted(arg.value)
    return held.name


# the restructuring -------------------------------------------------------------------------
def _common_block(loop, gate, targets):
    """(statements, first index, last index) of the deepest block holding all `targets`,
    starting from the loop (or the micro-step loop); (None, 0, 0) when there is none."""
    return edits.common_block(gate.node if gate.kind == GateKind.MICRO_LOOP else loop.node, targets)


def _conditional_context(ctx, loop, gate, block, first, last, no_sync: str):
    """(`nullcontext() if <update step> else m.no_sync()`, an import edit or None), or the
    reason no fix is offered."""
    steps = {id(s.stmt.line) for s in loop.steps}
    for statement in block[first : last + 1]:
        if id(statement) in steps or any(id(n) in steps for n in walk(statement)):
            return "no fix: the optimizer step is inside the micro-step's block"
        if gate.node is statement or any(n is gate.node for n in walk(statement)):
            return "no fix: the step gate is inside the micro-step's block"
    condition = _update_condition(ctx, loop, gate, block[first])
    if condition is None:
        return (
            "no fix: the step condition cannot be evaluated before the forward (it reads a "
            "counter that changes in between); wrap the micro-step by hand"
        )
    name, import_edit = edits.stdlib_name(ctx, "contextlib", "nullcontext")
    no_sync = no_sync.replace("{nullcontext}", name)
    test, update_when_true = condition
    if update_when_true:
        return f"{name}() if {test} else {no_sync}", import_edit
    return f"{no_sync} if {test} else {name}()", import_edit


def _update_condition(ctx, loop, gate, start):
    """(test text, whether the update step is where it holds), readable before `start`."""
    if gate.kind == GateKind.MICRO_LOOP:
        index = dist.range_index(gate.node)
        if index is None:
            return None
        return f"{index} == {_operand(gate.k)} - 1", True
    test = gate.test
    if test is None or not _plain(test):
        return None
    names = {n.value for n in walk(test) if isinstance(n, cst.Name)}
    names |= {dotted(n) for n in walk(test) if isinstance(n, cst.Attribute)} - {None}
    begin = _first_order(start, loop)
    end = _first_order(gate.node, loop)
    classes = ctx.model.classes
    if any(
        d.stmt.scope.name != "__init__"
        for n in names
        for d in classes.attribute_defs(loop.scope, n)
    ):
        return None  # a counter on `self` that another method may move (`self.micro_step`)
    for name in names:
        for d in loop.scope.defs.get(name, ()):
            if begin <= d.stmt.order < end and dist.inside(d.stmt, loop.node):
                return None
    text = code(test)
    if isinstance(test, (cst.IfExp, cst.Lambda, cst.NamedExpr)):
        text = f"({text})"
    return text, gate.holds


def _plain(test) -> bool:
    """Side-effect free: names, numbers, arithmetic, comparisons and `len(...)` only."""
    for node in walk(test):
        if isinstance(node, cst.Call) and dotted(node.func) != "len":
            return False
        if isinstance(node, (cst.Await, cst.Yield, cst.NamedExpr, cst.Lambda)):
            return False
    return True


def _first_order(node, loop) -> int:
    orders = [
        s.order for s in loop.scope.stmts if s.line is node or any(f.node is node for f in s.frames)
    ]
    return min(orders, default=0)


def _operand(node) -> str:
    text = code(node)
    atoms = (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)
    return text if isinstance(node, atoms) or node.lpar else f"({text})"
