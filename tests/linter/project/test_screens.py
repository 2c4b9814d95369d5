"""The project's fast text screens give exactly what the plain patterns give: the import
words, the lines a definition touches training on, the callees, whether a file trains.
Checked on the repository's own sources and on the cases the patterns were written for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from linter.project import context, summary

ROOT = Path(__file__).resolve().parents[3]
SOURCES = sorted((ROOT / "linter").rglob("*.py")) + sorted((ROOT / "fixtures").rglob("*.py"))
CASES = [
    "loss.backward ()\nscaler.scale(\n  loss)\nx.unscale_(o)\nsched.step()\n",
    "guidance_scale(3)\nDDP(model)\nnot_DDP(m)\nignore_index=-100\nlabels[-1000]\n",
    "gradient_accumulation_steps\nreduction = 'sum'\nfoo.bar.baz (1)\n1abc(2)\n",
    "def f():\n    a.b(c(d)(e))\n    x = [y(z) for z in w]\n",
]


def _texts():
    return CASES + [path.read_text() for path in SOURCES[::3]]


def test_relevant_lines_are_those_of_the_pattern():
    for text in _texts():
        plain = summary._lines_of(text, [m.start() for m in summary._RELEVANT.finditer(text)])
        assert set(summary._lines_of(text, summary._relevant_starts(text))) == set(plain)


def test_callees_read_backwards_are_those_of_the_pattern():
    pattern = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\s*\(")
    for text in _texts():
        reversed_ = {name[::-1] for name in summary._CALL_REVERSED.findall(text[::-1])}
        assert reversed_ == set(pattern.findall(text))


def test_the_trains_screen_is_the_pattern():
    for text in _texts():
        assert context._trains(text) == (context._TRAINS.search(text) is not None)


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("import os, util.misc as misc\n", {"import", "os", "util", "misc", "as"}),
        (
            "from .engine import (\n    train_one_epoch,\n    evaluate,\n)\nx = 1\n",
            {"from", "engine", "import", "train_one_epoch", "evaluate"},
        ),  # fmt: skip
        (
            "    from engine import train  # comment\n",
            {"from", "engine", "import", "train", "comment"},
        ),  # fmt: skip
        ("important = 1\nimportlib_name = 2\nx = 'from the import'\n", set()),
        ("from importlib import util\n", {"from", "importlib", "import", "util"}),
    ],
)
def test_import_words(source, words):
    assert context._imported(source.encode()) == words


@pytest.mark.parametrize(
    ("source", "heads"),
    [
        ("import os, util.misc as m\n", {"os", "util"}),
        ("from a.b import (\n    c,\n    d,\n)\n    import torch  # x\n", {"a", "torch"}),
        ("from x import y; import z\n", {"x", "z"}),
        ("from . import engine\n", None),  # relative: the project's, maybe
        ("from util \\\n    import misc\n", None),  # continued: not told by its lines
    ],
)
def test_import_heads(source, heads):
    assert context._import_heads(source) == heads


def test_a_file_that_reads_nothing_of_its_project_is_not_parsed_for_it(tmp_path, monkeypatch):
    """Its imports name no module of the project and no file imports it: no `ast` parse."""
    from linter.project.context import Project

    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text("def wrap(model):\n    return model\n")
    alone = "import torch\nimport os.path\n\nfor x in data:\n    loss(x).backward()\n"
    reads = "import util.misc\n" + alone
    (tmp_path / "train.py").write_text(alone)
    summarised = []
    real = context.summarize
    monkeypatch.setattr(context, "summarize", lambda path, *a: summarised.append(path) or
                        real(path, *a))  # fmt: skip
    project = Project(tmp_path)
    path = str(tmp_path / "train.py")
    assert project.context(path, alone) is None and summarised == []
    assert project.context(path, reads) is None
    assert summarised == [path, str(tmp_path / "util" / "misc.py")]
