"""`--fix` on generated loops: the output parses, a second pass changes nothing, and it trains
(CPU, tiny model, fixed seeds) to exactly the parameters of the loop with the fixed defects
repaired. With `--unsafe-fixes` that is every defect that has a fix; plain `--fix` repairs only
those the ground truth says a safe fix repairs, and a safe fix never changes what a program
computes otherwise: each safe fix offered is for a defect the ground truth lists as safely
fixable, and applied alone it trains like that one defect repaired. DDP loops also compare, at
every backward, whether it syncs the gradients (`loop_runs.same_training`)."""

from __future__ import annotations

import ast

from ground_truth import corrected, crashes, fix_safety, safe_fixes
from hypothesis import example, given, settings
from loop_parts import Loop, render
from loop_runs import fix, run, safe_fix_codes, same_training
from loop_strategies import examples, loops


def _fixed(loop: Loop, unsafe: bool = True, codes: set[str] | None = None):
    source = render(loop).source
    outcome = fix(source, unsafe=unsafe, codes=codes)
    assert outcome.error is None, f"{loop}\n{outcome.error}"
    ast.parse(outcome.text)
    again = fix(outcome.text, unsafe=unsafe, codes=codes)
    assert again.text == outcome.text, f"{loop}: a second --fix changed the file"
    assert again.fixed == 0
    return outcome


def _trains_like(loop: Loop, fixed: str, want_loop: Loop, how: str) -> None:
    want = run(render(want_loop).source)
    got = run(fixed)
    if crashes(want_loop):  # a defect left unrepaired crashes it: the same error, as early
        assert want.error and got.error, f"{loop}: want both to fail\n{want.error}\n{got.error}"
        assert _last_line(got.error) == _last_line(want.error), f"{loop}\n{got.error}\n{fixed}"
        assert got.syncs == want.syncs, f"{loop}: {got.syncs} (want {want.syncs})\n{fixed}"
        return
    assert want.error is None, f"the corrected {want_loop} failed:\n{want.error}"
    assert got.error is None, f"{loop}: the fixed program failed:\n{got.error}\n{fixed}"
    what = "its gradient syncs differ" if got.syncs != want.syncs else "its parameters differ"
    assert same_training(got, want), (
        f"{loop}: after {how} it trains differently from {want_loop}: {what}\n"
        f"syncs per backward {got.syncs} (want {want.syncs})\n{fixed}"
    )


def _last_line(error: str) -> str:
    return error.strip().splitlines()[-1]


def _optional_applied(loop: Loop, outcome) -> set[str]:
    """The `optional` safe fixes that were applied: their finding is gone from the output."""
    left = {d.code for d in outcome.diagnostics}
    return {c for c, how in fix_safety(loop).items() if how == "optional" and c not in left}


@settings(max_examples=examples(100))
@given(loops())
def test_fix_output_parses_and_is_idempotent(loop: Loop) -> None:
    _fixed(loop)


@settings(max_examples=examples(35))
@given(loops())
def test_fixed_loop_trains_like_the_corrected_loop(loop: Loop) -> None:
    outcome = _fixed(loop)
    codes = {code for code, how in fix_safety(loop).items() if how in ("safe", "unsafe")}
    codes |= _optional_applied(loop, outcome)
    _trains_like(loop, outcome.text, corrected(loop, codes), "--fix --unsafe-fixes")


# Issue 22's two "safe" fixes that changed programs, run on every CI run whatever the draw: ACL301
# dividing a loss from a callable handed in (it may divide already), and ACL202 moving a backward
# out of the `no_sync()` entered in its autocast's `with`.
CALLABLE_LOSS = Loop(k=4, structure="helper", loss_fn="param")
BACKWARD_IN_NO_SYNC = Loop(precision="bf16", k=4, cast_scope="backward", ddp=True)


@settings(max_examples=examples(35))
@given(loops())
@example(CALLABLE_LOSS)
@example(BACKWARD_IN_NO_SYNC)
def test_safe_fixes_train_like_the_safely_fixable_defects_repaired(loop: Loop) -> None:
    """Plain `--fix`: the safely fixable defects repaired, the others left as they were."""
    outcome = _fixed(loop, unsafe=False)
    codes = safe_fixes(loop) | _optional_applied(loop, outcome)
    _trains_like(loop, outcome.text, corrected(loop, codes), "--fix")


@settings(max_examples=examples(25))
@given(loops())
@example(CALLABLE_LOSS)
@example(BACKWARD_IN_NO_SYNC)
def test_each_safe_fix_is_for_a_safely_fixable_defect_and_repairs_only_it(loop: Loop) -> None:
    """No safe fix on a correct loop or for a code the ground truth does not list as safely
    fixable; each code's safe fixes, applied alone, train like that defect repaired."""
    safety = fix_safety(loop)
    offered = safe_fix_codes(render(loop).source)
    allowed = {code for code, how in safety.items() if how in ("safe", "optional")}
    assert offered <= allowed, (
        f"{loop}: a safe fix for {sorted(offered - allowed)}, which the ground truth does not "
        f"list as safely fixable (defects: {safety or 'none'})\n{render(loop).source}"
    )
    for code in sorted(offered):
        outcome = _fixed(loop, unsafe=False, codes={code})
        _trains_like(loop, outcome.text, corrected(loop, {code}), f"the safe fix of {code}")
