"""Helpers for rule tests: run one rule on a snippet, apply its fixes the way `--fix` does."""

from __future__ import annotations

import textwrap

import libcst
import pytest

from linter.analysis import analyze_source
from linter.fixer import fix_text


class Linter:
    def __init__(self, code: str) -> None:
        self.code = code

    def diagnostics(self, source: str):
        return analyze_source(textwrap.dedent(source), "snippet.py", [self.code])

    def findings(self, source: str) -> list[tuple[str, int, int]]:
        """(code, line, column) of every finding."""
        return [(d.code, d.start.line, d.start.column) for d in self.diagnostics(source)]

    def fixed(self, source: str, unsafe: bool = False) -> str:
        """The text after fixing; checks that it parses and that fixing again changes nothing."""
        source = textwrap.dedent(source)
        analyse = lambda text: analyze_source(text, "snippet.py", [self.code])  # noqa: E731
        outcome = fix_text(source, analyse, unsafe)
        assert outcome.error is None
        libcst.parse_module(outcome.text)
        assert fix_text(outcome.text, analyse, unsafe).text == outcome.text
        return outcome.text


def _at(source: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """(line, column) of the nth occurrence of `needle` in the dedented source."""
    lines = textwrap.dedent(source).split("\n")
    seen = 0
    for number, line in enumerate(lines, start=1):
        column = line.find(needle)
        while column != -1:
            if seen == nth:
                return number, column
            seen += 1
            column = line.find(needle, column + 1)
    raise AssertionError(f"{needle!r} not in source")


@pytest.fixture
def at():
    """`at(source, needle)`: where a piece of text is, to state expected positions exactly."""
    return _at


def _rule_fixture(code: str):
    @pytest.fixture(name=code.lower())
    def fixture() -> Linter:
        return Linter(code)

    return fixture


# `acl101`, `acl102`, ...: a Linter for each static rule, as a test argument.
for _code in sorted(__import__("rules").ALL_RULES):
    globals()[f"_fixture_{_code.lower()}"] = _rule_fixture(_code)
