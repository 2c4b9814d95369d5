"""Static checks, one module per code, beside their guard twins (`guard/checks/aclNNN_*.py`).

`linter/checks/aclNNN_name.py` holds `check(ctx)` for the rule whose record and docs live in
`rules/aclNNN_name.py` (same module name). Checks import libcst and the model at the top level;
the records in `rules/` must not, so the guard can read the catalogue without them. Modules whose
names start with `_` hold edits that several checks share.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache


@cache
def check_for(module_name: str) -> Callable | None:
    """The static `check(ctx)` of a rule module (`acl101_raw_backward`), or None for a
    runtime-only code."""
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{module_name}":
            raise
        return None
    return module.check
