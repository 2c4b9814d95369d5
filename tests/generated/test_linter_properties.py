"""The linter on generated loops reports exactly the catalogue's codes, at the user's lines."""

from __future__ import annotations

from ground_truth import correct, static_findings
from hypothesis import given, settings
from loop_parts import Loop, render
from loop_runs import lint
from loop_strategies import examples, loops


def _show(pairs) -> str:
    return ", ".join(f"{code}@{line}" for code, line in sorted(pairs)) or "none"


def _check(loop: Loop) -> None:
    program = render(loop)
    want = static_findings(loop, program)
    got = lint(program.source)
    assert got == want, (
        f"{loop}\nmissing {_show(want - got)}; unexpected {_show(got - want)}\n{program.source}"
    )


@settings(max_examples=examples(350))
@given(loops())
def test_linter_reports_exactly_the_ground_truth(loop: Loop) -> None:
    _check(loop)


@settings(max_examples=examples(100))
@given(loops().map(correct))
def test_linter_is_silent_on_correct_loops(loop: Loop) -> None:
    """Correct loops, gradient-averaging ones included, get no finding at all."""
    assert static_findings(loop, render(loop)) == set()
    _check(loop)
