"""Small multi-module projects written to a temporary directory and linted inside them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from linter import project
from linter.analysis import analyze_source
from linter.project.context import Project


class Tree:
    """A project on disk: `write({"engine.py": ...})`, then `findings("engine.py", code)`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")

    def write(self, files: dict[str, str]) -> Tree:
        for name, text in files.items():
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        return self

    def text(self, name: str) -> str:
        return (self.root / name).read_text()

    def diagnostics(self, name: str, *codes: str, alone: bool = False):
        """The findings of `codes` in one file, read in its project (or alone)."""
        path = self.root / name
        project.enable(None if alone else Project(self.root))
        try:
            return analyze_source(path.read_text(), str(path), codes)
        finally:
            project.enable(None)

    def findings(self, name: str, *codes: str, alone: bool = False):
        found = self.diagnostics(name, *codes, alone=alone)
        return [(d.code, d.start.line, d.start.column) for d in found]


@pytest.fixture
def tree(tmp_path) -> Tree:
    return Tree(tmp_path)


@pytest.fixture
def at():
    """`at(text, needle)`: where a piece of a file's text is, to state positions exactly."""
    return _at


def _at(text: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """(line, column) of the nth occurrence of `needle` in a file's text."""
    seen = 0
    for number, line in enumerate(text.split("\n"), start=1):
        column = line.find(needle)
        while column != -1:
            if seen == nth:
                return number, column
            seen += 1
            column = line.find(needle, column + 1)
    raise AssertionError(f"{needle!r} not in text")
