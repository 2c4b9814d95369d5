"""A big module parsed in pieces (`parse_in_pieces`) gives exactly libcst's whole-file tree."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import libcst as cst
import pytest

from linter.analysis import PIECES_FROM, parse
from linter.incremental import parse_in_pieces

REPO = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(REPO / "tests" / "linter"))
from test_incremental_parse import BASE, FIXTURES, INSERTS, installed_sources  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from big_file import generate  # noqa: E402


def assert_same_as_whole(text: str, piece_bytes: int) -> None:
    pieces = parse_in_pieces(text, ast.parse(text), piece_bytes)
    whole = cst.parse_module(text)
    assert pieces.deep_equals(whole)
    assert pieces.code == whole.code


@pytest.mark.parametrize("piece_bytes", [1, 4096])
@pytest.mark.parametrize("path", [*FIXTURES[::6], *installed_sources()], ids=lambda p: p.name)
def test_real_files_in_pieces_parse_as_the_whole_file(path, piece_bytes):
    assert_same_as_whole(path.read_text(encoding="utf-8"), piece_bytes)


@pytest.mark.parametrize("insert", INSERTS)
def test_comments_and_blank_lines_at_each_cut_stay_where_the_whole_parse_puts_them(insert):
    lines = BASE.splitlines(keepends=True)
    for position in range(len(lines) + 1):
        text = "".join(lines[:position] + [insert] + lines[position:])
        try:
            ast.parse(text)
        except SyntaxError:
            continue
        for piece_bytes in (1, 60):
            assert_same_as_whole(text, piece_bytes)


@pytest.mark.parametrize(
    "text",
    [
        "def f():\n    pass\nclass A:\n  def g(self):\n    return 1\n",  # mixed indentation
        "def f():\n\tpass\n\ndef g():\n    pass\n",  # a tab, then spaces
        "x = (1,\n  2)\ndef f():\n    pass\n",  # a continuation line before the first block
        "x = 1\r\ny = 2\nz = 3\r\n",  # mixed line endings
        "a = 1\n\n    # indented comment at the end\n",  # libcst drops the blank line alone
        "x = 1",  # no final newline
        "# only a comment\n",
        "",
    ],
)
def test_files_the_pieces_cannot_share_fall_back_to_the_whole_parse(text):
    pieces = parse_in_pieces(text, ast.parse(text), 1)
    assert pieces.deep_equals(cst.parse_module(text))


DEFINITIONS = """\
import torch


def traced_graph(x, params):
    \"\"\"Generated.\"\"\"
    v0 = torch.matmul(x, params[0])
    # a comment between two statements
    v1 = v0 + 1; v2 = v1 * 2

# a comment at column 0 inside the body
    @torch.no_grad()
    def inner(y):
        return y
        # the inner block's footer

    x = inner(v2)
    return x
    # the function's footer

# leads the class


class Generated(torch.nn.Module):
    weight = 1.0

    def forward(self, x):
        return x * self.weight

    async def fetch(self):
        return await self.source()
    # the class's footer


async def main():
    await run()
    await run()
"""


@pytest.mark.parametrize("piece_bytes", [1, 30, 80])
def test_big_definitions_are_cut_between_body_statements_as_the_whole_parse(piece_bytes):
    assert_same_as_whole(DEFINITIONS, piece_bytes)
    lines = DEFINITIONS.splitlines(keepends=True)
    for position in range(len(lines) + 1):
        for insert in ("    # indented comment\n", "\n", "  # odd indent\n", "# col 0\n"):
            text = "".join(lines[:position] + [insert] + lines[position:])
            try:
                ast.parse(text)
            except SyntaxError:
                continue
            assert_same_as_whole(text, piece_bytes)


@pytest.mark.parametrize("shape", ["pb2", "models", "tables", "mixed", "one_function"])
def test_a_big_generated_module_is_parsed_in_pieces_as_the_whole_file(shape):
    """The analysis' own path: from `PIECES_FROM` characters the tree comes from pieces."""
    text = generate(shape, PIECES_FROM + 1000)
    module, tree = parse(text)
    assert tree is not None  # parsed in pieces: the cuts came from this `ast`
    assert module.deep_equals(cst.parse_module(text))
