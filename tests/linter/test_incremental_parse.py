"""The language server's incremental parse gives exactly the whole-file tree, version after
version, and reuses the statements that did not change."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import libcst as cst
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from linter.incremental import ParseCache, parse_with

REPO = Path(__file__).resolve().parents[2]
FIXTURES = sorted((REPO / "fixtures").rglob("*.py"))


def installed_sources() -> list[Path]:
    """Real files nobody here wrote: an optimizer and the samplers of the installed torch."""
    import importlib.util

    root = Path(importlib.util.find_spec("torch").origin).parent
    return [root / "optim" / "sgd.py", root / "utils" / "data" / "sampler.py"]


def assert_same_as_whole(cache: ParseCache, text: str) -> cst.Module:
    """The contract is libcst's own whole-file tree. (That tree does not always print back the
    text: libcst drops a blank line before an indented comment at the end of a file.)"""
    tree = ast.parse(text)
    assembled = parse_with(cache, text, tree)
    whole = cst.parse_module(text)
    assert assembled.deep_equals(whole)
    assert assembled.code == whole.code
    return assembled


# Lines an editor may put anywhere: they exercise headers, footers, block footers and
# comments that belong to the next statement.
INSERTS = [
    "x = 1\n",
    "# a comment\n",
    "\n",
    "    # indented comment\n",
    "  # odd indent\n",
    "@decorator\n",
    "def added():\n    return 1\n",
    "a = 1; b = 2\n",
    "if x:\n    pass\n",
]


@pytest.mark.parametrize("path", [*FIXTURES[::8], *installed_sources()], ids=lambda p: p.name)
def test_real_files_and_edits_parse_as_the_whole_file(path):
    text = path.read_text(encoding="utf-8")
    cache = ParseCache()
    assert_same_as_whole(cache, text)
    lines = text.splitlines(keepends=True)
    for position in range(0, len(lines), max(1, len(lines) // 3)):
        for insert in INSERTS[1:5]:
            edited = "".join(lines[:position] + [insert] + lines[position:])
            try:
                ast.parse(edited)
            except SyntaxError:
                continue
            assert_same_as_whole(cache, edited)


BASE = textwrap.dedent(
    '''\
    #!/usr/bin/env python
    """Doc."""
    import torch

    # a comment that leads `train`


    @torch.no_grad()
    def evaluate(model):
        model.eval()
        # trailing, indented: the block's footer

    # this one leads the class
    class Trainer:
        def step(self):
            loss.backward()
            # deep trailing
        # class-level trailing

    def train():
        for batch in loader:
            loss = model(batch) / 4
            loss.backward()

    # end of file
    '''
)


@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from(INSERTS)), max_size=4))
@example(edits=[(24, "  # odd indent\n")])  # found in CI: the last chunk does not print back
def test_generated_edits_parse_as_the_whole_file(edits):
    cache = ParseCache()
    lines = BASE.splitlines(keepends=True)
    assert_same_as_whole(cache, BASE)
    for position, insert in edits:
        lines.insert(min(position, len(lines)), insert)
        text = "".join(lines)
        try:
            ast.parse(text)
        except SyntaxError:
            continue
        assert_same_as_whole(cache, text)


def test_unchanged_statements_are_reused():
    cache = ParseCache()
    first = assert_same_as_whole(cache, BASE)
    edited = BASE.replace("/ 4", "/ 8")
    second = assert_same_as_whole(cache, edited)
    assert second.body[0] is first.body[0]  # `"""Doc."""`
    assert second.body[-1] is not first.body[-1]  # `train` changed
    classes = [s for s in second.body if isinstance(s, cst.ClassDef)]
    old_classes = [s for s in first.body if isinstance(s, cst.ClassDef)]
    # the class statement takes the comment above it again (a new node), its body is shared
    assert classes[0].body is old_classes[0].body


def test_a_statement_repeated_in_one_file_is_two_nodes():
    """The model keys facts by node identity: two equal chunks must not share nodes."""
    text = "import os\nx = 1\nx = 1\nx = 1\n"
    cache = ParseCache()
    for _ in range(2):
        module = assert_same_as_whole(cache, text)
        assert len({id(s) for s in module.body}) == 4


@pytest.mark.parametrize(
    "text",
    [
        "def f():\n    pass\nclass A:\n  def g(self):\n    return 1\n",  # mixed indentation
        "def f():\n\tpass\n\ndef g():\n    pass\n",  # a tab, then spaces
        "x = 1\r\ny = 2\nz = 3\r\n",  # mixed line endings
        "a = 1\n\n    # indented comment at the end\n",  # libcst drops the blank line alone
        "x = 1",  # no final newline
        "# only a comment\n",
        "",
    ],
)
def test_files_the_chunks_cannot_share_fall_back_to_the_whole_parse(text):
    tree = ast.parse(text)
    assembled = parse_with(ParseCache(), text, tree)
    assert assembled.deep_equals(cst.parse_module(text))


def test_the_server_path_finds_what_the_cli_finds_on_every_version():
    from linter.config import Overrides, Resolver
    from linter.text import lint_text

    script = REPO / "fixtures" / "lsp" / "train_500.py"
    text = script.read_text(encoding="utf-8")
    resolver = Resolver(Overrides(), cwd=REPO)
    cache = ParseCache()
    versions = [
        text,
        text.replace("    micro_step = 0\n", "    micro_step = 1\n"),
        text.replace("        loss.backward()\n", "        (loss / accum).backward()\n", 1),
        text.replace("    log_every: int = 5\n", "    log_every: int = 7\n"),
    ]
    for version in versions:
        incremental = lint_text(version, script, resolver, cache=cache).diagnostics
        assert incremental == lint_text(version, script, resolver).diagnostics
    assert {d.code for d in lint_text(versions[0], script, resolver).diagnostics}


def test_a_chunk_too_deep_for_libcst_is_screened_before_it_is_parsed(monkeypatch):
    """The whole-file screen's verdict, from the chunks an edit changed: the server must not
    hand libcst a sum of 600 terms (it would take seconds, or overflow its stack)."""
    from linter.config import Overrides, Resolver
    from linter.text import lint_text

    resolver = Resolver(Overrides(), cwd=REPO)
    cache = ParseCache()
    first = "import torch\n\nloss.backward()\n"
    assert lint_text(first, "t.py", resolver, cache=cache).diagnostics == []
    deep = first + "y = " + " + ".join(["a"] * 600) + "\n"
    whole = lint_text(deep, "t.py", resolver).diagnostics
    parsed = []
    monkeypatch.setattr(cst, "parse_module", lambda text: parsed.append(text))
    (found,) = lint_text(deep, "t.py", resolver, cache=cache).diagnostics
    assert parsed == []  # neither the chunk nor the whole file reached libcst
    assert found == whole[0]
    assert (found.code, found.start.line) == ("ACL000", 4)
    assert found.message == "too deeply nested to analyse: 603 levels (the limit is 400)"
