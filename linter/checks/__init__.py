"""Static checks, one module per code, beside their guard twins (`guard/checks/aclNNN_*.py`).

`linter/checks/aclNNN_name.py` holds `check(ctx)` for the rule whose record and docs live in
`rules/aclNNN_name.py` (same module name). Checks here may import libcst at the top level; the
records in `rules/` must not, so the guard can read the catalogue without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache


@cache
def check_for(module_name: str) -> Callable | None:
    """The static `check(ctx)` of a rule module: `linter.checks.<name>.check`, else a `check`
    defined beside the record (the older layout), else None."""
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{module_name}":
            raise
        from rules import rule_module_by_name

        return getattr(rule_module_by_name(module_name), "check", None)
    return module.check
