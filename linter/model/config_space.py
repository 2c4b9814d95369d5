"""The configuration space of a script: the knobs a run may turn, each with its default, its
choices and where it came from, so a finding can say whether the default run is affected.

Knobs come from argparse (`add_argument`), dataclass fields (HfArgumentParser's or a plain
`@dataclass` config), module constants and the globals a nanoGPT-style configurator may
override (`exec(open("configurator.py").read())`, `globals().update(...)`), dict and
`SimpleNamespace` literals, and YAML/JSON/TOML files loaded from a literal path the project holds.
One pass over the module's statements builds it (memoised per model); a config file that does not
parse, or a YAML file without PyYAML installed, is a note, never a crash.
"""

from __future__ import annotations

import ast
import math
import os
from dataclasses import dataclass, field
from enum import StrEnum

import libcst as cst

from linter.model.cst_util import (
    code,
    dotted,
    int_value,
    keyword,
    last_part,
    positional,
    string_value,
    strip_parens,
)
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import Scope
from linter.model.kinds import FrameKind, GateKind
from linter.types import Configuration

_MAX_EXPRESSION_DEPTH = 16  # nested operations and names bound to them, in one computed value
_PASS_CALLS = {"int", "float", "bool", "str", "round", "math.ceil", "math.floor"}
_LOADERS = {
    "safe_load": "yaml",
    "full_load": "yaml",
    "load": None,  # yaml.load / json.load / tomllib.load / OmegaConf.load: by the module
    "loads": None,
}
_FILE_KINDS = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".toml": "toml"}
_UNKNOWN = object()  # a default that is not a literal


class KnobSource(StrEnum):
    ARGPARSE = "argparse"
    DATACLASS = "dataclass"
    CONSTANT = "constant"
    DICT = "dict"
    NAMESPACE = "namespace"
    YAML = "yaml"
    JSON = "json"
    TOML = "toml"
    OVERRIDABLE_GLOBAL = "overridable-global"
    PARAMETER_DEFAULT = "parameter-default"  # `def train(..., accum_iter=1)` nobody here passes


@dataclass(frozen=True)
class Knob:
    """One setting. `spelling` is how a user sets it (`--gradient_accumulation_steps`,
    `TrainConfig.grad_accum_steps`, `config["k"]`, `train.yaml: k`); `default` is its value
    when nothing is passed (`default_known` False when the code computes it)."""

    name: str
    spelling: str
    default: object
    choices: tuple | None
    source: KnobSource
    line: int
    path: str | None = None
    default_known: bool = True
    type: str | None = None

    def describe(self) -> dict:
        """The knob as `--show-loops` shows it: a knob of the script has its `line` (a
        notebook's is placed in its cell), one of a config file is at `file:line`."""
        found = {
            "name": self.name,
            "spelling": self.spelling,
            "default": self.default if self.default_known else "(computed)",
            "choices": list(self.choices) if self.choices is not None else None,
            "source": str(self.source),
        }
        if self.source in (KnobSource.YAML, KnobSource.JSON, KnobSource.TOML):
            found["where"] = f"{self.path}:{self.line}"
        else:
            found["line"] = self.line
        return found


@dataclass
class ConfigSpace:
    """The knobs of one module and how its expressions name them."""

    knobs: list[Knob] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _argparse: dict[str, Knob] = field(default_factory=dict)  # by dest
    _fields: dict[str, dict[str, Knob]] = field(default_factory=dict)  # class -> field -> knob
    _globals: dict[str, Knob] = field(default_factory=dict)  # module names
    _keyed: dict[str, dict[str, Knob]] = field(default_factory=dict)  # dict/ns/file var -> key
    # dict/namespace items the code computes (`{"epoch": epoch}`): no knob of their own, but
    # read through to a knob they hold (`{"accum": args.accum}`)
    _computed: dict[str, dict[str, tuple]] = field(default_factory=dict)
    _parsed: set[str] = field(default_factory=set)  # names bound to parse_args() results
    _instances: dict[str, str] = field(default_factory=dict)  # name -> dataclass it holds
    _model: object = None

    def knob_for(self, expr: cst.CSTNode | None, scope: Scope | None = None) -> Knob | None:
        """The knob an expression reads: `args.k`, `cfg.k`, `config["k"]`, `config.get("k")`,
        a configurable global, or a name bound once to one of those (`K = args.k`)."""
        if expr is None:
            return None
        return self._knob(strip_parens(expr), scope, 0)

    def _knob(self, node, scope: Scope | None, depth: int) -> Knob | None:
        if depth > FOLLOW_DEPTH or not isinstance(node, cst.BaseExpression):
            return None
        node = strip_parens(node)
        if isinstance(node, cst.Call):
            if dotted(node.func) in _PASS_CALLS and len(positional(node)) == 1:
                return self._knob(positional(node)[0], scope, depth + 1)
            return self._call_knob(node, scope, depth)
        if isinstance(node, cst.Name):
            return self._name_knob(node.value, scope, depth)
        if isinstance(node, cst.Attribute):
            return self._member(node.value, node.attr.value, scope)
        if isinstance(node, cst.Subscript) and len(node.slice) == 1:
            index = node.slice[0].slice
            key = string_value(index.value) if isinstance(index, cst.Index) else None
            if key is not None:
                return self._keyed_knob(node.value, key, scope)
        return None

    def _call_knob(self, node: cst.Call, scope, depth) -> Knob | None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "get" and positional(node):
            key = string_value(positional(node)[0])
            if key is not None:
                return self._keyed_knob(func.value, key, scope)
        if dotted(func) == "getattr" and len(positional(node)) >= 2:
            attr = string_value(positional(node)[1])
            if attr is not None:
                return self._member(positional(node)[0], attr, scope)
        return None

    def _name_knob(self, name: str, scope, depth) -> Knob | None:
        model = self._model
        while scope is not None and scope.parent is not None:
            if name in scope.globals:
                break
            defs = scope.defs.get(name, [])
            if defs or name in scope.params:
                if len(defs) == 1 and defs[0].op == "=" and defs[0].tuple_index is None:
                    return self._knob(defs[0].value, scope, depth + 1)
                if not defs:  # a parameter: the knob every call of the module passes
                    return self._passed_knob(scope, name, depth)
                return None
            scope = scope.parent
        if name in self._globals:
            return self._globals[name]
        top = model.scopes[0] if model is not None else None
        defs = top.defs.get(name, []) if top is not None else []
        if scope is None and not defs and model is not None:
            # no scope given (K taken from an engine's call): the one binding of the module
            defs = [d for s in model.scopes for d in s.defs.get(name, [])]
            if len(defs) == 1 and defs[0].op == "=" and defs[0].tuple_index is None:
                return self._knob(defs[0].value, defs[0].stmt.scope, depth + 1)
            return None
        if len(defs) == 1 and defs[0].op == "=" and defs[0].tuple_index is None:
            return self._knob(defs[0].value, top, depth + 1)
        return None

    def _passed_knob(self, scope: Scope, param: str, depth: int) -> Knob | None:
        """`def train(loader, accum)` called as `train(dl, args.accum)`: the one knob every
        call site of this module passes (None when a call passes something else)."""
        sites = self._model.argument_sites(scope, param) if self._model is not None else []
        if not sites:
            return self._parameter_default(scope, param)
        found = {id(k): k for e, s in sites if (k := self._knob(e, s.scope, depth + 1))}
        knobs = list(found.values())
        resolved = len(knobs) == 1 and all(self._knob(e, s.scope, depth + 1) for e, s in sites)
        return knobs[0] if resolved else None

    def _parameter_default(self, scope: Scope, param: str) -> Knob | None:
        """A whole-number default of a parameter that no call of this module passes (the
        function is called from elsewhere, or always with its default): its default is the
        value the default run sees, `train_epoch(accum_grad_iters=...)` the knob."""
        node = scope.params[param]
        value = int_value(node.default) if node.default is not None else None
        if value is None or self._model is None:
            return None
        spelling = f"{scope.name}({param}=...)"
        line = self._model.line(node)
        return Knob(param, spelling, value, None, KnobSource.PARAMETER_DEFAULT, line)

    def default_of(self, expr, scope: Scope | None = None) -> tuple[object, tuple[Knob, ...]]:
        """The value an expression takes in the default configuration, computed from the
        knobs it reads (`batch_size // micro_batch_size`, `max(round(nbs / opt.batch_size),
        1)`), and those knobs; (_UNKNOWN, ()) when any part of it is out of sight."""
        used: dict[int, Knob] = {}
        value = self._default(strip_parens(expr), scope, 0, used, None)
        return value, tuple(used.values())

    def _default(self, node, scope, depth: int, used: dict, before: int | None) -> object:
        """`before`: the order of the statement the value is read in (None: after them all)."""
        if depth > _MAX_EXPRESSION_DEPTH or not isinstance(node, cst.BaseExpression):
            return _UNKNOWN
        node = strip_parens(node)
        knob = self._knob(node, scope, 0)
        if knob is not None:
            if not knob.default_known:
                return _UNKNOWN
            used[id(knob)] = knob
            return knob.default
        literal = _literal(node) if isinstance(node, (cst.Integer, cst.Float)) else _UNKNOWN
        if literal is not _UNKNOWN:
            return literal
        again = lambda n: self._default(n, scope, depth + 1, used, before)  # noqa: E731
        if isinstance(node, cst.BinaryOperation):
            return _arithmetic(type(node.operator).__name__, again(node.left), again(node.right))
        if isinstance(node, cst.Call) and dotted(node.func) in _NUMBER_CALLS:
            args = [again(a) for a in positional(node)]
            if not args or len(args) != len(node.args) or not all(map(_is_number, args)):
                return _UNKNOWN
            try:
                return _NUMBER_CALLS[dotted(node.func)](*args)
            except (TypeError, ValueError, OverflowError):
                return _UNKNOWN
        if isinstance(node, cst.Name):
            return self._name_default(node.value, scope, depth, used, before)
        return _UNKNOWN

    def _name_default(self, name: str, scope, depth: int, used: dict, before) -> object:
        """A local or module name: the value of its last binding that runs at the defaults."""
        while scope is not None and scope.parent is not None:
            defs = scope.defs.get(name, [])
            if defs or name in scope.params:
                return self._bindings_default(defs, scope, depth, used, before)
            scope = scope.parent
        top = self._model.scopes[0] if self._model is not None else None
        defs = top.defs.get(name, []) if top is not None else []
        return self._bindings_default(defs, top, depth, used, before)

    def _bindings_default(self, defs, scope, depth: int, used: dict, before) -> object:
        """`k = 1` then `if batch_size > MAX_GPU_BATCH_SIZE: k = batch_size // MAX_...`
        (Accelerate's examples): each binding in order, an `if` branch taken when its test
        holds at the defaults. Unknown when a binding is an augmented one, sits in a loop or
        after an early exit, or under a test the defaults cannot decide."""
        value = _UNKNOWN
        for d in defs:
            if before is not None and d.stmt.order >= before:
                break
            if d.op != "=" or any(
                f.kind in (FrameKind.LOOP, FrameKind.EXIT) for f in d.stmt.frames
            ):
                return _UNKNOWN
            runs = True
            for frame in d.stmt.frames:
                if frame.kind != FrameKind.IF:
                    continue
                truth = self._truth(frame.node.test, scope, depth + 1, used, d.stmt.order)
                if truth is _UNKNOWN:
                    return _UNKNOWN
                if truth != frame.holds:
                    runs = False
                    break
            if runs:
                value = self._default(_element(d), scope, depth + 1, used, d.stmt.order)
        return value

    def _truth(self, test, scope, depth: int, used: dict, before) -> object:
        """Whether a test holds at the defaults: comparisons of computed numbers, `not`, and
        `and`/`or`, whose other side may stay unknown when one side decides."""
        test = strip_parens(test)
        if depth > _MAX_EXPRESSION_DEPTH:
            return _UNKNOWN
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            inner = self._truth(test.expression, scope, depth + 1, used, before)
            return _UNKNOWN if inner is _UNKNOWN else not inner
        if isinstance(test, cst.BooleanOperation):
            is_and = isinstance(test.operator, cst.And)
            left = self._truth(test.left, scope, depth + 1, used, before)
            if left is not _UNKNOWN and left != is_and:
                return left  # `False and ...`, `True or ...`
            right = self._truth(test.right, scope, depth + 1, used, before)
            if left is _UNKNOWN:
                return right if right is not _UNKNOWN and right != is_and else _UNKNOWN
            return right
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            target = test.comparisons[0]
            compare = _COMPARISONS.get(type(target.operator).__name__)
            left = self._default(test.left, scope, depth + 1, used, before)
            right = self._default(target.comparator, scope, depth + 1, used, before)
            if compare is not None and _is_number(left) and _is_number(right):
                return compare(left, right)
        return _UNKNOWN

    def _member(self, receiver, attr: str, scope) -> Knob | None:
        """`receiver.attr`: an argparse dest, a dataclass field, a namespace or file key."""
        text = dotted(receiver)
        if text is None:
            return None
        head = text
        if self._has_key(head, attr):
            return self._key(head, attr)
        parent, _, leaf = text.rpartition(".")  # cfg.train.k: a nested key of a loaded file
        if parent in self._keyed and f"{leaf}.{attr}" in self._keyed[parent]:
            return self._keyed[parent][f"{leaf}.{attr}"]
        if head in self._instances:
            return self._fields.get(self._instances[head], {}).get(attr)
        if head in self._parsed or last_part(text) in self._parsed:
            return self._argparse.get(attr)
        # a parameter or attribute holding the parsed settings (`def train(args)`,
        # `self.args`, `self.cfg`): the one knob of that name, when only one source has it
        found = [self._argparse[attr]] if attr in self._argparse else []
        found += [f[attr] for f in self._fields.values() if attr in f]
        return found[0] if len(found) == 1 and self._holder(text, scope) else None

    def _holder(self, text: str, scope) -> bool:
        """Whether a name may hold parsed settings: a parameter, `self.<x>`, or a name bound
        to something the module cannot see (not to a literal of its own)."""
        head = text.split(".", 1)[0]
        if head == "self" or (scope is not None and head in scope.params):
            return True
        model = self._model
        defs = [d for s in model.scopes for d in s.defs.get(text, [])] if model else []
        return all(isinstance(d.value, cst.Call) for d in defs)

    def _keyed_knob(self, receiver, key: str, scope) -> Knob | None:
        text = dotted(receiver)
        if text is not None:
            if self._has_key(text, key):
                return self._key(text, key)
            if text.startswith("vars(") or text in self._parsed:
                return self._argparse.get(key)
        if isinstance(receiver, cst.Call) and dotted(receiver.func) == "vars":
            return self._argparse.get(key)
        if isinstance(receiver, cst.Subscript) and len(receiver.slice) == 1:
            index = receiver.slice[0].slice
            outer = string_value(index.value) if isinstance(index, cst.Index) else None
            base = dotted(receiver.value)
            if outer is not None and base in self._keyed:
                return self._keyed[base].get(f"{outer}.{key}")
        return None

    def _has_key(self, var: str, key: str) -> bool:
        return key in self._keyed.get(var, {}) or key in self._computed.get(var, {})

    def _key(self, var: str, key: str) -> Knob | None:
        if key in self._keyed.get(var, {}):
            return self._keyed[var][key]
        expr, scope = self._computed[var][key]
        return self._knob(expr, scope, 1)

    def describe(self) -> dict:
        """`--show-loops`' view: every knob and every note."""
        return {"knobs": [k.describe() for k in self.knobs], "notes": list(self.notes)}


def config_space(model) -> ConfigSpace:
    """The module's configuration space (built once per model)."""
    return model.memo("config_space", _build)


# --- K's configuration ----------------------------------------------------------------------
def k_configuration(model, k: cst.CSTNode | None, scope: Scope | None = None):
    """The configuration a finding about accumulation depends on: K read from a knob. A knob
    whose default is at most 1 leaves the default run unaffected (latent); a larger default
    affects it. None when K is a literal or its source is out of sight. `scope`: where `k` is
    read (None: found from the module's one binding of a name)."""
    if k is None:
        return None
    space = config_space(model)
    knob = space.knob_for(k, scope)
    if knob is None and _engine_value(model, k) is not None:
        k, scope = _engine_value(model, k), None
        knob = space.knob_for(k, None)
    if knob is None:
        return _derived_k_configuration(space, k, scope)
    if not knob.default_known:
        return None
    default = knob.default
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return None
    shown = int(default) if float(default).is_integer() else default
    condition = f"with {knob.spelling} > 1 (default {shown})"
    return Configuration(affects_default=default > 1, condition=condition, knobs=(knob.name,))


def _derived_k_configuration(space: ConfigSpace, k, scope):
    """K computed from knobs (`gradient_accumulation_iters = batch_size // micro_batch_size`):
    its value at their defaults decides whether the default run is affected."""
    value, knobs = space.default_of(k, scope)
    if not knobs or not _is_number(value):
        return None
    shown = int(value) if float(value).is_integer() else value
    spelled = ", ".join(knob.spelling for knob in knobs)
    condition = f"with {code(strip_parens(k))} > 1 (default {shown}, from {spelled})"
    return Configuration(value > 1, condition, tuple(knob.name for knob in knobs))


def gate_configuration(model, gate, scope: Scope | None = None):
    """`k_configuration` of a step gate's K, read in the gate's own function (the caller's loop
    for a per-batch function), or of the engine's K for an `accumulate()`/`sync` gate and for
    a loop without a gate of its own."""
    if gate is None or gate.k is None:
        return k_configuration(model, model.engine_k(), None)
    where = gate.caller if gate.caller is not None else scope
    if gate.kind in (GateKind.ACCUMULATE, GateKind.SYNC):
        where = None  # the engine's K, read where the engine is built
    return k_configuration(model, gate.k, where)


def _engine_value(model, k) -> cst.BaseExpression | None:
    """The K an engine was built with, for `accelerator.gradient_accumulation_steps`."""
    node = strip_parens(k) if isinstance(k, cst.BaseExpression) else k
    if not isinstance(node, cst.Attribute) or node.attr.value != "gradient_accumulation_steps":
        return None
    engine = model.engine_for(dotted(node.value), None)
    return engine.accum if engine is not None and engine.accum is not node else None


# --- building -------------------------------------------------------------------------------
def _build(model) -> ConfigSpace:
    space = ConfigSpace(_model=model)
    path = getattr(model, "path", None)
    top = model.scopes[0]
    hf = any(last_part(c.func) == "HfArgumentParser" for s in model.scopes for c in s.calls)
    classes = list(_dataclasses(model.module))
    lines = _field_lines(model) if classes else {}
    for cls in classes:
        _add_fields(model, space, cls, path, hf, lines.get(cls.name.value, {}))
    for scope in model.scopes:
        for site in scope.calls:
            if site.method == "add_argument":
                _add_argument(model, space, site.call, path, site.stmt)
            elif site.method == "set_defaults":
                _set_defaults(space, site.call)
    _find_parse_results(model, space)
    overridable = _has_configurator(model)
    for name, defs in top.defs.items():
        _add_global(model, space, name, defs, overridable, path)
    for scope in model.scopes:
        for name, defs in scope.defs.items():
            if len(defs) == 1 and defs[0].op == "=" and defs[0].tuple_index is None:
                _add_keyed(model, space, scope, name, defs[0], path)
    return space


def _literal(node) -> object:
    """The Python value of a literal expression (numbers, strings, booleans, None, simple
    arithmetic on numbers, lists/tuples of those), else _UNKNOWN."""
    if node is None or not _literal_shape(node):
        return _UNKNOWN
    try:
        tree = ast.parse(code(strip_parens(node)).strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return _UNKNOWN
    return _evaluate(tree)


_LITERAL_NODES = (
    cst.Integer,
    cst.Float,
    cst.SimpleString,
    cst.ConcatenatedString,
    cst.UnaryOperation,
    cst.BinaryOperation,
    cst.List,
    cst.Tuple,
    cst.Element,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
)


_WHITESPACE = (cst.BaseParenthesizableWhitespace, cst.TrailingWhitespace, cst.EmptyLine)


_LITERAL_NESTING = 8  # CST levels: a literal knob (a dict of dtypes) is shallower


def _literal_shape(node: cst.CSTNode, depth: int = 0) -> bool:
    """Whether an expression is made of literals only, checked before generating its text
    (a module's big calls and comprehensions are never printed to be parsed again)."""
    if depth > _LITERAL_NESTING:
        return False
    if isinstance(node, cst.Name):
        return node.value in ("True", "False", "None")
    if not isinstance(node, _LITERAL_NODES):
        return isinstance(node, (cst.BaseBinaryOp, cst.BaseUnaryOp, _WHITESPACE, cst.Comma))
    return all(_literal_shape(child, depth + 1) for child in node.children)


def _evaluate(tree: ast.AST) -> object:
    if isinstance(tree, ast.Constant):
        return tree.value
    if isinstance(tree, (ast.List, ast.Tuple)):
        items = [_evaluate(e) for e in tree.elts]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else tuple(items)
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, (ast.USub, ast.UAdd)):
        value = _evaluate(tree.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(tree.op, ast.USub) else value
    if isinstance(tree, ast.BinOp):
        name = _AST_OPERATORS.get(type(tree.op))
        if name is not None:
            return _arithmetic(name, _evaluate(tree.left), _evaluate(tree.right))
    return _UNKNOWN
    return _UNKNOWN


_NUMBER_CALLS = {
    "int": int,
    "float": float,
    "round": round,
    "max": max,
    "min": min,
    "abs": abs,
    "math.ceil": math.ceil,
    "math.floor": math.floor,
    "ceil": math.ceil,
    "floor": math.floor,
}


def _element(d) -> cst.BaseExpression | None:
    """The value a `Def` binds: one element of a tuple unpacking (`a, k = x, args.k`)."""
    if d.tuple_index is None:
        return d.value
    value = strip_parens(d.value) if d.value is not None else None
    if isinstance(value, (cst.Tuple, cst.List)) and d.tuple_index < len(value.elements):
        element = value.elements[d.tuple_index]
        return None if isinstance(element, cst.StarredElement) else element.value
    return None


def _arithmetic(operator: str, left, right) -> object:
    if not (_is_number(left) and _is_number(right)):
        return _UNKNOWN
    try:
        return {
            "Add": lambda: left + right,
            "Subtract": lambda: left - right,
            "Multiply": lambda: left * right,
            "Divide": lambda: left / right,
            "FloorDivide": lambda: left // right,
            "Modulo": lambda: left % right,
        }.get(operator, lambda: _UNKNOWN)()
    except (ZeroDivisionError, OverflowError):
        return _UNKNOWN


_COMPARISONS = {
    "GreaterThan": lambda a, b: a > b,
    "GreaterThanEqual": lambda a, b: a >= b,
    "LessThan": lambda a, b: a < b,
    "LessThanEqual": lambda a, b: a <= b,
    "Equal": lambda a, b: a == b,
    "NotEqual": lambda a, b: a != b,
}
_AST_OPERATORS = {
    ast.Add: "Add",
    ast.Sub: "Subtract",
    ast.Mult: "Multiply",
    ast.Div: "Divide",
    ast.FloorDiv: "FloorDivide",
    ast.Mod: "Modulo",
}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _add(space: ConfigSpace, knob: Knob) -> Knob:
    space.knobs.append(knob)
    return knob


# argparse ---------------------------------------------------------------------------------
_TYPES = {"int": int, "float": float, "str": str}


def _add_argument(model, space: ConfigSpace, call: cst.Call, path, stmt) -> None:
    options = [string_value(a) for a in positional(call)]
    if not options or any(o is None for o in options):
        return
    long = [o for o in options if o.startswith("--")]
    shown = long[0] if long else options[0]
    dest_node = keyword(call, "dest")
    dest = string_value(dest_node) if dest_node is not None else None
    if dest is None:
        dest = (long[0] if long else options[0]).lstrip("-").replace("-", "_")
    action = string_value(keyword(call, "action"))
    type_name = dotted(keyword(call, "type")) if keyword(call, "type") is not None else None
    default_node = keyword(call, "default")
    if default_node is not None:
        default = _literal(default_node)
    elif action in ("store_true", "store_false"):
        default = action == "store_false"
    else:
        default = None
    if isinstance(default, str) and type_name in ("int", "float"):
        try:
            default = _TYPES[type_name](default)  # argparse converts string defaults
        except ValueError:
            pass
    choices = _literal(keyword(call, "choices")) if keyword(call, "choices") is not None else None
    if not isinstance(choices, tuple):
        choices = None
    if action in ("store_true", "store_false"):
        type_name = "bool"
    known = default is not _UNKNOWN
    knob = Knob(
        dest,
        shown,
        default if known else None,
        choices,
        KnobSource.ARGPARSE,
        model.positions.statement_line(stmt.node),
        path,
        known,
        type_name,
    )
    if dest in space._argparse:  # a later definition of the same dest (subparsers): keep both
        space.knobs.append(knob)
        return
    space._argparse[dest] = _add(space, knob)


def _set_defaults(space: ConfigSpace, call: cst.Call) -> None:
    """`parser.set_defaults(k=4)` changes the default of an argument defined before it."""
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value not in space._argparse:
            continue
        value = _literal(arg.value)
        old = space._argparse[arg.keyword.value]
        new = Knob(
            old.name,
            old.spelling,
            value if value is not _UNKNOWN else None,
            old.choices,
            old.source,
            old.line,
            old.path,
            value is not _UNKNOWN,
            old.type,
        )
        space.knobs[space.knobs.index(old)] = new
        space._argparse[old.name] = new


_PARSE_METHODS = {"parse_args", "parse_known_args", "parse_args_into_dataclasses"}


def _find_parse_results(model, space: ConfigSpace) -> None:
    """Names bound to parsed settings: `args = parser.parse_args()`, `args, _ =
    parser.parse_known_args()`, `args = parse_args()` for a local function returning one, and
    HfArgumentParser's dataclass instances (`model_args, train_args = parser.parse_...()`)."""
    returning = set()
    for scope in model.scopes[1:]:
        for value, _stmt in scope.returns:
            if _is_parse_call(value, returning) or (
                dotted(value) is not None
                and any(
                    _is_parse_call(d.value, returning) for d in scope.defs.get(dotted(value), [])
                )
            ):
                returning.add(scope.name)
    classes = _hf_classes(model)
    for scope in model.scopes:
        for name, defs in scope.defs.items():
            for d in defs:
                if not _is_parse_call(d.value, returning):
                    continue
                method = last_part(dotted(d.value.func) if isinstance(d.value, cst.Call) else "")
                if method == "parse_args_into_dataclasses" and d.tuple_index is not None:
                    if d.tuple_index < len(classes):
                        space._instances[name] = classes[d.tuple_index]
                elif d.tuple_index in (None, 0):
                    space._parsed.add(name)
        for name, defs in scope.defs.items():  # `cfg = TrainConfig(...)`
            for d in defs:
                if (
                    isinstance(d.value, cst.Call)
                    and last_part(dotted(d.value.func)) in space._fields
                ):
                    space._instances[name] = last_part(dotted(d.value.func))


def _is_parse_call(value, returning: set[str]) -> bool:
    if isinstance(value, cst.Subscript):  # parser.parse_known_args()[0]
        value = value.value
    if not isinstance(value, cst.Call):
        return False
    callee = last_part(dotted(value.func))
    return callee in _PARSE_METHODS or callee in returning


def _hf_classes(model) -> list[str]:
    """The dataclasses given to `HfArgumentParser((ModelArguments, TrainingArguments))`."""
    for scope in model.scopes:
        for site in scope.calls:
            if last_part(site.func) == "HfArgumentParser" and positional(site.call):
                given = strip_parens(positional(site.call)[0])
                items = given.elements if isinstance(given, (cst.Tuple, cst.List)) else None
                if items is None:
                    return [last_part(dotted(given))] if dotted(given) else []
                return [last_part(dotted(e.value)) for e in items if dotted(e.value)]
    return []


# dataclasses --------------------------------------------------------------------------------
def _dataclasses(module: cst.Module):
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and any(
            last_part(dotted(d.decorator) or dotted(getattr(d.decorator, "func", None)))
            == "dataclass"
            for d in statement.decorators
        ):
            yield statement


def _field_lines(model) -> dict[str, dict[str, int]]:
    """Each module-level class's annotated fields and their lines, from Python's `ast`: the
    model positions nodes of function bodies cheaply, a class body only by generating it."""
    tree = getattr(model.positions, "_tree", None)
    if tree is None and model.source is not None:
        try:
            tree = ast.parse(model.source)
        except (SyntaxError, ValueError):
            return {}
    found: dict[str, dict[str, int]] = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.ClassDef):
            fields = found.setdefault(node.name, {})
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    fields.setdefault(item.target.id, item.lineno)
    return found


def _add_fields(model, space: ConfigSpace, cls: cst.ClassDef, path, hf: bool, lines) -> None:
    fields = space._fields.setdefault(cls.name.value, {})
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    for line in body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if not isinstance(small, cst.AnnAssign) or not isinstance(small.target, cst.Name):
                continue
            name = small.target.value
            value, choices = small.value, None
            if isinstance(value, cst.Call) and last_part(dotted(value.func)) == "field":
                choices = _metadata_choices(value)
                value = keyword(value, "default")  # None: a default_factory or required
            default = _literal(value) if value is not None else _UNKNOWN
            known = default is not _UNKNOWN
            spelling = f"--{name}" if hf else f"{cls.name.value}.{name}"
            type_name = code(small.annotation.annotation)
            knob = Knob(
                name,
                spelling,
                default if known else None,
                choices,
                KnobSource.DATACLASS,
                lines.get(name) or model.line(small),
                path,
                known,
                type_name,
            )
            fields[name] = _add(space, knob)


def _metadata_choices(call: cst.Call) -> tuple | None:
    metadata = keyword(call, "metadata")
    if not isinstance(metadata, cst.Dict):
        return None
    for element in metadata.elements:
        if isinstance(element, cst.DictElement) and string_value(element.key) == "choices":
            value = _literal(element.value)
            return value if isinstance(value, tuple) else None
    return None


# module globals -----------------------------------------------------------------------------
def _has_configurator(model) -> bool:
    """nanoGPT's `exec(open('configurator.py').read())` or `globals().update(...)`: every
    module-level setting above it may be overridden from the command line or a config file."""
    for site in model.scopes[0].calls:
        if site.func == "exec" and positional(site.call):
            return True
        pair = site.method == "update" and isinstance(site.call.func, cst.Attribute)
        if pair and isinstance(site.call.func.value, cst.Call):
            if dotted(site.call.func.value.func) == "globals":
                return True
    return False


def _add_global(model, space: ConfigSpace, name, defs, overridable: bool, path) -> None:
    first = next((d for d in defs if d.op == "=" and d.tuple_index is None), None)
    if first is None or name.startswith("_") or "." in name:
        return
    value = _literal(first.value)
    if value is _UNKNOWN or isinstance(value, tuple) or first.stmt.frames:
        return
    if not overridable:
        if len(defs) != 1 or _bound_elsewhere(model, name):
            return
        if not isinstance(value, (int, float, str)) or isinstance(value, bool):
            return  # flags and None are rarely settings of a run: keep constants numeric/str
    source = KnobSource.OVERRIDABLE_GLOBAL if overridable else KnobSource.CONSTANT
    spelling = f"--{name}" if overridable else name
    type_name = type(value).__name__ if value is not None else None
    line = model.positions.statement_line(first.stmt.node)
    knob = Knob(name, spelling, value, None, source, line, path, True, type_name)
    space._globals[name] = _add(space, knob)


def _bound_elsewhere(model, name: str) -> bool:
    from linter.model.constants import _other_bindings

    return name in _other_bindings(model) or any(
        name in s.defs and name in s.globals for s in model.scopes[1:]
    )


# dicts, namespaces and config files -----------------------------------------------------------
def _add_keyed(model, space: ConfigSpace, scope: Scope, name: str, d, path) -> None:
    value = strip_parens(d.value) if d.value is not None else None
    line = lambda: model.positions.statement_line(d.stmt.node)  # noqa: E731 (only for a knob)
    if isinstance(value, cst.Dict):
        keys = _dict_items(value)
        if keys:
            _add_keys(space, name, keys, KnobSource.DICT, f'{name}["{{}}"]', line, path, scope)
        return
    if not isinstance(value, cst.Call):
        return
    callee = last_part(dotted(value.func))
    if callee in ("SimpleNamespace", "Namespace", "EasyDict", "edict"):
        items = {a.keyword.value: a.value for a in value.args if a.keyword is not None}
        star = [a.value for a in value.args if a.star == "**"]
        for given in star:
            given = strip_parens(given)
            source = given if isinstance(given, cst.Dict) else _bound_dict(scope, given)
            if source is not None:
                items = {**_dict_items(source), **items}
        if items:
            _add_keys(space, name, items, KnobSource.NAMESPACE, f"{name}.{{}}", line, path, scope)
        return
    loaded = _loaded_file(model, space, scope, value, d)
    if loaded is None:
        return
    kind, file_path, shown = loaded
    data = _parse_file(space, kind, file_path, shown)
    if not isinstance(data, dict):
        return
    source = {"yaml": KnobSource.YAML, "json": KnobSource.JSON, "toml": KnobSource.TOML}[kind]
    knobs = space._keyed.setdefault(name, {})
    for key, item in _flatten(data):
        knobs[key] = _add(
            space,
            Knob(key, f"{shown}: {key}", item, None, source, _key_line(file_path, key), shown),
        )


def _dict_items(node: cst.Dict) -> dict[str, cst.BaseExpression]:
    return {
        key: e.value
        for e in node.elements
        if isinstance(e, cst.DictElement) and (key := string_value(e.key)) is not None
    }


def _bound_dict(scope: Scope, node) -> cst.Dict | None:
    text = dotted(node)
    defs = scope.defs.get(text, []) if text else []
    if len(defs) == 1 and isinstance(defs[0].value, cst.Dict):
        return defs[0].value
    return None


def _add_keys(space, name, items: dict, source, pattern: str, line, path, scope) -> None:
    """A literal item is a knob; a computed one is read through to what it holds. `line`
    gives the line of the binding."""
    knobs = space._keyed.setdefault(name, {})
    for key, value in items.items():
        default = _literal(value)
        if default is _UNKNOWN:
            space._computed.setdefault(name, {})[key] = (value, scope)
            continue
        spelling = pattern.format(key)
        knobs[key] = _add(space, Knob(key, spelling, default, None, source, line(), path))


def _loaded_file(model, space, scope: Scope, call: cst.Call, d):
    """(kind, file path, path as written) of `yaml.safe_load(open("cfg.yaml"))`,
    `json.load(f)` under `with open("cfg.json") as f`, `OmegaConf.load("cfg.yaml")`, or a
    path given by an argparse default (`open(args.config)`), when the project holds the file."""
    func = dotted(call.func) or ""
    method = last_part(func)
    if method not in _LOADERS or not positional(call):
        return None
    argument = strip_parens(positional(call)[0])
    written = _path_text(model, space, scope, argument, d)
    if written is None:
        return None
    kind = _FILE_KINDS.get(os.path.splitext(written)[1].lower())
    if kind is None:
        return None
    base = os.path.dirname(os.path.abspath(getattr(model, "path", None) or "."))
    for _ in range(4):  # the script's folder, then up to three folders above it
        candidate = os.path.join(base, written)
        if os.path.isfile(candidate):
            return kind, candidate, written
        base = os.path.dirname(base)
    return None


def _path_text(model, space, scope, node, d) -> str | None:
    if isinstance(node, cst.Call) and dotted(node.func) == "open" and positional(node):
        node = strip_parens(positional(node)[0])
    text = string_value(node)
    if text is not None:
        return text
    if isinstance(node, cst.Name):
        for with_node, _frames in scope.withs:
            for item in with_node.items:
                target = item.asname.name if item.asname is not None else None
                if dotted(target) == node.value and isinstance(item.item, cst.Call):
                    return _path_text(model, space, scope, item.item, d)
    knob = space.knob_for(node, scope)
    if knob is not None and isinstance(knob.default, str):
        return knob.default
    return None


def _parse_file(space: ConfigSpace, kind: str, path: str, shown: str):
    try:
        with open(path, "rb") as file:
            raw = file.read(1_000_000)
    except OSError as exc:
        space.notes.append(f"{shown}: not read ({exc.strerror or exc})")
        return None
    try:
        if kind == "json":
            import json

            return json.loads(raw)
        if kind == "toml":
            import tomllib

            return tomllib.loads(raw.decode("utf-8"))
        try:
            import yaml
        except ImportError:
            space.notes.append(f"{shown}: not read (PyYAML is not installed)")
            return None
        return yaml.safe_load(raw)
    except Exception as exc:  # any parser's error: the file is a note, never a crash
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        space.notes.append(f"{shown}: does not parse as {kind.upper()} ({first})")
        return None


def _flatten(data: dict, prefix: str = "", depth: int = 0):
    for key, value in data.items():
        if not isinstance(key, str):
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict) and depth < 2:
            yield from _flatten(value, f"{name}.", depth + 1)
        elif isinstance(value, (int, float, str, bool)) or value is None:
            yield name, value


def _key_line(path: str, key: str) -> int:
    """The line of a file's key (its last part), for `--show-loops`; 1 when not found."""
    leaf = key.rsplit(".", 1)[-1]
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            for number, text in enumerate(file, 1):
                stripped = text.lstrip().lstrip('"').lstrip("'")
                if stripped.startswith(leaf) and stripped[len(leaf) :].lstrip("\"' ")[:1] in ":=":
                    return number
    except OSError:
        pass
    return 1
