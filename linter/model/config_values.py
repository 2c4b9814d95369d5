"""The values an expression can take under the script's configurations.

A training script's precision is often decided by two settings read together: `dtype` picks
the autocast dtype and, separately, whether the GradScaler is on. Each setting alone looks
right; the bug is in the combination. This module evaluates a few expressions *jointly*: it
finds the knobs they read (a command-line flag, a global a configurator may override), gives
each knob its possible values (its choices, or its default plus whatever literal the script
compares it with, plus "something else"), enumerates the assignments (a few; past the bound
the answer is "unknown", never a guess) and evaluates every expression under each.

An unknowable test (`torch.cuda.is_bf16_supported()`) is an environment fact: a knob of its
own with values True and False, so two expressions testing it agree with each other. A value
the evaluator does not understand is `UNKNOWN`; rules never report on it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import libcst as cst

from linter.model.cst_util import code, dotted, keyword, positional, string_value, walk
from linter.model.depths import CONFIG_VALUE_DEPTH
from linter.model.functions import Def, Scope
from linter.model.kinds import FrameKind

MAX_ASSIGNMENTS = 256
TORCH_DTYPES = {  # torch dtype attribute -> dtype word
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float": "fp32",
}
_AUTOCASTS = {
    "torch.autocast",
    "torch.amp.autocast",
    "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast",
    "torch.amp.autocast_mode.autocast",
}
_NULL_CONTEXTS = {"contextlib.nullcontext", "nullcontext", "contextlib.suppress"}


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


UNKNOWN = _Sentinel("UNKNOWN")  # the evaluator cannot tell
OTHER = _Sentinel("OTHER")  # a knob set to a value the script never names


@dataclass(frozen=True)
class TorchDtype:
    word: str  # "fp16" / "bf16" / "fp32"


@dataclass(frozen=True)
class AutocastValue:
    """What `torch.autocast(...)` builds: its device, dtype (written or the device default;
    UNKNOWN when not statically known) and whether it is enabled."""

    device: object
    dtype: object
    enabled: object


@dataclass(frozen=True)
class ScalerValue:
    enabled: object


@dataclass(frozen=True)
class EngineValue:
    mixed_precision: object  # "fp16" / "bf16" / "no" / ...; UNKNOWN: Accelerate's config decides


NULL_CONTEXT = _Sentinel("nullcontext")


@dataclass(eq=False)
class Knob:
    """A setting the run may change: its possible values, and which of them are the default
    (two where the default itself depends on the hardware)."""

    name: str  # as a condition names it: `dtype`, `--dtype`
    key: str
    values: tuple
    defaults: frozenset
    flag: bool = False  # a command-line flag (`--dtype float16`), else a variable
    ident: str = ""  # as `Configuration.knobs` names it (an argparse dest, a global)
    hardware: str = ""  # "on a GPU with bf16 support": a property of the machine, not a knob

    def __post_init__(self) -> None:
        self.ident = self.ident or self.name.lstrip("-")

    def show(self, value) -> str:
        if self.hardware:
            return self.hardware if value else self.hardware.replace(" with ", " without ")
        if self.flag and isinstance(value, bool) and self.values == (False, True):
            return self.name if value else f"without {self.name}"
        if self.flag:
            return f"{self.name} {value}"
        return f"{self.name}={value!r}"


_CUDA = "hw:cuda"
_BF16 = "hw:bf16"
HARDWARE = {
    "torch.cuda.is_available": Knob(
        "CUDA", _CUDA, (True, False), frozenset({True, False}), hardware="on a machine with CUDA"
    ),
    "torch.cuda.is_bf16_supported": Knob(
        "bf16 support",
        _BF16,
        (True, False),
        frozenset({True, False}),
        hardware="on a GPU with bf16 support",
    ),
}


@dataclass(frozen=True)
class Row:
    """One assignment of the knobs involved, and what each expression evaluates to under it
    (a set: more than one where the evaluator could not decide between branches)."""

    settings: tuple  # ((knob key, value), ...)
    values: tuple  # one frozenset per expression
    default: bool  # every knob at a default value

    def setting(self, key: str):
        return dict(self.settings).get(key)


@dataclass
class Joint:
    knobs: list[Knob]
    rows: list[Row]

    def condition(self, bad: list[Row], clean: list[Row]) -> Condition:
        """The settings under which the `bad` rows happen, named by the knobs that matter: a
        knob whose change turns a bad run into a `clean` one (a run known to be right)."""
        return _condition(self, bad, clean)


@dataclass(frozen=True)
class Condition:
    affects_default: bool
    text: str  # `with dtype='bfloat16'`; "in the default configuration" when it always holds
    knobs: tuple[str, ...]

    @property
    def depends(self) -> bool:
        """Whether some setting (a knob, the machine) decides it."""
        return self.text != "in the default configuration"


# knobs ------------------------------------------------------------------------------------
@dataclass
class _Env:
    model: object
    knobs: dict[str, Knob] = field(default_factory=dict)
    assignment: dict[str, object] = field(default_factory=dict)
    collecting: bool = True
    literals: dict[str, set] = field(default_factory=dict)  # knob key -> compared literals
    env_tests: dict[str, cst.BaseExpression] = field(default_factory=dict)
    plain: bool = False  # reading knobs' own defaults: no knob is looked up


def knob_for(model, node: cst.BaseExpression, scope: Scope, order: int = 1 << 30) -> Knob | None:
    """The knob an expression reads, if any: a module global a configurator may override
    (nanoGPT's `exec(open('configurator.py').read())`, whose default may itself depend on the
    hardware), else what the configuration space knows (a parsed flag, a config field)."""
    text = dotted(node)
    if text is None:
        return None
    table = model.memo("config_values.knobs", _find_knobs)
    if "." not in text and text in table["globals"]:
        return _global_knob(model, table, text, scope, order)
    found = _space_knob(model, node, scope)
    if found is not False:
        return found
    if "." in text:
        head, attr = text.split(".", 1)
        if attr in table["flags"] and _holds_parsed_args(model, head, scope):
            return table["flags"][attr]
    return None


def _global_knob(model, table: dict, text: str, scope: Scope, order: int) -> Knob | None:
    knob = table["globals"][text]
    if text in scope.params or (scope.parent is not None and text in scope.defs):
        return None
    top = model.scopes[0]
    reach = order if scope.parent is None else 1 << 30
    if any(table["override"] < d.stmt.order < reach for d in top.defs.get(text, ())):
        return None  # set again after the configurator ran: the assignments decide
    return knob


def _space_knob(model, node, scope: Scope):
    """The knob of the module's configuration space (`linter.model.config_space`) as a knob of
    values; None when it names none (or a constant, which is just its value); False when that
    space is not available."""
    try:
        from linter.model.config_space import KnobSource, config_space
    except ImportError:
        return False
    knob = config_space(model).knob_for(node, scope)
    if knob is None or knob.source == KnobSource.CONSTANT:
        return None
    if not knob.default_known:  # `default="cuda:0" if torch.cuda.is_available() else "cpu"`
        table = model.memo("config_values.knobs", _find_knobs)
        return table["flags"].get(knob.name) if knob.source == KnobSource.ARGPARSE else None
    made = model.memo("config_values.space_knobs", lambda m: {})
    if id(knob) not in made:
        values = tuple(knob.choices) if knob.choices else ()
        if knob.type == "bool" and not values:
            values = (False, True)
        flag = knob.source == KnobSource.ARGPARSE
        made[id(knob)] = Knob(
            knob.spelling,
            f"{knob.source}:{knob.name}",
            values,
            frozenset({knob.default}),
            flag,
            knob.name,
        )
    return made[id(knob)]


def _holds_parsed_args(model, head: str, scope: Scope) -> bool:
    defs = scope.defs.get(head) or model.module_defs(head)
    for d in defs:
        if isinstance(d.value, cst.Call) and (dotted(d.value.func) or "").endswith(
            ("parse_args", "parse_known_args", "parse_args_into_dataclasses")
        ):
            return True
    return head in scope.params and head in ("args", "opt", "opts", "cfg", "config", "hparams")


def _find_knobs(model) -> dict:
    flags: dict[str, Knob] = {}
    for call in model.calls:
        if call.method == "add_argument" and isinstance(call.call, cst.Call):
            knob = _flag(model, call.call)
            if knob is not None:
                flags[knob.key] = knob
    overridable: dict[str, Knob] = {}
    top = model.scopes[0]
    override = _override_order(top)
    if override is not None:
        for stmt in top.stmts:
            if stmt.order >= override or stmt.frames:
                continue
            node = stmt.node
            if isinstance(node, cst.Assign) and len(node.targets) == 1:
                name = dotted(node.targets[0].target)
                if name and "." not in name and not name.startswith("_"):
                    defaults = _literal_values(model, node.value)
                    if defaults:
                        overridable[name] = Knob(name, name, (), frozenset(defaults))
    return {"flags": flags, "globals": overridable, "override": override or 0}


def _override_order(top: Scope) -> int | None:
    """The order of the module statement through which a configurator overrides the globals
    (`exec(open('configurator.py').read())`, `globals().update(...)`)."""
    for stmt in top.stmts:
        for node in walk(stmt.node):
            if isinstance(node, cst.Call):
                func = dotted(node.func) or ""
                if func == "exec" or (func.endswith(".update") and "globals()" in code(node.func)):
                    return stmt.order
    return None


def _flag(model, call: cst.Call) -> Knob | None:
    names = [string_value(a) for a in positional(call)]
    longs = [n for n in names if n and n.startswith("--")]
    dest_node = keyword(call, "dest")
    dest = string_value(dest_node) if dest_node is not None else None
    if dest is None:
        if not longs:
            return None
        dest = longs[0][2:].replace("-", "_")
    spelling = longs[0] if longs else dest
    action = string_value(keyword(call, "action"))
    if action in ("store_true", "store_false"):
        default = action == "store_false"
        given = keyword(call, "default")
        if given is not None:
            found = _literal_values(model, given)
            if len(found) != 1:
                return None
            default = next(iter(found))
        return Knob(spelling, dest, (False, True), frozenset({default}), flag=True)
    if action is not None:
        return None
    given = keyword(call, "default")
    default = frozenset(_literal_values(model, given)) if given is not None else frozenset({None})
    if not default:
        return None
    choices = keyword(call, "choices")
    if choices is not None:
        values = _literal_values(model, choices, sequence=True)
        if values is None:
            return None
        return Knob(spelling, dest, tuple(values), default, flag=True)
    return Knob(spelling, dest, (), default, flag=True)


def _literal_values(model, node, sequence: bool = False):
    """The plain values of a literal (or, for `sequence`, of a list/tuple literal's
    elements); None when it is not one."""
    if sequence:
        if not isinstance(node, (cst.List, cst.Tuple, cst.Set)):
            return None
        out = []
        for element in node.elements:
            found = _literal_values(model, element.value)
            if not found or len(found) != 1:
                return None
            out.extend(found)
        return out
    env = _Env(model, collecting=False, plain=True)
    found = _eval(env, node, model.scopes[0], 1 << 30, 0)
    plain = [v for v in found if isinstance(v, (str, int, float, bool, type(None)))]
    return plain if len(plain) == len(found) else []


# joint evaluation ----------------------------------------------------------------------
def joint(model, exprs: list[tuple[cst.BaseExpression, Scope, int]]) -> Joint | None:
    """Evaluate `(expression, scope, order)` triples under every assignment of the knobs and
    environment tests they read; None past MAX_ASSIGNMENTS. An assignment under which the
    script raises first (`{'float16': ...}[dtype]` for a dtype it lacks) is no run."""
    env = _Env(model)
    for node, scope, order in exprs:
        _eval(env, node, scope, order, 0)
    guards: list = []
    seen = 0
    while seen < len(env.knobs):
        new = [g for k in list(env.knobs.values())[seen:] for g in _lookups(model, k)]
        seen = len(env.knobs)
        for guard in new:
            _eval(env, *guard, 0)
        guards.extend(new)
    env.collecting = False
    knobs = list(env.knobs.values())
    domains = [_domain(env, knob) for knob in knobs]
    tests = list(env.env_tests)
    size = 2 ** len(tests)
    for domain in domains:
        size *= len(domain)
    if size > MAX_ASSIGNMENTS:
        return None
    rows = []
    keys = [k.key for k in knobs] + [f"env:{t}" for t in tests]
    for combo in itertools.product(*domains, *([(True, False)] * len(tests))):
        env.assignment = dict(zip(keys, combo, strict=True))
        if env.assignment.get(_BF16) is True and env.assignment.get(_CUDA) is False:
            continue  # bf16 support is a GPU's
        if any(not _eval(env, n, s, o, 0) for n, s, o in guards):
            continue
        values = tuple(frozenset(_eval(env, n, s, o, 0)) for n, s, o in exprs)
        if any(not v for v in values):
            continue
        default = all(v in k.defaults for k, v in zip(knobs, combo, strict=False))
        rows.append(Row(tuple(zip(keys, combo, strict=True)), values, default))
    return Joint(knobs, rows)


def _domain(env: _Env, knob: Knob) -> list:
    """A knob's values worth trying: its choices, else its defaults, the literals the script
    compares it with, and something else."""
    if knob.values:
        return list(knob.values) + [d for d in knob.defaults if d not in knob.values]
    domain = list(knob.defaults)
    domain += sorted((v for v in env.literals.get(knob.key, ()) if v not in domain), key=repr)
    return [*domain, OTHER]


def _lookups(model, knob: Knob) -> list[tuple[cst.BaseExpression, Scope, int]]:
    """The module's unconditional `{...}[knob]` lookups (nanoGPT's `ptdtype`), which raise for
    a value the dict lacks before any training runs."""
    found = []
    for scope in model.scopes:
        if scope.parent is not None and scope.name != "main":
            continue
        for stmt in scope.stmts:
            node = stmt.node
            if stmt.frames or not isinstance(node, cst.Assign):
                continue
            value = node.value
            if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Dict):
                index = value.slice[0].slice if len(value.slice) == 1 else None
                inner = getattr(index, "value", None)
                if inner is not None and knob_for(model, inner, scope, stmt.order) is knob:
                    found.append((value, scope, stmt.order))
    return found


def _eval(env: _Env, node, scope: Scope, order: int, depth: int) -> set:
    if node is None or depth > CONFIG_VALUE_DEPTH:
        return {UNKNOWN}
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        value = string_value(node) if isinstance(node, cst.SimpleString) else None
        return {value} if value is not None else {UNKNOWN}
    if isinstance(node, cst.Integer):
        return {int(node.value, 0)} if node.value.isdigit() else {UNKNOWN}
    if isinstance(node, cst.Float):
        return {float(node.value)}
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {{"True": True, "False": False, "None": None}[node.value]}
    if isinstance(node, cst.Name) and node.value == "__name__" and scope.parent is None:
        return {"__main__"}  # a training script runs as the main module
    deeper = depth + 1
    if isinstance(node, (cst.Name, cst.Attribute)):
        return _eval_name(env, node, scope, order, deeper)
    if isinstance(node, cst.IfExp):
        return _branches(env, node.test, node.body, node.orelse, scope, order, deeper)
    if isinstance(node, cst.Comparison):
        return _compare(env, node, scope, order, deeper)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        return {_not(v) for v in _eval(env, node.expression, scope, order, deeper)}
    if isinstance(node, cst.BooleanOperation):
        return _boolean(env, node, scope, order, deeper)
    if isinstance(node, cst.Subscript):
        return _subscript(env, node, scope, order, deeper)
    if isinstance(node, cst.Call):
        return _call(env, node, scope, order, deeper)
    return {UNKNOWN}


def _eval_name(env: _Env, node, scope: Scope, order: int, depth: int) -> set:
    model = env.model
    qual = model.imports.qualify(node) or ""
    if qual.startswith("torch.") and qual[6:] in TORCH_DTYPES:
        return {TorchDtype(TORCH_DTYPES[qual[6:]])}
    knob = None if env.plain else knob_for(model, node, scope, order)
    text = dotted(node)
    if knob is not None:
        if env.collecting:
            env.knobs.setdefault(knob.key, knob)
            value = set(knob.defaults) | set(knob.values) | {OTHER}
        else:
            value = {env.assignment.get(knob.key, UNKNOWN)}
        top = model.scopes[0]
        again = (scope.defs.get(text) or top.defs.get(text)) if "." in (text or "") else None
        if not again:
            return value  # a global's own assignment is its default, which the knob holds
        # `args.device = "cuda:0"` after the parse: those assignments decide where they run
        where, until = (scope, order) if scope.defs.get(text or "") else (top, 1 << 30)
        return _from_defs(env, again, where, until, depth, fallback=value)
    own = scope.defs.get(text or "")
    if own:
        return _from_defs(env, own, scope, order, depth)
    if scope.parent is not None and text not in scope.params and "." not in (text or "."):
        top = model.scopes[0]
        return _from_defs(env, top.defs.get(text, []), top, 1 << 30, depth)
    return {UNKNOWN}


def _from_defs(
    env: _Env, defs: list[Def], scope: Scope, order: int, depth: int, fallback=None
) -> set:
    """The value a read sees: the last assignment before it that surely runs, and the later
    ones whose `if` test the evaluator cannot decide (their branch may or may not run);
    `fallback` where none surely runs (a knob's own value), else UNKNOWN."""
    before = sorted((d for d in defs if d.stmt.order < order), key=lambda d: d.stmt.order)
    found: set = set()
    for d in reversed(before):
        if d.op != "=" or d.tuple_index is not None or d.value is None:
            return {UNKNOWN}
        if any(f.kind in (FrameKind.LOOP, FrameKind.EXIT) for f in d.stmt.frames):
            return {UNKNOWN}
        verdicts = {_holds(env, f, scope, d.stmt.order, depth) for f in d.stmt.frames}
        if False in verdicts:
            continue
        found |= _eval(env, d.value, scope, d.stmt.order, depth)
        if None not in verdicts:
            return found
    return found | (fallback if fallback is not None else {UNKNOWN})


def _holds(env: _Env, frame, scope: Scope, order: int, depth: int) -> bool | None:
    """Whether an `if` frame's branch runs: True, False, or None (cannot tell)."""
    if frame.kind != FrameKind.IF:
        return True
    values = _truth(env, frame.test, scope, order, depth)
    if len(values) != 1:
        return None
    (value,) = values
    return value == frame.holds


def _truth(env: _Env, test, scope: Scope, order: int, depth: int) -> set:
    """The truth values of a test: True/False, or both when it cannot be decided. A call the
    evaluator does not know (`torch.cuda.is_bf16_supported()`) is an environment test."""
    if isinstance(test, cst.Call) and _is_env_test(env, test):
        hardware = _hardware(env, test)
        if hardware is not None:
            return hardware
        key = code(test)
        if env.collecting and not env.plain:
            env.env_tests.setdefault(key, test)
        value = env.assignment.get(f"env:{key}")
        return {True, False} if value is None else {value}
    out = set()
    for value in _eval(env, test, scope, order, depth):
        out |= {True, False} if value in (UNKNOWN, OTHER) or _opaque(value) else {bool(value)}
    return out


def _hardware(env: _Env, call: cst.Call) -> set | None:
    """`torch.cuda.is_available()` / `torch.cuda.is_bf16_supported()`: the machine is a setting
    of the run like a flag, except that every machine is a default one."""
    qual = env.model.imports.qualify(call.func) or ""
    knob = HARDWARE.get(qual)
    if knob is None:
        return None
    if env.collecting and not env.plain:
        env.knobs.setdefault(knob.key, knob)
    value = env.assignment.get(knob.key)
    return {True, False} if value is None else {value}


def _is_env_test(env: _Env, call: cst.Call) -> bool:
    qual = env.model.imports.qualify(call.func) or ""
    return qual.startswith("torch.") and not call.args


def _opaque(value) -> bool:
    return isinstance(value, (AutocastValue, ScalerValue, EngineValue, _Sentinel))


def _branches(env, test, body, orelse, scope, order, depth) -> set:
    truths = _truth(env, test, scope, order, depth)
    out = set()
    if True in truths:
        out |= _eval(env, body, scope, order, depth)
    if False in truths:
        out |= _eval(env, orelse, scope, order, depth)
    return out


def _not(value):
    if value is UNKNOWN or value is OTHER or _opaque(value):
        return UNKNOWN
    return not value


def _boolean(env: _Env, node: cst.BooleanOperation, scope, order, depth) -> set:
    left = _truthy(env, node.left, scope, order, depth)
    right = _truthy(env, node.right, scope, order, depth)
    is_and = isinstance(node.operator, cst.And)
    out = set()
    for a in left:
        if a is UNKNOWN:
            out.add(UNKNOWN)
        elif a != is_and:
            out.add(a)  # short circuit: `False and x`, `True or x`
        else:
            out |= right
    return out


def _truthy(env: _Env, node, scope, order, depth) -> set:
    if isinstance(node, cst.Call) and _is_env_test(env, node):
        return _truth(env, node, scope, order, depth)
    out = set()
    for value in _eval(env, node, scope, order, depth):
        out.add(UNKNOWN if value is UNKNOWN or value is OTHER or _opaque(value) else bool(value))
    return out


def _compare(env: _Env, node: cst.Comparison, scope, order, depth) -> set:
    if len(node.comparisons) != 1:
        return {UNKNOWN}
    target = node.comparisons[0]
    op = target.operator
    left = _eval(env, node.left, scope, order, depth)
    if isinstance(op, (cst.In, cst.NotIn)):
        options = _sequence(env, target.comparator, scope, order, depth)
        if options is None:
            return _substring(env, left, target, scope, order, depth)
        _note_literals(env, node.left, scope, options)
        out = set()
        for value in left:
            if value is UNKNOWN or any(o is UNKNOWN for o in options):
                out.add(UNKNOWN)
            elif value is OTHER:
                out.add(isinstance(op, cst.NotIn))
            else:
                out.add((value in options) != isinstance(op, cst.NotIn))
        return out
    if not isinstance(op, (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)):
        return {UNKNOWN}
    right = _eval(env, target.comparator, scope, order, depth)
    _note_literals(env, node.left, scope, right)
    _note_literals(env, target.comparator, scope, left)
    negate = isinstance(op, (cst.NotEqual, cst.IsNot))
    out = set()
    for a, b in itertools.product(left, right):
        if a is UNKNOWN or b is UNKNOWN or (a is OTHER and b is OTHER):
            out.add(UNKNOWN)
        elif a is OTHER or b is OTHER:
            out.add(negate)
        else:
            out.add((a == b and type(a) is type(b)) != negate)
    return out


def _substring(env: _Env, left: set, target, scope, order, depth) -> set:
    """`'cuda' in device`: a literal looked up in a string (unknown in a value the script
    never names)."""
    negate = isinstance(target.operator, cst.NotIn)
    out = set()
    for a, b in itertools.product(left, _eval(env, target.comparator, scope, order, depth)):
        if isinstance(a, str) and isinstance(b, str):
            out.add((a in b) != negate)
        else:
            out.add(UNKNOWN)
    return out


def _sequence(env: _Env, node, scope, order, depth) -> list | None:
    if not isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        return None
    out = []
    for element in node.elements:
        found = _eval(env, element.value, scope, order, depth)
        if len(found) != 1:
            return None
        out.extend(found)
    return out


def _note_literals(env: _Env, node, scope, values) -> None:
    """While collecting, remember the literals a knob is compared with: they are the values
    of an open knob worth trying."""
    if not env.collecting:
        return
    knob = None
    if isinstance(node, (cst.Name, cst.Attribute)) and not env.plain:
        knob = knob_for(env.model, node, scope)
    if knob is None:
        return
    plain = {v for v in values if isinstance(v, (str, int, float, bool, type(None)))}
    env.literals.setdefault(knob.key, set()).update(plain)


def _subscript(env: _Env, node: cst.Subscript, scope, order, depth) -> set:
    """`{'float16': torch.float16, ...}[dtype]`: the entry for each key; none for a key the
    dict lacks (that run raises KeyError)."""
    if not isinstance(node.value, cst.Dict) or len(node.slice) != 1:
        return {UNKNOWN}
    index = node.slice[0].slice
    if not isinstance(index, cst.Index):
        return {UNKNOWN}
    table = {}
    for element in node.value.elements:
        if not isinstance(element, cst.DictElement):
            return {UNKNOWN}
        keys = _eval(env, element.key, scope, order, depth)
        if len(keys) != 1 or UNKNOWN in keys:
            return {UNKNOWN}
        table[next(iter(keys))] = element.value
    _note_literals(env, index.value, scope, set(table))
    out = set()
    for key in _eval(env, index.value, scope, order, depth):
        if key is UNKNOWN:
            out.add(UNKNOWN)
        elif key in table and key is not OTHER:
            out |= _eval(env, table[key], scope, order, depth)
    return out


def _call(env: _Env, call: cst.Call, scope, order, depth) -> set:
    model = env.model
    qual = model.imports.qualify(call.func) or ""
    args = positional(call)
    if qual == "getattr" and len(args) == 2 and dotted(args[0]) == "torch":
        out = set()
        for name in _eval(env, args[1], scope, order, depth):
            word = TORCH_DTYPES.get(name) if isinstance(name, str) else None
            out.add(TorchDtype(word) if word else UNKNOWN)
        return out
    if qual in _AUTOCASTS:
        return _autocast(env, call, qual, scope, order, depth)
    if qual in _NULL_CONTEXTS and not args:
        return {NULL_CONTEXT}
    last = qual.rsplit(".", 1)[-1]
    if last in ("GradScaler", "ShardedGradScaler"):
        enabled = keyword(call, "enabled")
        states = _truthy(env, enabled, scope, order, depth) if enabled is not None else {True}
        return {ScalerValue(s) for s in states}
    if last == "Accelerator" and (qual == last or qual.startswith("accelerate")):
        if any(a.star == "**" for a in call.args):
            return {EngineValue(UNKNOWN)}
        given = keyword(call, "mixed_precision")
        if given is None:
            return {EngineValue(UNKNOWN)}  # `accelerate config` decides
        values = _eval(env, given, scope, order, depth)
        return {EngineValue(v if isinstance(v, str) else UNKNOWN) for v in values}
    if _is_env_test(env, call):
        return _truth(env, call, scope, order, depth)
    return {UNKNOWN}


def _autocast(env: _Env, call: cst.Call, qual: str, scope, order, depth) -> set:
    args = positional(call)
    old = qual in ("torch.cuda.amp.autocast", "torch.cpu.amp.autocast")
    if old:
        devices = {qual.split(".")[1]}
        dtype_arg = keyword(call, "dtype") or (args[1] if len(args) > 1 else None)
        enabled_arg = keyword(call, "enabled") or (args[0] if args else None)
    else:
        device_arg = keyword(call, "device_type") or (args[0] if args else None)
        devices = _eval(env, device_arg, scope, order, depth)
        dtype_arg = keyword(call, "dtype") or (args[1] if len(args) > 1 else None)
        enabled_arg = keyword(call, "enabled") or (args[2] if len(args) > 2 else None)
    dtypes = _eval(env, dtype_arg, scope, order, depth) if dtype_arg is not None else None
    enableds = _truthy(env, enabled_arg, scope, order, depth) if enabled_arg else {True}
    out = set()
    for device in devices:
        head = device.split(":", 1)[0] if isinstance(device, str) else UNKNOWN
        if dtypes is None:
            options = (
                {TorchDtype({"cuda": "fp16", "cpu": "bf16"}[head])}
                if head
                in (
                    "cuda",
                    "cpu",
                )
                else {UNKNOWN}
            )
        else:
            options = {d if isinstance(d, TorchDtype) else UNKNOWN for d in dtypes}
        no_gpu = head == "cuda" and env.assignment.get(_CUDA) is False
        for dtype in options:
            for enabled in enableds:
                # torch disables a CUDA autocast on a machine without CUDA (with a warning)
                out.add(AutocastValue(head, dtype, False if no_gpu else enabled))
    return out


# conditions ------------------------------------------------------------------------------
def _condition(space: Joint, bad: list[Row], clean: list[Row]) -> Condition:
    affects_default = any(r.default for r in bad)
    keys = [k.key for k in space.knobs]

    def part(row: Row) -> tuple:
        return tuple(row.setting(k) for k in keys)

    bad_parts = {part(r) for r in bad}
    clean_parts = {part(r) for r in clean}
    parts, machine, named = [], [], []
    for i, knob in enumerate(space.knobs):
        domain = {p[i] for p in bad_parts | clean_parts}
        matters = any(p[:i] + (v,) + p[i + 1 :] in clean_parts for p in bad_parts for v in domain)
        if not matters or knob.key == _CUDA:
            continue  # the precision rules are about CUDA runs anyway
        seen = {p[i] for p in bad_parts}
        named.append(knob.ident)
        if knob.hardware:
            machine.extend(knob.show(v) for v in sorted(seen, key=repr))
        else:
            parts.append(_knob_text(knob, seen, domain))
    if not parts and not machine:
        return Condition(affects_default, "in the default configuration", ())
    text = ("with " + " and ".join(parts)).replace("with without ", "without ") if parts else ""
    text = " ".join(t for t in (text, " or ".join(machine)) if t)
    if not affects_default:
        shown = [k for k in space.knobs if k.ident in named and not k.hardware]
        text += f" ({', '.join(_default_text(k) for k in shown)})"
    return Condition(affects_default, text, tuple(n for n in named if n not in _HW_IDENTS))


_HW_IDENTS = {k.ident for k in HARDWARE.values()}


def _knob_text(knob: Knob, seen: set, domain: set) -> str:
    if OTHER in seen:
        good = sorted((v for v in domain - seen if v is not OTHER), key=repr)
        if len(good) == 1:
            return f"{knob.name} != {good[0]!r}" if not knob.flag else f"{knob.name} not {good[0]}"
        return f"{knob.name} not in ({', '.join(repr(v) for v in good)})"
    values = sorted(seen, key=repr)
    return " or ".join(knob.show(v) for v in values)


def _default_text(knob: Knob) -> str:
    if knob.flag and knob.values == (False, True) and len(knob.defaults) == 1:
        return "on by default" if True in knob.defaults else "off by default"
    values = sorted(knob.defaults, key=repr)
    shown = " or ".join(repr(v) if not knob.flag else str(v) for v in values)
    return f"default {shown}"
