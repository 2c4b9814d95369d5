"""Whether what a loop iterates may have no length (ACL307).

An epoch tail exists only for a loader that ends after `len(loader)` batches, and a last-batch
clause has to read that length: `len()` raises TypeError on a DataLoader over an
`IterableDataset`, a streaming `datasets` dataset, a generator or `itertools.cycle`. The
iterable is followed back through the names it is bound to, `DataLoader(dataset)`,
`accelerator.prepare(loader)` and dataset methods that keep a dataset streaming.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import (
    compound_statements,
    dotted,
    is_false,
    keyword,
    last_part,
    method_call,
    positional,
    strip_parens,
    walk,
)
from linter.model.depths import LOADER_DEPTH
from linter.model.functions import Scope
from linter.model.setup import is_prepare

if TYPE_CHECKING:
    from linter.model import Model

# Iterables without a length, or that never end (`enumerate(cycle(dl))`).
ENDLESS = {"iter", "cycle", "itertools.cycle", "islice", "itertools.islice", "repeat", "zip"}
_ENDLESS_LAST = {"cycle", "repeat", "count", "islice", "chain"}
_ITERABLE_BASES = {"IterableDataset", "IterDataPipe"}
# `datasets` methods that return a dataset of the same kind (a streaming one stays streaming).
_KEEPS_KIND = {
    "map",
    "filter",
    "shuffle",
    "take",
    "skip",
    "shard",
    "batch",
    "with_format",
    "select_columns",
    "remove_columns",
    "rename_column",
    "rename_columns",
    "cast",
}
# `datasets` functions whose first argument's kind the result keeps.
_KEEPS_KIND_FUNCTIONS = {"split_dataset_by_node"}


def may_have_no_length(model: Model, expr: cst.BaseExpression, scope: Scope, order: int) -> bool:
    """Whether `len(expr)` may raise: `expr` (read at `order` in `scope`) is, or wraps, an
    iterable-style dataset, a streaming dataset, a generator or an endless iterator."""
    return _Lengthless(model).of(expr, scope, order, 0)


class _Lengthless:
    def __init__(self, model: Model) -> None:
        self.model = model
        self.classes = model.memo("iterables.classes", _class_table)
        self.seen: set[tuple[str, int]] = set()  # names already followed (`dl = prepare(dl)`)

    def of(self, expr, scope: Scope, order: int | None, depth: int) -> bool:
        if depth > LOADER_DEPTH:
            return False
        expr = strip_parens(expr)
        if isinstance(expr, cst.GeneratorExp):
            return True
        if isinstance(expr, cst.Subscript):  # `load_dataset(..., streaming=True)["train"]`
            return self.of(expr.value, scope, order, depth + 1)
        if isinstance(expr, cst.Call):
            return self._call(expr, scope, order, depth)
        text = dotted(expr)
        return text is not None and self._name(text, scope, order, depth)

    def _call(self, call: cst.Call, scope: Scope, order, depth: int) -> bool:
        name = dotted(call.func) or ""
        qual = self.model.imports.qualify(call.func) or name
        if name in ENDLESS or last_part(qual) in _ENDLESS_LAST:
            return True
        streaming = keyword(call, "streaming")
        if streaming is not None and not is_false(streaming):
            return True
        args = positional(call)
        pair = method_call(call)
        if pair is not None:
            receiver, method = pair
            if method == "to_iterable_dataset" or (
                method == "from_generator" and "Iterable" in (dotted(receiver) or "")
            ):
                return True
            if method in _KEEPS_KIND:
                return self.of(receiver, scope, order, depth + 1)
            if is_prepare(method, "data_loader") and len(args) == 1:
                return self.of(args[0], scope, order, depth + 1)
        if qual.split(".", 1)[0] == "webdataset":  # `wds.WebDataset(urls)`, `wds.WebLoader`
            return True
        if last_part(qual) in _KEEPS_KIND_FUNCTIONS and args:
            return self.of(args[0], scope, order, depth + 1)
        if last_part(qual) in ("DataLoader", "StatefulDataLoader"):
            dataset = keyword(call, "dataset") or (args[0] if args else None)
            return dataset is not None and self.of(dataset, scope, order, depth + 1)
        if last_part(name) in self.classes:
            return self._iterable_class(last_part(name), 0)
        callee = self.model.local_function(call.func, scope)
        return callee is not None and _is_generator(callee.node)

    def _name(self, text: str, scope: Scope, order, depth: int) -> bool:
        """Any binding of the name in reach (the loop may run after any of them), or, for a
        parameter, any argument the module passes."""
        if (text, id(scope)) in self.seen:
            return False
        self.seen.add((text, id(scope)))
        while scope is not None:
            defs = scope.defs.get(text, [])
            if defs:
                for d in defs:
                    if d.op != "=":
                        continue
                    if d.tuple_index is None and d.value is not None:
                        if self.of(d.value, d.stmt.scope, d.stmt.order, depth + 1):
                            return True
                    elif (prepared := self.model.setup.prepared.get(text)) is not None:
                        original = cst.parse_expression(prepared.original)
                        if dotted(original) != text:  # `dl = prepare(..., train_loader)`
                            if self.of(original, d.stmt.scope, d.stmt.order, depth + 1):
                                return True
                return False
            if text in scope.params:
                return any(
                    self.of(e, s.scope, s.order, depth + 1)
                    for e, s in self.model.argument_sites(scope, text)
                )
            scope = scope.parent
        return False

    def _iterable_class(self, name: str, depth: int) -> bool:
        """A module class that subclasses `IterableDataset` (directly or through another of
        the module's classes), or defines `__iter__` without `__len__`."""
        if depth > LOADER_DEPTH or name not in self.classes:
            return False
        bases, methods = self.classes[name]
        if "__iter__" in methods and "__len__" not in methods and not bases & self.classes.keys():
            return True
        for base in bases:
            if base in _ITERABLE_BASES or self._iterable_class(base, depth + 1):
                return True
        return False


def _class_table(model: Model) -> dict[str, tuple[set[str], set[str]]]:
    """name -> (the last parts of its bases, the methods it defines), for the module's classes."""
    table = {}
    for node in compound_statements(model.module):
        if isinstance(node, cst.ClassDef):
            bases = {last_part(dotted(b.value)) for b in node.bases if dotted(b.value)}
            methods = {s.name.value for s in node.body.body if isinstance(s, cst.FunctionDef)}
            table[node.name.value] = (bases, methods)
    return table


def _is_generator(node: cst.CSTNode) -> bool:
    """A function whose own body yields (not a nested function's)."""
    return any(isinstance(n, cst.Yield) for n in walk(node))
