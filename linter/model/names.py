"""Import alias resolution: `ac` -> `torch.cuda.amp.autocast`, `U` -> `torch.nn.utils`.

libcst's QualifiedNameProvider needs the full scope analysis (hundreds of ms on a large file);
training scripts import at module or function top, so one table of every import binding in the
module is enough and costs one pass over the import statements.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from linter.model.cst_util import SCOPES, child_list, dotted, walk


class Imports:
    """Maps each locally bound import name to the dotted path it stands for."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}

    def add(self, node: cst.Import | cst.ImportFrom) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = dotted(alias.name) or ""
                if alias.asname is not None:
                    self.aliases[dotted(alias.asname.name) or full] = full
                else:
                    head = full.split(".", 1)[0]
                    self.aliases.setdefault(head, head)
            return
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted(node.module) or ""
        for alias in node.names:
            name = dotted(alias.name) or ""
            local = dotted(alias.asname.name) if alias.asname is not None else name
            self.aliases[local or name] = f"{module}.{name}"

    def qualify(self, node: cst.CSTNode | None) -> str | None:
        """The dotted name of `node` with its head resolved through the imports."""
        text = dotted(node)
        if text is None:
            return None
        head, _, rest = text.partition(".")
        full = self.aliases.get(head)
        if full is None:
            return text
        return f"{full}.{rest}" if rest else full

    def is_imported(self, node: cst.CSTNode | None) -> bool:
        text = dotted(node)
        return text is not None and text.split(".", 1)[0] in self.aliases


_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)


def walk_outer(node: cst.CSTNode, name: str) -> Iterator[cst.CSTNode]:
    """`walk`, leaving out what a comprehension binding `name` itself reads as `name`.

    `[loss.item() for loss in history]` has its own `loss`: only its first iterable is
    evaluated in the enclosing scope, so only there does `loss` mean the loop's loss."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current is not node and type(current) in SCOPES:
            continue
        if isinstance(current, _COMPREHENSIONS) and _binds(current.for_in, name):
            stack.append(current.for_in.iter)
            continue
        stack.extend(reversed(child_list(current)))


def _binds(clause: cst.CompFor | None, name: str) -> bool:
    """Whether a comprehension's `for` clauses bind `name` (`for loss in`, `for i, loss in`)."""
    while clause is not None:
        if any(isinstance(n, cst.Name) and n.value == name for n in walk(clause.target)):
            return True
        clause = clause.inner_for_in
    return False
