"""Where every guard finding goes: raise, warn, or stay silent, per `ACCEL_GUARD` and `configure()`.

Findings carry a catalogue code and the user's file:line (the first frame outside guard, torch and
accelerate), so a message points at the training script rather than at the guard.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import warnings
from dataclasses import asdict, dataclass, field
from typing import Literal

Level = Literal["error", "warning"]
Mode = Literal["raise", "warn", "off"]

_INTERNAL_PARTS = (
    os.sep + "guard" + os.sep,
    os.sep + "torch" + os.sep,
    os.sep + "accelerate" + os.sep,
    os.sep + "importlib" + os.sep,
    "<frozen ",
    os.sep + "runpy.py",
    os.sep + "contextlib.py",
    os.sep + "functools.py",
)


class GuardError(RuntimeError):
    """Raised for error-level findings in `raise` mode; `.code` is the catalogue code."""

    def __init__(self, code: str, message: str, location: str | None = None):
        self.code = code
        self.location = location
        where = f" ({location})" if location else ""
        super().__init__(f"{code}{where}: {message}")


class GuardWarning(UserWarning):
    """Warning category for warning-level findings (and for everything in `warn` mode)."""


@dataclass
class Finding:
    code: str
    message: str
    level: Level
    location: str | None
    step: int
    count: int = 1


@dataclass
class _Settings:
    mode: Mode = "raise"
    select: tuple[str, ...] = ("ACL",)
    ignore: tuple[str, ...] = ()
    report_path: str | None = None


@dataclass
class _State:
    settings: _Settings = field(default_factory=_Settings)
    findings: dict[tuple[str, str | None], Finding] = field(default_factory=dict)
    step: int = 0


_state = _State()
_lock = threading.Lock()


def _settings_from_env() -> _Settings:
    mode = os.environ.get("ACCEL_GUARD", "raise").strip().lower() or "raise"
    if mode not in ("raise", "warn", "off"):
        warnings.warn(
            f"ACCEL_GUARD={mode!r} is not raise|warn|off; using raise", GuardWarning, stacklevel=2
        )
        mode = "raise"
    return _Settings(mode=mode, report_path=os.environ.get("ACCEL_GUARD_REPORT") or None)


_state.settings = _settings_from_env()


def configure(
    mode: Mode | None = None,
    select: list[str] | tuple[str, ...] | None = None,
    ignore: list[str] | tuple[str, ...] | None = None,
    report_path: str | None = None,
) -> None:
    """Set the mode and the per-code selection (codes or prefixes, like the linter's)."""
    s = _state.settings
    if mode is not None:
        if mode not in ("raise", "warn", "off"):
            raise ValueError(f"mode must be raise, warn or off, not {mode!r}")
        s.mode = mode
    if select is not None:
        s.select = tuple(select)
    if ignore is not None:
        s.ignore = tuple(ignore)
    if report_path is not None:
        s.report_path = report_path


def mode() -> Mode:
    return _state.settings.mode


def enabled(code: str) -> bool:
    """Whether a finding with `code` would be reported at all (cheap; call before costly checks)."""
    s = _state.settings
    if s.mode == "off":
        return False
    selected = max((len(p) for p in s.select if code.startswith(p)), default=-1)
    ignored = max((len(p) for p in s.ignore if code.startswith(p)), default=-1)
    return selected > ignored


def set_step(step: int) -> None:
    """Record the current optimizer-step number, shown in the summary."""
    _state.step = step


def user_location() -> str | None:
    """file:line of the innermost frame that belongs to the user's code."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not any(part in filename for part in _INTERNAL_PARTS):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def report(code: str, message: str, level: Level = "error", location: str | None = None) -> None:
    """Report one finding. Raises `GuardError` for errors in raise mode."""
    if not enabled(code):
        return
    location = location or user_location()
    key = (code, location)
    with _lock:
        seen = _state.findings.get(key)
        if seen is not None:
            seen.count += 1
        else:
            _state.findings[key] = Finding(code, message, level, location, _state.step)
    if _state.settings.mode == "raise" and level == "error":
        raise GuardError(code, message, location)
    if seen is None:
        where = f" ({location})" if location else ""
        warnings.warn(f"{code}{where}: {message}", GuardWarning, stacklevel=2)


def findings() -> list[Finding]:
    """Everything reported so far (one entry per code and location)."""
    with _lock:
        return list(_state.findings.values())


def reset() -> None:
    """Forget all findings (tests use this between cases)."""
    with _lock:
        _state.findings.clear()
        _state.step = 0


def summary_text() -> str:
    rows = findings()
    if not rows:
        return "accel-guard: no findings"
    lines = ["accel-guard summary", f"{'code':<8} {'count':>5} {'step':>6}  location / message"]
    for f in sorted(rows, key=lambda r: (r.code, r.location or "")):
        lines.append(f"{f.code:<8} {f.count:>5} {f.step:>6}  {f.location or '?'}")
        lines.append(f"{'':<22}{f.message}")
    return "\n".join(lines)


def _at_exit() -> None:
    s = _state.settings
    if s.report_path:
        with open(s.report_path, "w", encoding="utf-8") as fh:
            json.dump([asdict(f) for f in findings()], fh, indent=1)
    if s.mode == "warn" and findings():
        print(summary_text(), file=sys.stderr)


atexit.register(_at_exit)
