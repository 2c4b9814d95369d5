"""The rule modules must match the catalogue (CATALOG.md), which is the product spec."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rules

REPO = Path(__file__).parents[2]
CATALOG = REPO.parent / "shared" / "CATALOG.md"
SECTIONS = (
    "## What it does",
    "## Why is this bad?",
    "## Example",
    "## Use instead",
    "## Fix safety",
)
RUNTIME_SECTION = "## At runtime"
HEADING = re.compile(r"^### (ACL\d{3}) ([a-z0-9-]+)\s*$", re.MULTILINE)

needs_catalog = pytest.mark.skipif(
    not CATALOG.is_file(), reason=f"the catalogue is not checked out beside the repo ({CATALOG})"
)


def catalogue_sections() -> dict[str, tuple[str, str]]:
    """code -> (name, the text of its `### ACLnnn name` section)."""
    text = CATALOG.read_text(encoding="utf-8")
    headings = list(HEADING.finditer(text))
    sections = {}
    for heading, following in zip(headings, [*headings[1:], None], strict=True):
        end = following.start() if following else len(text)
        sections[heading[1]] = (heading[2], text[heading.end() : end])
    return sections


def bullet(section: str, label: str) -> str:
    """The text of the `- **<label>...` bullet line, from just after the label."""
    match = re.search(rf"^- \*\*{re.escape(label)}(.*)$", section, re.MULTILINE)
    assert match, f"no '{label}' line"
    return match[1]


def catalogue_fix(section: str) -> str:
    """Fix safety as the Autofix line states it: `(safe):`, `(unsafe):`, `:** none`, ..."""
    line = bullet(section, "Autofix")
    parenthetical = re.match(r" \(([^)]*)\):\*\*", line)
    words = parenthetical[1] if parenthetical else line.removeprefix(":**").strip()
    for prefix, safety in (
        ("safe when", "safe-when-trailing"),
        ("unsafe", "unsafe"),
        ("safe", "safe"),
        ("none", "none"),
    ):
        if words.startswith(prefix):
            return safety
    raise AssertionError(f"unrecognised Autofix line: {line!r}")


def catalogue_runtime(section: str) -> str | None:
    """Runtime coverage where the catalogue states it outright; None where it is a judgement."""
    line = bullet(section, "Runtime signal")
    if "not detectable" in line:
        return "none"
    if re.match(r":\*\* warning only", line):
        return "warning"
    label = re.match(r" \(([a-z]+)[,)]", line)
    if label and label[1] in ("heuristic", "partial"):
        return label[1]
    return None


def module_basename(code: str) -> str:
    return rules.rule_module(code).__name__.rpartition(".")[2]


@pytest.fixture(scope="module")
def catalogue() -> dict[str, tuple[str, str]]:
    return catalogue_sections()


@needs_catalog
def test_every_catalogue_code_has_a_module_and_nothing_else(catalogue):
    assert {"ACL101", "ACL603"} <= set(catalogue)  # the heading regex matches first and last
    assert sorted(rules.ALL_RULES) == sorted(catalogue)


@needs_catalog
def test_names_and_module_names_follow_the_catalogue(catalogue):
    for code, (name, _) in catalogue.items():
        rule = rules.get_rule(code)
        assert rule.name == name, code
        assert module_basename(code) == f"acl{code[3:]}_{name.replace('-', '_')}"


@needs_catalog
def test_fix_safety_matches_the_autofix_line(catalogue):
    mismatches = {
        code: (rules.get_rule(code).fix, catalogue_fix(section))
        for code, (_, section) in catalogue.items()
        if rules.get_rule(code).fix != catalogue_fix(section)
    }
    assert mismatches == {}


@needs_catalog
def test_runtime_coverage_matches_where_the_catalogue_states_it(catalogue):
    stated = {code: catalogue_runtime(section) for code, (_, section) in catalogue.items()}
    assert stated["ACL301"] == "heuristic" and stated["ACL311"] == "none"  # the parser works
    mismatches = {
        code: (rules.get_rule(code).runtime, coverage)
        for code, coverage in stated.items()
        if coverage is not None and rules.get_rule(code).runtime != coverage
    }
    assert mismatches == {}


@needs_catalog
def test_runtime_only_codes_claim_no_static_check(catalogue):
    for code, (_, section) in catalogue.items():
        if bullet(section, "Static signal").startswith(":** none"):
            assert not rules.get_rule(code).static, code


@pytest.mark.parametrize("code", sorted(rules.ALL_RULES))
def test_docs_have_the_ruff_sections_in_order(code):
    rule = rules.get_rule(code)
    headings = [line for line in rule.docs.splitlines() if line.startswith("## ")]
    expected = list(SECTIONS)
    if rule.runtime != "none":
        expected.append(RUNTIME_SECTION)
    assert headings == expected


@pytest.mark.parametrize("code", sorted(rules.ALL_RULES))
def test_example_and_fix_snippets_are_valid_python(code):
    docs = rules.get_rule(code).docs
    for heading in ("## Example", "## Use instead"):
        body = docs.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
        snippet = re.fullmatch(r"```python\n(.*?)```\n*", body, re.DOTALL)
        assert snippet, f"{code} {heading}: expected exactly one python block"
        ast.parse(snippet[1])


@pytest.mark.parametrize("code", sorted(rules.ALL_RULES))
def test_summary_is_one_short_line(code):
    summary = rules.get_rule(code).summary
    assert "\n" not in summary and 0 < len(summary) <= 100


def test_importing_rules_loads_neither_libcst_nor_torch():
    probe = "import sys, rules; print(sorted({'libcst', 'torch'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
