"""Source positions, computed only when something is reported or described.

libcst's PositionProvider re-generates the whole module (~100 ms per 1,000 lines), so the model
never asks for it while deciding; a file without findings never pays for it.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider


class Positions:
    def __init__(self, module: cst.Module) -> None:
        self._module = module
        self._ranges = None

    def range(self, node: cst.CSTNode) -> CodeRange:
        if self._ranges is None:
            wrapper = MetadataWrapper(self._module, unsafe_skip_copy=True)
            self._ranges = wrapper.resolve(PositionProvider)
        return self._ranges[node]

    def line(self, node: cst.CSTNode) -> int:
        return self.range(node).start.line
