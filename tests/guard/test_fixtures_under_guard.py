"""The cross-check: every runnable fixture, run under `python -m guard` in warn mode.

A bad fixture must report each code in its `# guard-expect:` header; a good fixture must report
nothing. A bad fixture of a code that has a runtime signal but no `guard-expect` header fails,
so a new fixture cannot silently escape the guard.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
# fixturelib lives in tests/, next to a folder named guard/; with the repository root on sys.path
# too, the real `guard` package (a regular package) still wins over that namespace folder.
sys.path.insert(0, str(TESTS))
if str(TESTS.parent) not in sys.path:
    sys.path.append(str(TESTS.parent))
from fixturelib import fixture_scripts, read_expectations, run_fixture  # noqa: E402

from rules import ALL_RULES  # noqa: E402

# Every catalogue section with a "Runtime signal" (issue #4 lists all but ACL203, covered too).
RUNTIME_CODES = frozenset(
    "ACL101 ACL102 ACL103 ACL104 ACL105 ACL106 ACL107 ACL108 ACL201 ACL202 ACL203 ACL204 ACL301 "
    "ACL302 ACL303 ACL304 ACL305 ACL306 ACL307 ACL308 ACL309 ACL310 ACL312 ACL401 ACL403 "
    "ACL404 ACL405 ACL502 ACL505 ACL601 ACL602 ACL603".split()
)

SCRIPTS = fixture_scripts()


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _summary(findings: list[dict]) -> str:
    return "\n".join(f"  {f['code']} at {f['location']}: {f['message']}" for f in findings)


@pytest.mark.parametrize("script", SCRIPTS, ids=[_id(p) for p in SCRIPTS])
def test_fixture_under_guard(script: Path) -> None:
    expected = set(read_expectations(script).guard)
    code = script.parent.name
    if script.name.startswith("bad_") and code in RUNTIME_CODES and not expected:
        pytest.fail(
            f"{_id(script)}: {code} has a runtime signal, so this bad fixture needs a "
            f"'# guard-expect: {code}' header (and the guard must report it)"
        )
    result = run_fixture(script, with_guard=True)
    if script.name.startswith("good_"):
        assert result.ok, f"{_id(script)} failed under the guard:\n{result.error}"
        assert not result.findings, f"false alarm on {_id(script)}:\n{_summary(result.findings)}"
        return
    for finding in result.findings:
        allowed = ALL_RULES[finding["code"]].runtime_levels
        assert finding["level"] in allowed, (
            f"{_id(script)}: {finding['code']} reported as {finding['level']}, while the rule "
            f"table (rules/, --explain) says the guard reports it as {' or '.join(allowed)}"
        )
    # A bad fixture may still crash after the guard warned (warn mode lets torch fail as usual).
    missing = expected - {f["code"] for f in result.findings}
    assert not missing, (
        f"{_id(script)}: expected {sorted(missing)} under the guard, got:\n"
        + (_summary(result.findings) or "  nothing")
        + ("" if result.ok else f"\nthe script failed:\n{result.error}")
    )
