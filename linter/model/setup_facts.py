"""Setup facts for two mistakes made before the loop starts.

- Device moves that put every rank's model on GPU 0 (ACL501): a fixed index (`.cuda(0)`,
  `.to("cuda:0")`), or a bare `"cuda"` that runs before an Accelerator (or guard engine, or
  `torch.cuda.set_device`) has set the rank's device; after that, `"cuda"` is the rank's own GPU.
- One-shot parameter iterables (ACL505): a name bound to `filter(...)`, `map(...)`, a generator
  expression or `model.parameters()` that something consumes before a clip function receives it.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from linter.model.cst_util import (
    dotted,
    int_value,
    keyword,
    last_part,
    method_call,
    positional,
    string_value,
    walk,
)
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import Def, Scope, Stmt
from linter.model.kinds import EngineKind
from linter.model.loops import same_path
from linter.model.setup import engine_kind

# ---------------------------------------------------------------------------------------------
# ACL505: parameter iterables that are empty by the time they are clipped

_CLIP_FUNCTIONS = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"}
_ONE_SHOT_CALLS = {"filter", "map", "itertools.chain", "itertools.filterfalse", "reversed", "iter"}
_PARAMETER_METHODS = {"parameters"}


@dataclass(eq=False)
class ExhaustedClip:
    """A clip call handed a one-shot iterable that was consumed before it."""

    clip: cst.Call
    argument: cst.BaseExpression
    binding: Def  # the assignment of the iterator
    consumer: str  # how it was used up: "the optimizer", "an earlier clip", ...


def exhausted_clips(model) -> list[ExhaustedClip]:
    return model.memo("setup_facts.exhausted_clips", _find_exhausted_clips)


def _find_exhausted_clips(model) -> list[ExhaustedClip]:
    found = []
    for call in model.calls:
        if not _is_clip_call(model, call):
            continue
        argument = _clip_parameters(call.call)
        text = dotted(argument)
        if text is None:
            continue  # a fresh `model.parameters()` at the clip site is a new iterator
        binding = _binding(model, text, call.stmt)
        if binding is None or not _is_one_shot(model, binding.value):
            continue
        consumer = _consumer(model, binding, call.stmt)
        if consumer is not None:
            found.append(ExhaustedClip(call.call, argument, binding, consumer))
    return found


def _is_clip_call(model, call) -> bool:
    qual = model.imports.qualify(call.call.func) or ""
    if last_part(qual) not in _CLIP_FUNCTIONS:
        return False
    if call.method is None or qual.startswith("torch.nn.utils"):
        return True
    return model.engine_for(call.receiver, call.stmt.scope) is not None


def _clip_parameters(call: cst.Call) -> cst.BaseExpression | None:
    by_name = keyword(call, "parameters")
    if by_name is not None:
        return by_name
    args = positional(call)
    return args[0] if args else None


def _binding(model, text: str, stmt: Stmt) -> Def | None:
    """The one assignment the clip's argument holds: the last one before it in its function,
    else the only one in an enclosing scope (or, for `self.x`, in a method of the class)."""
    scope = stmt.scope
    before = scope.defs_before(text, stmt.order)
    if before:
        return before[-1] if before[-1].op == "=" and before[-1].tuple_index is None else None
    if text in scope.params or text in scope.defs:
        return None  # a parameter, or bound only later in a loop: not visibly a one-shot
    if text.startswith("self."):
        defs = [d for d in model.module_defs(text) if d.stmt.scope.class_name == scope.class_name]
    else:
        defs = _enclosing_defs(text, scope)
    if len(defs) != 1 or defs[0].op != "=" or defs[0].tuple_index is not None:
        return None
    return defs[0]


def _enclosing_defs(text: str, scope: Scope) -> list[Def]:
    outer = scope.parent
    while outer is not None:
        if text in outer.defs:
            return list(outer.defs[text])
        outer = outer.parent
    return []


def _is_one_shot(model, value) -> bool:
    """`filter(...)`, `map(...)`, `(p for p in ...)`, `model.parameters()`: iterators that a
    single pass empties. Lists, tuples and list comprehensions can be read any number of times."""
    if isinstance(value, cst.GeneratorExp):
        return True
    if not isinstance(value, cst.Call):
        return False
    qual = model.imports.qualify(value.func) or ""
    if qual in _ONE_SHOT_CALLS:
        return True
    pair = method_call(value)
    return pair is not None and pair[1] in _PARAMETER_METHODS and not value.args


def _consumer(model, binding: Def, clip: Stmt) -> str | None:
    """What empties the iterator before the clip reads it: a read in between (an optimizer
    constructor, a `list(...)`, a loop over it), or the clip itself on an earlier pass of a loop
    that does not rebind the name."""
    name = binding.target
    home = binding.stmt.scope
    # Statements are compared by their order in the module (no position is computed for the
    # hundreds of statements of a long main()); loop headers, which have none, by line.
    first, last = binding.stmt.order, clip.order if clip.scope is home else None
    for stmt in home.stmts:
        if stmt is binding.stmt or stmt.order <= first or (last is not None and stmt.order >= last):
            continue
        if last is not None and not same_path(stmt, clip):
            continue  # `if adaptive: agc(params) elif norm: clip(params)`: one or the other
        if _reads(stmt.node, name):
            return _describe_consumer(model, stmt.node, name)
    for loop in home.loops:
        if isinstance(loop, cst.For) and _reads(loop.iter, name):
            start = model.line(binding.stmt.node)
            end = model.line(clip.node) if last is not None else None
            if model.line(loop) > start and (end is None or model.line(loop) < end):
                return "a loop over it"
    if _repeats_without_rebinding(binding, clip):
        return "the same clip on an earlier iteration"
    return None


def _repeats_without_rebinding(binding: Def, clip: Stmt) -> bool:
    """A clip in a loop that the binding is outside of: the second pass clips nothing."""
    if clip.scope is not binding.stmt.scope:
        return bool(clip.loops())
    outer = {id(node) for node in binding.stmt.loops()}
    return any(id(node) not in outer for node in clip.loops())


def _reads(node: cst.CSTNode, name: str) -> bool:
    if "." in name:
        return any(dotted(n) == name for n in walk(node) if isinstance(n, cst.Attribute))
    return any(isinstance(n, cst.Name) and n.value == name for n in walk(node))


def _describe_consumer(model, node: cst.CSTNode, name: str) -> str:
    for sub in walk(node):
        if isinstance(sub, cst.Call) and any(_reads(a.value, name) for a in sub.args):
            if model.is_optimizer(_assigned_name(node)) or _builds_optimizer(model, sub):
                return "the optimizer"
            return f"`{dotted(sub.func) or 'a call'}(...)`"
    return "an earlier use"


def _assigned_name(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        return dotted(node.targets[0].target)
    return None


def _builds_optimizer(model, call: cst.Call) -> bool:
    qual = model.imports.qualify(call.func) or ""
    return qual.startswith("torch.optim.") or "optim" in last_part(qual).lower()


# ---------------------------------------------------------------------------------------------
# ACL501: device moves that put every rank's model on GPU 0

_SETS_DEVICE = {"torch.cuda.set_device"}
_STATES = {"PartialState", "AcceleratorState"}  # accelerate's state objects set the device too
# `.to(...)` keywords that only say how the copy is made, gone with the move itself
_TRANSFER_FLAGS = {"non_blocking", "copy"}


@dataclass(eq=False)
class EarlyMove:
    """A move of a model that `prepare` then places, to a device that is GPU 0 on every rank: a
    fixed index, or a bare `"cuda"` before the rank's device is set."""

    call: cst.Call  # the move call (`Net().cuda()`, `model.to(device)`)
    stmt: Stmt
    model_name: str
    prepare_stmt: Stmt
    dtype: cst.Arg | None  # the dtype argument a `.to(device, dtype)` keeps
    statement_only: bool  # `model.cuda()` / `model = model.to(dev)`: the whole line moves
    pinned: str | None = None  # the fixed device written (`cuda:0`); None for a bare "cuda"


def early_device_moves(model) -> list[EarlyMove]:
    return model.memo("setup_facts.early_device_moves", _find_early_moves)


def _find_early_moves(model) -> list[EarlyMove]:
    found = []
    for prepared in model.setup.prepared.values():
        engine = model.setup.engines.get(prepared.engine)
        if engine is None or engine.kind not in (EngineKind.ACCELERATE, EngineKind.GUARD):
            continue
        if not _engine_places(engine) or keyword(prepared.node, "device_placement") is not None:
            continue
        prepare_stmt = _prepare_stmt(model, prepared)
        if prepare_stmt is None or "." in prepared.original:
            continue
        for move in _moves_of(model, prepared.original, prepare_stmt):
            if move.pinned or not device_set_before(model, move.stmt):
                found.append(move)
    unique = {id(m.call): m for m in found}
    return sorted(unique.values(), key=lambda m: m.stmt.order)


def _engine_places(engine) -> bool:
    """`Accelerator(device_placement=False)` leaves placement to the user."""
    if engine.node is None:
        return False
    placement = keyword(engine.node, "device_placement")
    return placement is None or (isinstance(placement, cst.Name) and placement.value == "True")


def _prepare_stmt(model, prepared) -> Stmt | None:
    for d in model.setup.prepared_defs:
        if d.value is prepared.node:
            return d.stmt
    return None


def _moves_of(model, name: str, prepare: Stmt) -> list[EarlyMove]:
    """Moves of `name` in the statements of the prepare's function that come before it: in
    its assignments (`model = Net().cuda()`) and as statements (`model.cuda()`)."""
    moves = []
    scope = prepare.scope
    for stmt in scope.stmts:
        if stmt.order >= prepare.order:
            break
        node = stmt.node
        if isinstance(node, (cst.Assign, cst.AnnAssign)) and _assigns(node, name):
            move = _move_in_chain(model, node.value, stmt.scope)
            if move is not None:
                call, dtype, pinned = move
                whole = dotted(call.func.value) == name
                moves.append(EarlyMove(call, stmt, name, prepare, dtype, whole, pinned))
        elif isinstance(node, cst.Expr) and isinstance(node.value, cst.Call):
            move = _move_in_chain(model, node.value, stmt.scope)
            if move is not None and dotted(move[0].func.value) == name:
                call, dtype, pinned = move
                moves.append(EarlyMove(call, stmt, name, prepare, dtype, True, pinned))
    return moves


def _assigns(node, name: str) -> bool:
    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
    return any(dotted(t) == name for t in targets)


def _move_in_chain(model, value, scope: Scope):
    """(the move call, the dtype argument it also carries, the fixed device or None for a bare
    "cuda") along a method chain such as `Net(cfg).cuda().train()`, else None."""
    node = value
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        move = _cuda_move(model, node, scope)
        if move is not None:
            return node, *move
        node = node.func.value
    return None


def _cuda_move(model, call: cst.Call, scope: Scope):
    """None unless `call` moves to a CUDA device written as a literal; else (the dtype argument
    it keeps or None, the fixed device such as "cuda:0" or None for a bare "cuda")."""
    method = call.func.attr.value
    if method == "cuda":
        args = positional(call)
        if not call.args:
            return None, None
        if len(call.args) == 1 and args and int_value(args[0]) is not None:
            return None, f"cuda:{int_value(args[0])}"
        return None  # `.cuda(local_rank)`: the rank's own device
    if method != "to":
        return None
    device, rest = None, []
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is not None and arg.keyword.value == "device":
            device = arg.value
        elif arg.keyword is None and device is None and not rest:
            device = arg.value
        else:
            rest.append(arg)
    kind = _cuda_device(model, device, scope) if device is not None else None
    if kind is None:
        return None  # dtype-only `.to(torch.bfloat16)`, or a device of unknown origin
    rest = [a for a in rest if a.keyword is None or a.keyword.value not in _TRANSFER_FLAGS]
    if len(rest) > 1 or any(a.keyword is not None and a.keyword.value != "dtype" for a in rest):
        return None
    return (rest[0] if rest else None), (kind if kind != "cuda" else None)


def _cuda_device(model, node, scope: Scope, depth: int = 0) -> str | None:
    """ "cuda" for a bare CUDA device (`"cuda"`, `torch.device("cuda")`: the current device,
    GPU 0 until the rank's device is set), "cuda:N" for a fixed index (`"cuda:0"`,
    `torch.device("cuda", 0)`), else None; directly, through one name bound to it, or in an arm
    of `"cuda" if ... else "cpu"`. `accelerator.device` and LOCAL_RANK devices are the rank's."""
    literal = _literal_device(node)
    if literal is not None:
        return literal if literal != "cpu" else None
    if isinstance(node, cst.IfExp):
        arms = (node.body, node.orelse)
        kinds = [_cuda_device(model, a, scope, depth) for a in arms]
        if not any(kinds) or not all(cuda_or_cpu(a) for a in arms):
            return None
        return next((k for k in kinds if k and k != "cuda"), "cuda")
    if isinstance(node, cst.Call):
        qual = model.imports.qualify(node.func) or ""
        args = positional(node)
        if qual != "torch.device" or not args or len(node.args) != len(args):
            return None
        if len(args) == 1:
            return _cuda_device(model, args[0], scope, depth)
        index = int_value(args[1])
        if len(args) == 2 and string_value(args[0]) == "cuda" and index is not None:
            return f"cuda:{index}"
        return None  # `torch.device("cuda", local_rank)`: the rank's own
    text = dotted(node)
    if text is None or "." in text or depth > FOLLOW_DEPTH:
        return None
    defs = scope.defs.get(text) or _enclosing_defs(text, scope)
    if len(defs) != 1 or defs[0].op != "=" or defs[0].tuple_index is not None:
        return None
    return _cuda_device(model, defs[0].value, defs[0].stmt.scope, depth + 1)


def _literal_device(node) -> str | None:
    """ "cuda", "cuda:N" or "cpu" for such a string literal."""
    value = string_value(node)
    if value in ("cuda", "cpu"):
        return value
    if value and value.startswith("cuda:") and value[5:].isdigit():
        return f"cuda:{int(value[5:])}"
    return None


def cuda_or_cpu(node) -> bool:
    if isinstance(node, cst.Call):
        args = positional(node)
        return len(args) == 1 and cuda_or_cpu(args[0])
    return _literal_device(node) is not None


# ... whether the rank's device is set when a statement runs ----------------------------------


def device_set_before(model, stmt: Stmt) -> bool:
    """Whether an Accelerator (or guard engine, accelerate state, `torch.cuda.set_device`) has
    set the rank's CUDA device when `stmt` runs, in program order across this module's calls:
    earlier in its function, or before every way in. Lenient (an earlier one on any path, or a
    way in that cannot be seen, counts), so that only a move visibly first is reported."""
    return _set_before(model, stmt.scope, stmt.order, set())


def _set_before(model, scope: Scope, order: int, seen: set[int]) -> bool:
    if any(o < order for o in _device_setters(model).get(id(scope), ())):
        return True
    return _set_at_entry(model, scope, seen)


def _set_at_entry(model, scope: Scope, seen: set[int]) -> bool:
    """At a function's entry: an engine passed in, a method of a class whose other methods set
    it (`__init__` builds `self.accelerator`), a caller that has set it, or, for a function no
    code here calls, its enclosing function's setup (a hook) or module code that sets it at
    import (an entry point)."""
    if scope.parent is None or id(scope) in seen:
        return False
    seen.add(id(scope))
    setters = _device_setters(model)
    if any(model.engine_for(p, scope) is not None for p in scope.params):
        return True
    if scope.class_name is not None and any(
        id(s) in setters and s is not scope and s.class_name == scope.class_name
        for s in model.scopes
    ):
        return True
    callers = model.graph.callers(scope)
    if not callers and scope.parent.parent is not None:
        # a nested function run as a callback or hook: its caller cannot be seen, so what its
        # enclosing function sets up counts
        return id(scope.parent) in setters or _set_at_entry(model, scope.parent, seen)
    if not callers:
        return id(scope) not in setters and id(model.scopes[0]) in setters
    return any(_set_before(model, c.stmt.scope, c.stmt.order, seen) for c in callers)


def _device_setters(model) -> dict[int, list[int]]:
    """Per scope (by id), the orders of its statements that set the rank's device: they build
    an Accelerator / guard engine / accelerate state, call `torch.cuda.set_device`, or call a
    function or class of this module that does."""
    return model.memo("setup_facts.device_setters", _find_device_setters)


def _find_device_setters(model) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for site in model.calls:
        if _sets_device(model, site.call):
            found.setdefault(id(site.stmt.scope), []).append(site.stmt.order)
    inits = {s.class_name: s for s in model.function_defs.get("__init__", ())}
    changed = True
    while changed:
        changed = False
        for site in model.calls:
            callee = model.local_function(site.call.func, site.stmt.scope)
            if callee is None:
                callee = inits.get(dotted(site.call.func) or "")
            orders = found.get(id(site.stmt.scope), [])
            if callee is not None and id(callee) in found and site.stmt.order not in orders:
                found.setdefault(id(site.stmt.scope), []).append(site.stmt.order)
                changed = True
    return found


def _sets_device(model, call: cst.Call) -> bool:
    qual = model.imports.qualify(call.func) or ""
    if qual in _SETS_DEVICE or engine_kind(qual) in (EngineKind.ACCELERATE, EngineKind.GUARD):
        return True
    return last_part(qual) in _STATES and (qual in _STATES or qual.startswith("accelerate"))


_HARMLESS_USES = {
    "parameters",
    "named_parameters",
    "requires_grad_",
    "train",
    "eval",
    "gradient_checkpointing_enable",
    "enable_input_require_grads",
}


def moves_freely(model, move: EarlyMove) -> bool:
    """Whether nothing between the move and `prepare` depends on the model's device: the model
    is only read for its parameters (an optimizer built on them keeps the same objects after
    `prepare` moves them) or switched between train and eval mode."""
    name = move.model_name
    between = [
        s
        for s in move.stmt.scope.stmts
        if move.stmt.order < s.order < move.prepare_stmt.order and _reads_name(s.node, name)
    ]
    return all(_harmless_use(s.node, name) for s in between)


def _reads_name(node, name: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == name for n in walk(node))


def _harmless_use(node, name: str) -> bool:
    if any(
        isinstance(n, cst.Attribute) and n.attr.value in ("device", "is_cuda") for n in walk(node)
    ):
        return False  # `next(model.parameters()).device`: reads where the move put it
    allowed = set()
    for sub in walk(node):
        pair = method_call(sub)
        if pair is not None and dotted(pair[0]) == name and pair[1] in _HARMLESS_USES:
            allowed.add(id(pair[0]))
    if isinstance(node, cst.Assign) and any(dotted(t.target) == name for t in node.targets):
        return False  # rebinding the model: the move's object is gone or wrapped
    for sub in walk(node):
        if isinstance(sub, cst.Name) and sub.value == name and id(sub) not in allowed:
            return False
    return True


@dataclass(eq=False)
class HelperMove:
    """`.cuda()` / `.to("cuda")` on a model no `prepare` places (a frozen VAE, a teacher)."""

    call: cst.Call
    model_name: str
    engine: str  # the engine whose `.device` is the rank's own
    # "pinned": a fixed index, GPU 0 on every rank; "early": a bare "cuda" before the rank's
    # device is set, and nothing moves it later; "style": a bare "cuda" after (the rank's own)
    kind: str = "style"
    pinned: str | None = None  # the fixed device written (`cuda:0`)


def unprepared_model_moves(model) -> list[HelperMove]:
    """Models that never go through `prepare` and are moved to a CUDA device written out: a
    fixed index or a move before the rank's device is set keeps every rank's copy on one GPU;
    after an Accelerator exists a bare "cuda" is the rank's own (only a style point)."""
    return model.memo("setup_facts.unprepared_model_moves", _find_helper_moves)


def _find_helper_moves(model) -> list[HelperMove]:
    engines = [
        e
        for e in model.setup.engines.values()
        if e.kind in (EngineKind.ACCELERATE, EngineKind.GUARD) and _engine_places(e)
    ]
    if not engines:
        return []
    placed = {p.original for p in model.setup.prepared.values()} | set(model.setup.prepared)
    found = []
    for scope in model.scopes:
        for stmt in scope.stmts:
            node = stmt.node
            value = node.value if isinstance(node, (cst.Assign, cst.Expr)) else None
            move = _move_in_chain(model, value, scope) if isinstance(value, cst.Call) else None
            if move is None:
                continue
            name = _moved_model(model, move[0], node)
            if name is None or name in placed:
                continue
            kind = "pinned" if move[2] else "style"
            if not move[2] and not device_set_before(model, stmt):
                kind = "early" if not _moved_later(model, name, stmt) else "style"
            found.append(HelperMove(move[0], name, engines[0].name, kind, move[2]))
    return found


def _moved_later(model, name: str, stmt: Stmt) -> bool:
    """Whether a later `.to(...)` / `.cuda(...)` of the same model may place it again."""
    return any(
        site.receiver == name and site.method in ("to", "cuda") and site.stmt.order > stmt.order
        for site in model.calls
    )


def _moved_model(model, call: cst.Call, statement) -> str | None:
    """The name of the model a move applies to, when the value is visibly a model: built by a
    class (`Net()`) or loaded with `from_pretrained`; a tensor (`torch.randn(...)`, a batch)
    is not one."""
    receiver = call.func.value
    if isinstance(receiver, cst.Call):
        target = statement.targets[0].target if isinstance(statement, cst.Assign) else None
        name = dotted(target) if target is not None else None
        return name if name and _builds_model(model, receiver) else None
    name = dotted(receiver)
    if name is None:
        return None
    values = [d.value for d in model.module_defs(name) if d.op == "=" and d.tuple_index is None]
    return name if values and all(_builds_model(model, v) for v in values) else None


def _builds_model(model, value) -> bool:
    """`Net(...)`, `AutoencoderKL.from_pretrained(...)` (also inside a chain such as
    `Net().eval()`)."""
    while isinstance(value, cst.Call):
        func = value.func
        text = dotted(func) or ""
        if last_part(text) == "from_pretrained":
            return True
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call):
            value = func.value  # a method of a chain: look at what it was called on
            continue
        head = last_part(text)
        return bool(head) and head[0].isupper() and not text.startswith(("torch.", "np."))
    return False
