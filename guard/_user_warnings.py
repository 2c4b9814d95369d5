"""Warnings that torch points one frame up from a function the guard wraps land on the guard's
wrapper; redirected here, they point at the user's line instead.

A torch module's `warnings` name is replaced (for the guard's lifetime, restored by uninstall)
by a stand-in whose `warn` finds the frame torch meant, steps out of the guard's own frames to
the user's, and warns there with `warn_explicit`: the user's filters and once-per-location
registry apply as usual, and nothing is recorded or re-issued (swapping the filters would reset
every module's registry, so deprecations already shown would show again).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from guard import _patch
from guard._report import _GUARD_DIR, _is_internal


class _AtUserLine:
    """`warnings` as torch's module sees it, but `warn` skips the guard's frames."""

    def __getattr__(self, name: str) -> Any:
        return getattr(warnings, name)

    def warn(self, message, category=None, stacklevel: int = 1, source=None) -> None:
        if isinstance(message, Warning):
            category = message.__class__
        frame = sys._getframe(1)
        for _ in range(max(stacklevel, 1) - 1):
            if frame.f_back is None:
                break
            frame = frame.f_back
        if not frame.f_code.co_filename.startswith(_GUARD_DIR):
            return warnings.warn(message, category, stacklevel + 1, source)
        while frame is not None and _is_internal(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is None:
            return warnings.warn(message, category, stacklevel + 1, source)
        user_globals = frame.f_globals
        warnings.warn_explicit(
            message,
            category or UserWarning,
            frame.f_code.co_filename,
            frame.f_lineno,
            user_globals.get("__name__"),
            user_globals.setdefault("__warningregistry__", {}),
            user_globals,
            source,
        )


def redirect(module: Any) -> None:
    """Make `module`'s warnings skip the guard's frames (once; undone with the other patches)."""
    if isinstance(getattr(module, "warnings", None), _AtUserLine):
        return
    _patch.patch(module, "warnings", _AtUserLine())
