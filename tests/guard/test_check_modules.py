"""Each guard check module is named like its rule (`rules/aclNNN_<name>.py`, as in
`linter/checks/`), so a code's runtime check is found where its static check and its record are."""

from __future__ import annotations

import torch  # noqa: F401  (before guard's modules: importing torch installs the guard)

from guard import checks
from rules import MODULE_NAMES

RULE_MODULES = {f"ACL{name[3:6]}": name for name in MODULE_NAMES}


def test_a_check_module_is_named_after_the_rule_of_its_first_code():
    for module in checks.check_modules():
        name = module.__name__.rpartition(".")[2]
        if not module.CODES:  # the run report's recorder, installed with the checks
            assert name == "run_report_series"
            continue
        rule = RULE_MODULES[module.CODES[0]]
        # a second module for the same code names what it covers after the rule's name
        assert name == rule or name.startswith(f"{rule}_"), (name, rule)


def test_every_code_a_check_reports_has_a_rule():
    assert checks.runtime_codes() <= set(RULE_MODULES)
