"""`--fix --unsafe-fixes` on generated loops: the output parses, a second pass changes nothing,
and it trains (CPU, tiny model, fixed seeds) to exactly the parameters of the corrected loop."""

from __future__ import annotations

import ast

from ground_truth import corrected
from hypothesis import given, settings
from loop_parts import Loop, render
from loop_runs import fix, run, same_params
from loop_strategies import examples, loops


def _fixed(loop: Loop) -> str:
    source = render(loop).source
    outcome = fix(source)
    assert outcome.error is None, f"{loop}\n{outcome.error}"
    ast.parse(outcome.text)
    again = fix(outcome.text)
    assert again.text == outcome.text, f"{loop}: a second --fix changed the file"
    assert again.fixed == 0
    return outcome.text


@settings(max_examples=examples(100))
@given(loops())
def test_fix_output_parses_and_is_idempotent(loop: Loop) -> None:
    _fixed(loop)


@settings(max_examples=examples(35))
@given(loops())
def test_fixed_loop_trains_like_the_corrected_loop(loop: Loop) -> None:
    fixed = _fixed(loop)
    want = run(render(corrected(loop)).source)
    assert want.error is None, f"the corrected {corrected(loop)} failed:\n{want.error}"
    got = run(fixed)
    assert got.error is None, f"{loop}: the fixed program failed:\n{got.error}\n{fixed}"
    assert same_params(got.params, want.params), (
        f"{loop}: after --fix it trains differently from {corrected(loop)}\n{fixed}"
    )
