"""`rules.MODULE_NAMES` is a hand-kept list (cheaper than a pkgutil scan at start-up)."""

from __future__ import annotations

from pathlib import Path

import rules


def test_module_names_match_the_rule_files_on_disk():
    package = Path(rules.__file__).parent
    on_disk = sorted(p.stem for p in package.glob("acl*.py"))
    assert list(rules.MODULE_NAMES) == on_disk


def test_every_listed_module_is_registered_under_its_own_code():
    for name in rules.MODULE_NAMES:
        module = rules.rule_module(name[:6].upper())
        assert module.__name__ == f"rules.{name}"
