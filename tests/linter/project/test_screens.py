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
