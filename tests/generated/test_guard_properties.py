"""The guard, running a generated loop, reports exactly the runtime-detectable codes of the
catalogue; on correct loops (gradient-averaging ones included) it reports nothing."""

from __future__ import annotations

from ground_truth import correct, runtime_codes
from hypothesis import given, settings
from loop_parts import Loop, render
from loop_runs import run
from loop_strategies import examples, loops


def _summary(outcome) -> str:
    rows = [f"  {f.code} at {f.location}: {f.message}" for f in outcome.findings]
    return "\n".join(rows) or "  nothing"


@settings(max_examples=examples(250))
@given(loops())
def test_guard_reports_exactly_the_runtime_codes(loop: Loop) -> None:
    program = render(loop)
    outcome = run(program.source, with_guard=True)
    want = runtime_codes(loop)
    assert outcome.codes == want, (
        f"{loop}\nwant {sorted(want)}, the guard reported:\n{_summary(outcome)}\n"
        + (f"the program failed:\n{outcome.error}\n" if outcome.error else "")
        + program.source
    )


@settings(max_examples=examples(50))
@given(loops().map(correct))
def test_guard_is_silent_on_correct_loops(loop: Loop) -> None:
    assert runtime_codes(loop) == set()
    program = render(loop)
    outcome = run(program.source, with_guard=True)
    assert outcome.error is None, f"{loop}\n{outcome.error}"
    assert not outcome.findings, f"false alarm on {loop}:\n{_summary(outcome)}\n{program.source}"
