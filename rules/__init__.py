"""The catalogue: one module per code (`rules/acl101_raw_backward.py` ...).

`ALL_RULES` maps a code to its `Rule`. Importing this package never imports libcst or torch;
a rule module's static `check(ctx)` imports what it needs lazily.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from rules._base import Rule

__all__ = ["ALL_RULES", "Rule", "rule_module", "get_rule"]


def _discover() -> dict[str, ModuleType]:
    modules: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("acl"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        modules[module.RULE.code] = module
    return modules


_MODULES = _discover()
ALL_RULES: dict[str, Rule] = {code: m.RULE for code, m in _MODULES.items()}


def rule_module(code: str) -> ModuleType:
    """The module that holds `code`'s metadata and (if any) its static `check`."""
    return _MODULES[code]


def get_rule(code: str) -> Rule:
    return ALL_RULES[code]
