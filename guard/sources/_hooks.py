"""What every source's wrappers share: is this wrapper installed, is the caller user code."""

from __future__ import annotations

import sys
from typing import Any

from guard import _report


def called_by_user() -> bool:
    """Whether the function calling a wrapper (the wrapper calls this) is the user's code, not
    torch's, Accelerate's or the guard's."""
    return not _report._is_internal(sys._getframe(2).f_code.co_filename)


def installed(owner: Any, attribute: str) -> bool:
    return hasattr(getattr(owner, attribute, None), "__guard_original__")
