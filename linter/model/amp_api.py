"""Deprecated AMP references (ACL203): every place a module names `torch.cuda.amp.autocast`,
`GradScaler`, `custom_fwd`, `custom_bwd` or their `torch.cpu.amp` twins.

A reference is reached in one of three ways, and each decides what a fix must touch:
- a full attribute chain from `torch` (`torch.cuda.amp.autocast(...)`, `th.cpu.amp.autocast`):
  one site, fixed on its own;
- a name bound by importing a deprecated module (`import torch.cuda.amp as amp`,
  `from torch.cuda import amp`): the import and every `amp.X` use change together;
- a name bound by importing a deprecated object (`from torch.cuda.amp import autocast as ac`):
  the import and every use of `ac` change together.

Names are resolved module-wide: a name bound both by such an import and by anything else (an
assignment, a parameter, a second import of something else) is ambiguous, and its uses are not
rewritten. Compatibility code is recognised on the way down the tree: references inside an
`except ImportError` / `except AttributeError` handler, in a branch that tests the torch version
or `hasattr(...)`, or inside a `getattr`/`hasattr` call are fallbacks, not deprecated usage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from linter.model.cst_util import children, dotted

# full path -> (device type, the `torch.amp` name)
DEPRECATED: dict[str, tuple[str, str]] = {}
for _device in ("cuda", "cpu"):
    for _name, _module in (
        ("autocast", "autocast_mode"),
        ("GradScaler", "grad_scaler"),
        ("custom_fwd", "autocast_mode"),
        ("custom_bwd", "autocast_mode"),
    ):
        if _device == "cpu" and _name.startswith("custom"):
            continue  # torch.cpu.amp never had custom_fwd / custom_bwd
        DEPRECATED[f"torch.{_device}.amp.{_name}"] = (_device, _name)
        DEPRECATED[f"torch.{_device}.amp.{_module}.{_name}"] = (_device, _name)
DEPRECATED_MODULES = {"torch.cuda.amp": "cuda", "torch.cpu.amp": "cpu"}
# The attributes a deprecated module alias may keep using once it stands for `torch.amp`.
TORCH_AMP_NAMES = {"autocast", "GradScaler", "custom_fwd", "custom_bwd"}

# Cheap text test: a module that never writes one of these cannot reference the deprecated API.
_MENTION = re.compile(r"(?:cuda|cpu)(?:\s*\.\s*amp\b|\s+import\b)")
# A test that selects code by torch version or feature (`is_torch_version(">=", "2.4")`,
# `TORCH_GREATER_EQUAL_2_4`, `hasattr(torch.amp, "GradScaler")`, `digit_version(...)`).
_COMPAT_TEST = re.compile(r"version|hasattr|getattr|\d_\d|torch_?\d|greater|less_than", re.I)
_FALLBACK_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError"}
_BROAD_ERRORS = {"Exception", "BaseException"}
_MODERN_PREFIXES = ("torch.amp", "torch.autocast")
_PARTIALS = {"partial", "functools.partial"}


@dataclass(eq=False)
class Use:
    """One occurrence of a name or attribute chain that resolves to deprecated AMP (or, for a
    name bound to it, any occurrence of that name)."""

    node: cst.BaseExpression  # the Name or Attribute chain
    full: str  # its resolved dotted path
    role: str  # "call" | "decorator" (bare) | "annotation" | "partial" | "value"
    call: cst.Call | None  # the call whose callee (or, for "partial", first argument) it is
    fallback: bool  # inside compatibility code

    @property
    def target(self) -> tuple[str, str] | None:
        """(device, `torch.amp` name) when the use names a deprecated object."""
        return DEPRECATED.get(self.full)


@dataclass(eq=False)
class Binding:
    """An import binding a local name to a deprecated module or object."""

    local: str
    full: str  # `torch.cuda.amp` or `torch.cuda.amp.autocast`
    statement: cst.Import | cst.ImportFrom
    alias: cst.ImportAlias
    line: cst.SimpleStatementLine | cst.SimpleStatementSuite
    alone_in_block: bool  # the only statement of its block (removing it would empty the block)
    block: int  # id() of the statement list holding its line (where an added import goes)
    function: cst.FunctionDef | None  # the function whose body holds it (None: module level)
    fallback: bool  # inside compatibility code
    guarded: bool  # in a `try` body whose handler catches ImportError (a feature probe)

    @property
    def is_module(self) -> bool:
        return self.full in DEPRECATED_MODULES

    @property
    def target(self) -> tuple[str, str] | None:
        return DEPRECATED.get(self.full)


@dataclass
class AmpApi:
    chains: list[Use] = field(default_factory=list)  # full chains from a torch name
    bindings: list[Binding] = field(default_factory=list)
    uses: dict[int, list[Use]] = field(default_factory=dict)  # id(binding) -> its uses
    imported: dict[str, set[str]] = field(default_factory=dict)  # local -> import targets
    rebound: set[str] = field(default_factory=set)  # names bound other than by import
    exported: set[str] = field(default_factory=set)  # `__all__` entries, `import X as X`
    torch_names: dict[int | None, list[str]] = field(default_factory=dict)
    torch_statements: set[int] = field(default_factory=set)  # id() of `import torch` lines

    def uses_of(self, binding: Binding) -> list[Use]:
        return self.uses.get(id(binding), [])

    def ambiguous(self, name: str) -> bool:
        """Bound by more than one thing: its uses may not be the import's."""
        return name in self.rebound or len(self.imported.get(name, ())) > 1

    def torch_name(self, function: cst.FunctionDef | None = None) -> str | None:
        """A name bound to `torch` at module level or in `function`: `torch`, or an alias."""
        names = self.torch_names.get(None, []) + self.torch_names.get(_key(function), [])
        return "torch" if "torch" in names else (names[0] if names else None)


def amp_api(model, source: str | None = None) -> AmpApi:
    """The module's deprecated AMP references, built once per module."""
    return model.memo("amp_api", lambda m: _collect(m.module, source))


def _key(function: cst.FunctionDef | None) -> int | None:
    return None if function is None else id(function)


def _collect(module: cst.Module, source: str | None) -> AmpApi:
    text = source if source is not None else module.code
    api = AmpApi()
    if not _MENTION.search(text):
        return api
    walker = _Walker(api)
    try:
        walker.run(module)
    except RecursionError:  # an expression nested too deeply to walk: report nothing
        return AmpApi()
    walker.resolve()
    return api


@dataclass(frozen=True)
class _Ctx:
    fallback: bool = False
    annotation: bool = False
    function: cst.FunctionDef | None = None
    guarded: bool = False


_HANDLERS: dict[type, object] = {}


class _Walker:
    """One pass over the whole tree: bindings, candidate uses and the compatibility context."""

    def __init__(self, api: AmpApi) -> None:
        self.api = api
        self.imports: list[tuple[str, str, cst.CSTNode, cst.ImportAlias, _Ctx]] = []
        self.candidates: list[tuple[cst.BaseExpression, str, str, cst.Call | None, _Ctx]] = []
        self.modern = 0  # uses of `torch.amp` / `torch.autocast` seen so far
        self.lines: dict[int, tuple[cst.CSTNode, bool, int]] = {}
        self.parents: dict[int, cst.FunctionDef | None] = {}  # id(function) -> enclosing one

    def run(self, module: cst.Module) -> None:
        self._block(module.body, _Ctx())

    # statements ------------------------------------------------------------------------
    def _block(self, statements, ctx: _Ctx) -> None:
        for statement in statements:
            if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                alone = len(statements) == 1 and len(statement.body) == 1
                for small in statement.body:
                    self.lines[id(small)] = (statement, alone, id(statements))
            self._node(statement, ctx)
            if _returns_early(statement) and _is_compat_test(statement.test):
                ctx = _with(ctx, fallback=True)  # `if hasattr(...): return new` then the old

    def _suite(self, suite: cst.BaseSuite, ctx: _Ctx) -> None:
        if isinstance(suite, cst.IndentedBlock):
            self._block(suite.body, ctx)
        else:
            self._node(suite, ctx)

    def _node(self, node: cst.CSTNode, ctx: _Ctx) -> None:
        kind = type(node)
        handler = _HANDLERS.get(kind)
        if handler is None:
            handler = _HANDLERS[kind] = getattr(_Walker, f"_on_{kind.__name__}", _Walker._visit)
        handler(self, node, ctx)

    def _visit(self, node: cst.CSTNode, ctx: _Ctx) -> None:
        for child in children(node):
            self._node(child, ctx)

    def _on_SimpleStatementSuite(self, node, ctx: _Ctx) -> None:
        for small in node.body:
            self.lines[id(small)] = (node, len(node.body) == 1, id(node))
            self._node(small, ctx)

    def _on_IndentedBlock(self, node, ctx: _Ctx) -> None:
        self._block(node.body, ctx)

    def _on_Import(self, node: cst.Import, ctx: _Ctx) -> None:
        for alias in node.names:
            full = dotted(alias.name) or ""
            if alias.asname is not None:
                local = dotted(alias.asname.name) or full
                if local == full:
                    self.api.exported.add(local)
                self.imports.append((local, full, node, alias, ctx))
            else:
                self.imports.append(
                    (full.split(".", 1)[0], full.split(".", 1)[0], node, alias, ctx)
                )

    def _on_ImportFrom(self, node: cst.ImportFrom, ctx: _Ctx) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted(node.module) or ""
        if module == "torch.amp" or module.startswith("torch.amp."):
            self.modern += 1
        for alias in node.names:
            name = dotted(alias.name) or ""
            local = name
            if alias.asname is not None:
                local = dotted(alias.asname.name) or name
                if local == name:
                    self.api.exported.add(local)
            self.imports.append((local, f"{module}.{name}", node, alias, ctx))

    def _on_FunctionDef(self, node: cst.FunctionDef, ctx: _Ctx) -> None:
        self.api.rebound.add(node.name.value)
        for decorator in node.decorators:
            self._decorator(decorator.decorator, ctx)
        self._node(node.params, ctx)
        if node.returns is not None:
            self._node(node.returns.annotation, _with(ctx, annotation=True))
        self.parents[id(node)] = ctx.function
        self._suite(node.body, _with(ctx, function=node))

    def _decorator(self, expr: cst.BaseExpression, ctx: _Ctx) -> None:
        text = dotted(expr)
        if text is not None:
            self._candidate(expr, text, "decorator", None, ctx)
        else:
            self._node(expr, ctx)

    def _on_ClassDef(self, node: cst.ClassDef, ctx: _Ctx) -> None:
        self.api.rebound.add(node.name.value)
        for decorator in node.decorators:
            self._decorator(decorator.decorator, ctx)
        for arg in (*node.bases, *node.keywords):
            self._node(arg.value, ctx)
        self._suite(node.body, ctx)

    def _on_Param(self, node: cst.Param, ctx: _Ctx) -> None:
        self.api.rebound.add(node.name.value)
        if node.annotation is not None:
            self._node(node.annotation.annotation, _with(ctx, annotation=True))
        if node.default is not None:
            self._node(node.default, ctx)

    def _on_AnnAssign(self, node: cst.AnnAssign, ctx: _Ctx) -> None:
        self._target(node.target, ctx)
        self._node(node.annotation.annotation, _with(ctx, annotation=True))
        if node.value is not None:
            self._node(node.value, ctx)

    def _on_Assign(self, node: cst.Assign, ctx: _Ctx) -> None:
        for target in node.targets:
            self._target(target.target, ctx)
        self._node(node.value, ctx)
        if any(dotted(t.target) == "__all__" for t in node.targets):
            self._exports(node.value)

    def _on_AugAssign(self, node: cst.AugAssign, ctx: _Ctx) -> None:
        self._target(node.target, ctx)
        self._node(node.value, ctx)
        if dotted(node.target) == "__all__":
            self._exports(node.value)

    def _exports(self, value: cst.BaseExpression) -> None:
        for sub in _walk(value):
            if isinstance(sub, cst.SimpleString) and isinstance(sub.evaluated_value, str):
                self.api.exported.add(sub.evaluated_value)

    def _on_For(self, node: cst.For, ctx: _Ctx) -> None:
        self._target(node.target, ctx)
        self._node(node.iter, ctx)
        self._suite(node.body, ctx)
        if node.orelse is not None:
            self._suite(node.orelse.body, ctx)

    def _on_CompFor(self, node: cst.CompFor, ctx: _Ctx) -> None:
        self._target(node.target, ctx)
        self._node(node.iter, ctx)
        for condition in node.ifs:
            self._node(condition.test, ctx)
        if node.inner_for_in is not None:
            self._node(node.inner_for_in, ctx)

    def _on_NamedExpr(self, node: cst.NamedExpr, ctx: _Ctx) -> None:
        self._target(node.target, ctx)
        self._node(node.value, ctx)

    def _on_WithItem(self, node: cst.WithItem, ctx: _Ctx) -> None:
        self._node(node.item, ctx)
        if node.asname is not None:
            self._target(node.asname.name, ctx)

    def _on_Lambda(self, node: cst.Lambda, ctx: _Ctx) -> None:
        self._node(node.params, ctx)
        self._node(node.body, ctx)

    def _on_Global(self, node, ctx: _Ctx) -> None:
        return

    _on_Nonlocal = _on_Global

    def _target(self, target: cst.BaseExpression, ctx: _Ctx) -> None:
        """A store position: names become bindings; a pure chain there is an assignment to an
        attribute (a monkeypatch), not a use."""
        if isinstance(target, cst.Name):
            self.api.rebound.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._target(element.value, ctx)
        elif isinstance(target, cst.StarredElement):
            self._target(target.value, ctx)
        elif dotted(target) is None:
            self._node(target, ctx)

    def _on_If(self, node: cst.If, ctx: _Ctx) -> None:
        self._node(node.test, ctx)
        inner = _with(ctx, fallback=True) if _is_compat_test(node.test) else ctx
        self._suite(node.body, inner)
        if isinstance(node.orelse, cst.If):
            self._node(node.orelse, inner)
        elif node.orelse is not None:
            self._suite(node.orelse.body, inner)

    def _on_IfExp(self, node: cst.IfExp, ctx: _Ctx) -> None:
        self._node(node.test, ctx)
        inner = _with(ctx, fallback=True) if _is_compat_test(node.test) else ctx
        self._node(node.body, inner)
        self._node(node.orelse, inner)

    def _on_Try(self, node: cst.Try, ctx: _Ctx) -> None:
        probing = any(_catches(h.type, _FALLBACK_ERRORS) for h in node.handlers)
        modern_before = self.modern
        self._suite(node.body, _with(ctx, guarded=True) if probing else ctx)
        modern = self.modern > modern_before
        for handler in node.handlers:
            fallback = _catches(handler.type, _FALLBACK_ERRORS) or (
                modern and _catches(handler.type, _BROAD_ERRORS, bare=True)
            )
            if handler.name is not None:
                self._target(handler.name.name, ctx)
            self._suite(handler.body, _with(ctx, fallback=True) if fallback else ctx)
        if node.orelse is not None:
            self._suite(node.orelse.body, ctx)
        if node.finalbody is not None:
            self._suite(node.finalbody.body, ctx)

    _on_TryStar = _on_Try

    # expressions -------------------------------------------------------------------------
    def _on_Call(self, node: cst.Call, ctx: _Ctx) -> None:
        func = node.func
        text = dotted(func)
        if text is not None:
            self._candidate(func, text, "call", node, ctx)
        else:
            self._node(func, ctx)
        probe = text in ("getattr", "hasattr")
        inner = _with(ctx, fallback=True) if probe else _with(ctx, annotation=False)
        args = node.args
        if text in _PARTIALS and args and args[0].keyword is None and not args[0].star:
            first = dotted(args[0].value)
            if first is not None:  # `partial(torch.cuda.amp.autocast, dtype=...)`
                self._candidate(args[0].value, first, "partial", node, inner)
                args = args[1:]
        for arg in args:
            self._node(arg.value, inner)

    def _on_Attribute(self, node: cst.Attribute, ctx: _Ctx) -> None:
        text = dotted(node)
        if text is not None:
            self._use(node, text, ctx)
        else:
            self._node(node.value, ctx)

    def _on_Name(self, node: cst.Name, ctx: _Ctx) -> None:
        self._use(node, node.value, ctx)

    def _on_Arg(self, node: cst.Arg, ctx: _Ctx) -> None:
        self._node(node.value, ctx)

    def _on_SimpleString(self, node, ctx: _Ctx) -> None:
        return

    def _use(self, node: cst.BaseExpression, text: str, ctx: _Ctx) -> None:
        self._candidate(node, text, "annotation" if ctx.annotation else "value", None, ctx)

    def _candidate(self, node, text: str, role: str, call, ctx: _Ctx) -> None:
        if text.startswith(_MODERN_PREFIXES):
            self.modern += 1  # `torch.amp...` in a `try` body makes a broad `except` a fallback
        self.candidates.append((node, text, role, call, ctx))

    # resolution ------------------------------------------------------------------------------
    def resolve(self) -> None:
        api = self.api
        for local, full, statement, alias, ctx in self.imports:
            api.imported.setdefault(local, set()).add(full)
            if full == "torch":
                api.torch_names.setdefault(_key(ctx.function), []).append(local)
                api.torch_statements.add(id(statement))
            elif full in DEPRECATED or full in DEPRECATED_MODULES:
                line, alone, block = self.lines.get(id(statement), (None, False, 0))
                if line is None:
                    continue
                api.bindings.append(
                    Binding(
                        local,
                        full,
                        statement,
                        alias,
                        line,
                        alone,
                        block,
                        ctx.function,
                        ctx.fallback,
                        ctx.guarded,
                    )
                )
        for node, text, role, call, ctx in self.candidates:
            head, _, rest = text.partition(".")
            targets = api.imported.get(head)
            if not targets or len(targets) != 1:
                continue
            (base,) = targets
            if head in api.rebound and base != "torch":  # `torch = None` is a missing torch
                continue
            full = f"{base}.{rest}" if rest else base
            use = Use(node, full, role, call, ctx.fallback)
            if base in DEPRECATED or base in DEPRECATED_MODULES:
                binding = self._binding_for(head, ctx.function)
                if binding is not None:
                    api.uses.setdefault(id(binding), []).append(use)
            elif full in DEPRECATED:
                api.chains.append(use)

    def _binding_for(self, name: str, function: cst.FunctionDef | None) -> Binding | None:
        """The import a use of `name` in `function` reads: the nearest function (or the
        module) that imports it, else the module's first such import."""
        bindings = [b for b in self.api.bindings if b.local == name]
        while True:
            for binding in bindings:
                if binding.function is function:
                    return binding
            if function is None:
                return bindings[0] if bindings else None
            function = self.parents.get(id(function))


def _with(ctx: _Ctx, **changes) -> _Ctx:
    values = {**ctx.__dict__, **changes}
    return _Ctx(**values)


def _returns_early(statement: cst.CSTNode) -> bool:
    """`if test: ... return` without an `else`: what follows runs only when `test` fails."""
    if not isinstance(statement, cst.If) or statement.orelse is not None:
        return False
    body = statement.body
    last = body.body[-1] if isinstance(body, cst.IndentedBlock) else body
    if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return isinstance(last.body[-1], (cst.Return, cst.Raise, cst.Continue, cst.Break))
    return False


def _is_compat_test(test: cst.BaseExpression) -> bool:
    """Names, attributes and strings of the test, searched for a version or feature probe (no
    code generation: tests are read on every `if` of the module)."""
    words = []
    for node in _walk(test):
        if isinstance(node, cst.Name):
            words.append(node.value)
        elif isinstance(node, cst.SimpleString):
            words.append(node.value)
    return bool(_COMPAT_TEST.search(" ".join(words)))


def _catches(kind: cst.BaseExpression | None, names: set[str], bare: bool = False) -> bool:
    """Whether an `except` clause names one of `names` (alone or in a tuple)."""
    if kind is None:
        return bare
    options = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
    return any((dotted(o) or "").rsplit(".", 1)[-1] in names for o in options)


def _walk(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(children(current))
