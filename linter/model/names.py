"""Import alias resolution: `ac` -> `torch.cuda.amp.autocast`, `U` -> `torch.nn.utils`.

libcst's QualifiedNameProvider needs the full scope analysis (hundreds of ms on a large file);
training scripts import at module or function top, so one table of every import binding in the
module is enough and costs one pass over the import statements.
"""

from __future__ import annotations

import libcst as cst

from linter.model.cst_util import dotted


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
