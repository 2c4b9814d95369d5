"""Rule docs that run (Fixit's VALID/INVALID): what `--explain` shows must be what the linter does.

For every rule with a static check: the `## Example` fires that rule and nothing else, the
`## Use instead` lints clean, and where the rule has an autofix, fixing the Example gives the
Use instead. A user who pastes the Example and gets "All checks passed!" stops trusting the docs.
"""

from __future__ import annotations

import ast
import re

import pytest

import rules
from linter.analysis import analyze_source
from linter.fixer import fix_text

STATIC = sorted(code for code, rule in rules.ALL_RULES.items() if rule.static)
FIXABLE = [code for code in STATIC if rules.get_rule(code).fix != "none"]

# Rules whose fix does not write the Use instead, with the statement the fix must write instead.
# ACL201: the fix swaps the user region for `accelerator.autocast()` (the engine's dtype), while
# the docs show the region removed, which is what gives an fp32 loss; both lint clean.
FIX_WRITES_OTHERWISE = {"ACL201": "with accelerator.autocast():"}


def snippet(code: str, heading: str) -> str:
    """The one python block under `heading` in the rule's docs (as `--explain` prints it)."""
    docs = rules.get_rule(code).docs
    body = docs.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    block = re.fullmatch(r"```python\n(.*?)```\n*", body, re.DOTALL)
    assert block, f"{code} {heading}: expected exactly one python block"
    return block[1]


def lint(source: str, codes=STATIC) -> list[tuple[str, str, int]]:
    """(code, severity, line) of every finding, with every static rule selected."""
    return [
        (d.code, d.severity or rules.get_rule(d.code).severity, d.start.line)
        for d in analyze_source(source, "example.py", codes)
    ]


def same_program(a: str, b: str) -> bool:
    """Equal up to comments, blank lines and `;` versus newlines: the same syntax tree."""
    return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))


@pytest.mark.parametrize("code", STATIC)
def test_example_fires_its_own_rule_and_no_other(code):
    findings = lint(snippet(code, "## Example"))
    # The main finding, not a hint: hints are off by default, so a hint-only Example shows nothing.
    assert [f for f in findings if f[0] == code and f[1] != "info"], findings
    assert [f for f in findings if f[0] != code] == []


@pytest.mark.parametrize("code", STATIC)
def test_use_instead_is_clean(code):
    assert lint(snippet(code, "## Use instead")) == []


@pytest.mark.parametrize("code", FIXABLE)
def test_fixing_the_example_gives_the_use_instead(code):
    unsafe = rules.get_rule(code).fix == "unsafe"
    analyse = lambda text: analyze_source(text, "example.py", [code])  # noqa: E731
    outcome = fix_text(snippet(code, "## Example"), analyse, unsafe)
    assert outcome.error is None
    assert fix_text(outcome.text, analyse, unsafe).text == outcome.text
    if code in FIX_WRITES_OTHERWISE:
        assert lint(outcome.text) == []
        assert FIX_WRITES_OTHERWISE[code] in outcome.text
    else:
        assert same_program(outcome.text, snippet(code, "## Use instead")), outcome.text


def test_the_snippet_reader_finds_the_examples():
    """Guards the parametrisation: a rule list or heading that matched nothing would pass."""
    assert len(STATIC) >= 35 and {"ACL101", "ACL505"} <= set(FIXABLE)
    assert "loss.backward()" in snippet("ACL101", "## Example")
    assert "accelerator.backward(loss)" in snippet("ACL101", "## Use instead")
