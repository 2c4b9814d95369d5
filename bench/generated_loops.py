"""Run the generated-loop properties (tests/generated/) over many more examples than CI.

    python bench/generated_loops.py [--examples 1000] [--seed 1]
        [--only linter,fix,safe_fix,each_safe_fix,guard]

Unlike the tests, which stop at the first failure and shrink it, this draws every example, runs
every property on it (the fix property trains every fixed program, not a sample) and groups what
fails: per property, how many examples ran, how many failed, and for each kind of failure how
often and the plainest loop that shows it (`Loop(...)`: paste it into a test or a fixture).
Exit code 1 when anything failed.
"""

from __future__ import annotations

import argparse
import ast
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "generated"))

from ground_truth import (  # noqa: E402
    corrected,
    crashes,
    fix_safety,
    runtime_codes,
    safe_fixes,
    static_findings,
)
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from loop_parts import Loop, render  # noqa: E402
from loop_runs import fix, lint, run, safe_fix_codes, same_training  # noqa: E402
from loop_strategies import loops  # noqa: E402


def linter_failure(loop: Loop) -> str | None:
    program = render(loop)
    want, got = static_findings(loop, program), lint(program.source)
    if got == want:
        return None
    missing = sorted({c for c, _ in want - got})
    extra = sorted({c for c, _ in got - want})
    return f"missing {missing or '-'}, unexpected {extra or '-'}"


def _fix_failure(loop: Loop, want_loop: Loop, unsafe: bool, codes=None, repaired=None):
    """What is wrong with the fix of `loop` (None: nothing), compared with `want_loop`; with
    `repaired` given, with `loop` with those codes and the optional fixes applied repaired."""
    outcome = fix(render(loop).source, unsafe=unsafe, codes=codes)
    if outcome.error:
        return "fix error"
    try:
        ast.parse(outcome.text)
    except SyntaxError:
        return "fixed text does not parse"
    if fix(outcome.text, unsafe=unsafe, codes=codes).text != outcome.text:
        return "second --fix changes the file"
    if repaired is not None:  # the optional safe fixes that were applied join the repairs
        left = {d.code for d in outcome.diagnostics}
        applied = {c for c, how in fix_safety(loop).items() if how == "optional" and c not in left}
        want_loop = corrected(loop, repaired | applied)
    want, got = run(render(want_loop).source), run(outcome.text)
    if crashes(want_loop):  # a defect left unrepaired crashes it: the same error, as early
        if not (want.error and got.error) or _last(want.error) != _last(got.error):
            return "fails unlike the corrected loop"
        return None if got.syncs == want.syncs else "syncs gradients unlike the corrected loop"
    if want.error or got.error:
        return "the corrected program fails" if want.error else "the fixed program fails"
    if got.syncs != want.syncs:
        return "syncs gradients unlike the corrected loop"
    return None if same_training(got, want) else "trains unlike the corrected loop"


def _last(error: str) -> str:
    return error.strip().splitlines()[-1]


def fix_failure(loop: Loop) -> str | None:
    fixable = {code for code, how in fix_safety(loop).items() if how in ("safe", "unsafe")}
    return _fix_failure(loop, loop, unsafe=True, repaired=fixable)


def safe_fix_failure(loop: Loop) -> str | None:
    """Plain --fix trains like the loop with its safely fixable defects repaired."""
    why = _fix_failure(loop, loop, unsafe=False, repaired=safe_fixes(loop))
    return None if why is None else f"--fix: {why}"


def each_safe_fix_failure(loop: Loop) -> str | None:
    """Each safe fix offered is for a safely fixable defect and, alone, repairs only it."""
    safety = fix_safety(loop)
    allowed = {code for code, how in safety.items() if how in ("safe", "optional")}
    offered = safe_fix_codes(render(loop).source)
    if offered - allowed:
        return f"safe fix for {sorted(offered - allowed)}, not safely fixable in the ground truth"
    for code in sorted(offered):
        why = _fix_failure(loop, corrected(loop, {code}), unsafe=False, codes={code})
        if why is not None:
            return f"the safe fix of {code}: {why}"
    return None


def guard_failure(loop: Loop) -> str | None:
    want, got = runtime_codes(loop), run(render(loop).source, with_guard=True).codes
    if got == want:
        return None
    return f"missing {sorted(want - got) or '-'}, unexpected {sorted(got - want) or '-'}"


PROPERTIES = {
    "linter": linter_failure,
    "fix": fix_failure,
    "safe_fix": safe_fix_failure,
    "each_safe_fix": each_safe_fix_failure,
    "guard": guard_failure,
}


def explore(check, examples: int, random_seed: int) -> tuple[int, dict[str, list[Loop]]]:
    failures: dict[str, list[Loop]] = collections.defaultdict(list)
    ran = [0]

    @seed(random_seed)  # a reproducible run for a given --seed
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(loops())
    def probe(loop: Loop) -> None:
        ran[0] += 1
        why = check(loop)
        if why is not None:
            failures[why].append(loop)

    probe()
    return ran[0], failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000, help="per property")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default=",".join(PROPERTIES))
    args = parser.parse_args()
    failed = 0
    for name in args.only.split(","):
        start = time.perf_counter()
        ran, failures = explore(PROPERTIES[name], args.examples, args.seed)
        bad = sum(len(v) for v in failures.values())
        failed += bad
        seconds = time.perf_counter() - start
        print(f"{name}: {ran} examples, {bad} failed ({seconds:.0f} s)")
        for why, found in sorted(failures.items(), key=lambda kv: -len(kv[1])):
            plainest = min(found, key=lambda loop: len(render(loop).source))
            print(f"  {len(found):5d}  {why}\n         e.g. {plainest}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
