"""The module's call graph: which of its own functions a call refers to, who calls a function,
and what each caller passes for a parameter (directly or through `functools.partial`)."""

from __future__ import annotations

import libcst as cst

from linter.model.cst_util import dotted, positional
from linter.model.functions import CallSite, Def, Scope, Stmt

_LIGHTNING_PACKAGES = {"lightning", "pytorch_lightning"}


class CallGraph:
    def __init__(self, scopes: list[Scope], function_defs, imports) -> None:
        self.scopes = scopes
        self.function_defs = function_defs
        self.imports = imports
        self.defs: dict[str, list[Def]] = {}
        for scope in scopes:
            for name, defs in scope.defs.items():
                self.defs.setdefault(name, []).extend(defs)
        self.calls: list[CallSite] = [c for scope in scopes for c in scope.calls]
        self.partials: dict[str, tuple[Scope, int]] = {}
        self.partials = self._find_partials()
        self._callers: dict[int, list[CallSite]] = {}
        self._per_batch: dict[tuple[int, int], bool] = {}
        for call in self.calls:
            callee = self.local_function(call.call.func, call.stmt.scope)
            if callee is not None:
                self._callers.setdefault(id(callee), []).append(call)

    def callers(self, scope: Scope) -> list[CallSite]:
        """The module's calls of this function (or method)."""
        return self._callers.get(id(scope), [])

    def module_defs(self, text: str) -> list[Def]:
        return self.defs.get(text, [])

    def local_function(self, func: cst.BaseExpression, scope: Scope) -> Scope | None:
        """The module's own function (or method of the same class) a call refers to."""
        text = dotted(func)
        if text is None:
            return None
        if text in self.partials:
            return self.partials[text][0]
        if "." not in text:
            candidates = [s for s in self.function_defs.get(text, ()) if s.class_name is None]
        elif text.startswith("self.") and text.count(".") == 1 and scope.class_name:
            name = text.split(".", 1)[1]
            candidates = [
                s for s in self.function_defs.get(name, ()) if s.class_name == scope.class_name
            ]
        else:
            return None
        return candidates[0] if len(candidates) == 1 else None

    def defines_function(self, func: cst.BaseExpression) -> bool:
        """Whether the callee is named like one of this module's own functions or methods."""
        text = dotted(func)
        if text is None:
            return False
        if "." not in text:
            return text in self.function_defs
        return text.startswith("self.") and text.split(".", 1)[1] in self.function_defs

    def argument_sites(self, scope: Scope, param: str) -> list[tuple[cst.BaseExpression, Stmt]]:
        """(expression passed for `param`, the calling statement) at this module's calls of the
        function, directly or through a `partial`. Methods are called without their `self`."""
        if param not in scope.params:
            return []
        names = list(scope.params)
        if scope.class_name is not None and names and names[0] in ("self", "cls"):
            names = names[1:]
        if param not in names:
            return []  # `self` itself is never passed as an argument
        found = []
        for call in self.callers(scope):
            args = call.call.args
            by_keyword = [a.value for a in args if a.keyword and a.keyword.value == param]
            partial = self.partials.get(call.func or "")
            position = names.index(param) - (partial[1] if partial else 0)
            positional_args = [a.value for a in args if a.keyword is None and not a.star]
            if by_keyword:
                found.append((by_keyword[0], call.stmt))
            elif 0 <= position < len(positional_args):
                found.append((positional_args[position], call.stmt))
        return found

    def called_in_loop(self, scope: Scope) -> bool:
        """Whether this module calls the function from inside a loop (a per-batch step), or
        the function is a Lightning module's `training_step`, which the trainer calls per
        batch."""
        if not isinstance(scope.node, cst.FunctionDef):
            return False
        if scope.name == "training_step" and scope.class_name and self._imports_lightning():
            return True
        return any(self.per_batch_call(call) for call in self.callers(scope))

    def per_batch_call(self, call: CallSite, depth: int = 3) -> bool:
        """Whether a call runs every batch: inside a loop, or in the body of a function that
        itself runs every batch (`fit` loops over `self.train_step(batch)`, which calls
        `self.backward(loss)`: the trainer's step split into methods)."""
        if call.stmt.loops():
            return True
        scope = call.stmt.scope
        if depth == 0 or not isinstance(scope.node, cst.FunctionDef):
            return False
        key = (id(scope), depth)
        if key not in self._per_batch:  # once per function: a helper called from many places
            self._per_batch[key] = False
            callers = self.callers(scope)
            self._per_batch[key] = any(self.per_batch_call(c, depth - 1) for c in callers)
        return self._per_batch[key]

    def _imports_lightning(self) -> bool:
        return any(
            full.split(".", 1)[0] in _LIGHTNING_PACKAGES for full in self.imports.aliases.values()
        )

    def _find_partials(self) -> dict[str, tuple[Scope, int]]:
        """Names bound once to `functools.partial(f, ...)` of a module function: (f, the number
        of positional arguments the partial already binds)."""
        found = {}
        for name, defs in self.defs.items():
            if len(defs) != 1 or defs[0].op != "=" or defs[0].tuple_index is not None:
                continue
            value = defs[0].value
            if not isinstance(value, cst.Call) or not positional(value):
                continue
            if self.imports.qualify(value.func) != "functools.partial":
                continue
            callee = self.local_function(positional(value)[0], defs[0].stmt.scope)
            if callee is not None:
                found[name] = (callee, len(positional(value)) - 1)
        return found


def argument_for(callee: Scope, call: cst.Call, param: str) -> cst.BaseExpression | None:
    """What `call` passes for the parameter `param` of `callee` (a method is called without its
    `self`); None when it passes nothing for it or unpacks `*args`/`**kwargs` before it."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == param:
            return arg.value
    names = list(callee.params)
    if callee.class_name is not None and names and names[0] in ("self", "cls"):
        names = names[1:]
    if param not in names:
        return None
    index = names.index(param)
    leading = []
    for arg in call.args:
        if arg.keyword is not None:
            break
        if arg.star:
            return None
        leading.append(arg.value)
    return leading[index] if index < len(leading) else None
