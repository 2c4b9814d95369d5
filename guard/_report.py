"""Where every guard finding goes: raise, warn, or stay silent, per `ACCEL_GUARD` and `configure()`.

Findings carry a catalogue code and the user's file:line (the first frame outside guard, torch and
accelerate), so a message points at the training script rather than at the guard; how they read
(and where a `GuardError`'s traceback ends) is `guard._voice`'s business, the run report's
(`ACCEL_GUARD_REPORT=run.json` or `run.html`) `guard.run_report`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from guard import _voice

Level = Literal["error", "warning"]
Mode = Literal["raise", "warn", "off"]

_INTERNAL_PARTS = (
    "<frozen ",
    os.sep + "runpy.py",
    os.sep + "contextlib.py",
    os.sep + "functools.py",
    os.sep + "importlib" + os.sep,
)
_GUARD_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIBRARY_NAMES = ("torch", "accelerate")
_internal_dirs: list[str] = [_GUARD_DIR]
_internal_files: dict[str, bool] = {}  # filename -> _is_internal, until _internal_dirs grows


def _is_internal(filename: str) -> bool:
    """Frames of the guard, torch, accelerate and the stdlib plumbing are not the user's.

    Remembered per file: user_location() walks a few frames on hot paths (ACL301 once per
    accumulation window, autocast regions on every entry)."""
    known = _internal_files.get(filename)
    if known is None:
        if len(_internal_dirs) < 1 + len(_LIBRARY_NAMES):
            _refresh_internal_dirs()
        known = filename.startswith(tuple(_internal_dirs)) or any(
            p in filename for p in _INTERNAL_PARTS
        )
        _internal_files[filename] = known
    return known


def _refresh_internal_dirs() -> None:
    for name in _LIBRARY_NAMES:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            directory = os.path.dirname(os.path.abspath(path)) + os.sep
            if directory not in _internal_dirs:
                _internal_dirs.append(directory)
                _internal_files.clear()  # a file judged before may lie in the new directory


# Training frameworks whose loops the user configures but does not write. A finding raised from
# their code is about how the framework wrote its loop (Lightning's manual_backward inside its own
# autocast, the HF Trainer's short last batch), which the user cannot act on: it is not reported.
# The codes in RUN_CODES are about the run or its configuration (fp16 asked for on a CPU, a NaN
# loss, a schedule sized for another length): those are reported, once, at the user's own frame
# (the `Trainer(...)` or `trainer.train()` / `trainer.fit()` line).
_FRAMEWORK_NAMES = ("transformers", "lightning", "pytorch_lightning", "lightning_fabric")
RUN_CODES = frozenset(("ACL105", "ACL106", "ACL107", "ACL310", "ACL601", "ACL602", "ACL603"))
_framework_files: dict[str, bool] = {}


def _framework_dirs() -> tuple[str, ...]:
    dirs = []
    for name in _FRAMEWORK_NAMES:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def _is_framework(filename: str) -> bool:
    known = _framework_files.get(filename)
    if known is None:
        known = _framework_files[filename] = filename.startswith(_framework_dirs())
    return known


def _in_framework(location: str | None) -> bool:
    filename = (location or "").rpartition(":")[0]
    return bool(filename) and _is_framework(filename)


def _beyond_frameworks_frame() -> Any:
    """The innermost frame that is neither internal nor a framework's (None if none)."""
    frame = sys._getframe(1)
    while frame is not None and (
        _is_internal(frame.f_code.co_filename) or _is_framework(frame.f_code.co_filename)
    ):
        frame = frame.f_back
    return frame


def _beyond_frameworks() -> str | None:
    """file:line of the innermost frame that is neither internal nor a framework's."""
    frame = _beyond_frameworks_frame()
    return None if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


class GuardError(RuntimeError):
    """Raised for error-level findings in `raise` mode; `.code` is the catalogue code.

    Reads like the linter: `train.py:29: ACL305 <what is wrong>`, then `help: <the fix>
    (accel-lint --explain ACL305)`; `.message` is the finding's message, `.location` its
    `file:line`. Its traceback ends at the user's frame (ACCEL_GUARD_DEBUG=1 keeps the guard's)."""

    def __init__(self, code: str, message: str, location: str | None = None):
        super().__init__(code, message, location)  # args: so a pickled error rebuilds
        self.code = code
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return _voice.error_text(self.code, self.message, self.location)


GuardError.__module__ = "guard"  # tracebacks print `guard.GuardError`, the public name


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
    options: dict[str, float] = field(default_factory=dict)


@dataclass
class _State:
    settings: _Settings = field(default_factory=_Settings)
    findings: dict[tuple[str, str | None], Finding] = field(default_factory=dict)
    step: int = 0
    location: str | None = None  # set by `at_step` while deferred values are judged


_state = _State()
_lock = threading.Lock()
# Not a child of a guarded process: read at `import guard`, before `python -m guard` marks the
# environment for the processes the script starts (the run report names their pages apart).
FIRST_PROCESS = not os.environ.get("ACCEL_GUARD_CHILD")


def _settings_from_env() -> _Settings:
    mode = os.environ.get("ACCEL_GUARD", "raise").strip().lower() or "raise"
    if mode not in ("raise", "warn", "off"):
        warnings.warn(
            f"ACCEL_GUARD={mode!r} is not raise|warn|off; using raise", GuardWarning, stacklevel=2
        )
        mode = "raise"
    return _Settings(mode=mode, report_path=_writable(os.environ.get("ACCEL_GUARD_REPORT")))


def _writable(report_paths: str | None) -> str | None:
    """The report paths whose folder exists or can be made now, when the guard starts: a path
    that cannot be written is said at once, not found out at exit (when the run is over)."""
    kept = []
    for path in (report_paths or "").split(os.pathsep):
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            _say_unwritable(path, f"cannot create its folder {folder}: {exc.strerror or exc}")
            continue
        if not os.access(folder, os.W_OK):
            _say_unwritable(path, f"its folder {folder} is not writable")
            continue
        kept.append(path)
    return os.pathsep.join(kept) or None


def _say_unwritable(path: str, reason: str) -> None:
    sys.stderr.write(f"accel-guard: no run report will be written to {path}: {reason}\n")


_state.settings = _settings_from_env()


def configure(
    mode: Mode | None = None,
    select: list[str] | tuple[str, ...] | None = None,
    ignore: list[str] | tuple[str, ...] | None = None,
    report_path: str | None = None,
    **options: float,
) -> None:
    """Set the mode, the per-code selection (codes or prefixes, like the linter's), the run
    report's path(s) (`run.json`, `run.html`; "" for none) and check options such as
    `overflow_streak=25` (see each check's `OPTIONS`)."""
    s = _state.settings
    if mode is not None:
        if mode not in ("raise", "warn", "off"):
            raise ValueError(f"mode must be raise, warn or off, not {mode!r}")
        s.mode = mode
    if select is not None:
        s.select = tuple(select)
    if ignore is not None:
        s.ignore = tuple(ignore)
    if report_path is not None:  # "" turns the report off again
        s.report_path = _writable(report_path)
        _start_recording()
    s.options.update(options)


# The run report reads this module's findings and settings, so this module reaches it through
# hooks that guard._install sets when it is imported (with the package): the recorder's start
# when a report is asked for after the install, and the writer at exit.
_run_report: dict[str, Callable[..., None]] = {}


def set_run_report(start: Callable[[], None], write: Callable[[str], None]) -> None:
    _run_report.update(start=start, write=write)


def _start_recording() -> None:
    """A report asked for after the install: start its recorder now (once per install)."""
    start = _run_report.get("start")
    if start is not None:
        start()


def option(name: str, default: float) -> float:
    """A check option set with `configure(name=...)` or ACCEL_GUARD_<NAME>, else `default`."""
    if name in _state.settings.options:
        return _state.settings.options[name]
    env = os.environ.get(f"ACCEL_GUARD_{name.upper()}")
    return type(default)(env) if env else default


def mode() -> Mode:
    return _state.settings.mode


def report_path() -> str | None:
    """Where the run report goes at exit (None: no report, nothing recorded)."""
    return _state.settings.report_path


def enabled(code: str) -> bool:
    """Whether a finding with `code` would be reported at all (cheap; call before costly checks)."""
    s = _state.settings
    if s.mode == "off":
        return False
    return _longest_prefix(code, s.select) > _longest_prefix(code, s.ignore)


def _longest_prefix(code: str, prefixes: tuple[str, ...]) -> int:
    """Length of the longest of `prefixes` that `code` starts with, -1 if none (a plain loop:
    `enabled` runs every micro-step, where a generator's frames cost more than the test)."""
    longest = -1
    for prefix in prefixes:
        if len(prefix) > longest and code.startswith(prefix):
            longest = len(prefix)
    return longest


def set_step(step: int) -> None:
    """Record the current optimizer-step number, shown in the summary."""
    _state.step = step


def current_step() -> int:
    return _state.step


@contextlib.contextmanager
def at_step(step: int, location: str | None = None) -> Iterator[None]:
    """Findings reported inside name `step` and, by default, `location`: a value read later
    than it was taken names the step and the user's line it was taken at."""
    saved = _state.step, _state.location
    _state.step, _state.location = step, location
    try:
        yield
    finally:
        _state.step, _state.location = saved


def user_frame() -> Any:
    """The innermost frame that belongs to the user's code (None if there is none)."""
    frame = sys._getframe(1)
    while frame is not None and _is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_location() -> str | None:
    """file:line of the innermost frame that belongs to the user's code."""
    frame = user_frame()
    return None if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def report(code: str, message: str, level: Level = "error", location: str | None = None) -> None:
    """Report one finding. Raises `GuardError` for errors in raise mode."""
    if not enabled(code):
        return
    location = location or _state.location or user_location()
    if _in_framework(location):
        if code not in RUN_CODES:
            return  # the framework's own loop: nothing the user can change
        location = _beyond_frameworks() or location
    settings = sys.modules.get("guard._run_settings")
    if settings is not None:
        message = settings.with_cause(code, message)  # "this run sets --k 4 (default 1)"
    key = (code, location)
    with _lock:
        seen = _state.findings.get(key)
        if seen is not None:
            seen.count += 1
        else:
            _state.findings[key] = Finding(code, message, level, location, _state.step)
    for observer in _observers:
        observer(code, location, seen is None)
    if _state.settings.mode == "raise" and level == "error":
        error = GuardError(code, message, location)
        _voice.end_traceback_at(_beyond_frameworks_frame(), error)
        raise error
    if seen is None:
        _warn_at(f"{code}: {message}", location)


_observers: list = []  # fn(code, location, first) on every finding: the run report's markers


def observe(fn) -> None:
    """Call `fn(code, location, first)` on every finding reported (before it raises)."""
    if fn not in _observers:
        _observers.append(fn)


def note(code: str, message: str) -> None:
    """Tell something worth knowing about a correct loop (printed to stderr, never a finding)."""
    if enabled(code):
        print(f"accel-guard note: {code}: {message}", file=sys.stderr)


def _warn_at(text: str, location: str | None) -> None:
    """Show the warning at the user's line, not at the guard's, as `path:line: CODE message`."""
    _voice.use_finding_format(GuardWarning)
    filename, _, line = (location or "").rpartition(":")
    if filename and line.isdigit():
        warnings.warn_explicit(text, GuardWarning, filename, int(line), module="accel-guard")
    else:
        warnings.warn(text, GuardWarning, stacklevel=3)


def findings() -> list[Finding]:
    """Everything reported so far (one entry per code and location)."""
    with _lock:
        return list(_state.findings.values())


def reset() -> None:
    """Forget all findings and the run report's series (tests use this between cases)."""
    with _lock:
        _state.findings.clear()
        _state.step = 0
    recording = sys.modules.get("guard.run_report.recorder")
    if recording is not None:
        recording.forget()
    settings = sys.modules.get("guard._run_settings")
    if settings is not None:
        settings.reset()


def summary_text() -> str:
    """The warn-mode summary as plain text: per code, then one line per location."""
    return _voice.summary_text(findings())


def finding_rows() -> list[dict]:
    """The findings as JSON-ready dicts (the report's `findings`)."""
    return [asdict(f) for f in findings()]


def write_report(path: str) -> None:
    """Write this process's part of the run report at `path` (see `guard.run_report`)."""
    _run_report["write"](path)


_before_exit: list = []


def before_exit(fn) -> None:
    """Run `fn()` once at exit, before the report is written (end-of-run checks)."""
    _before_exit.append(fn)


def _at_exit() -> None:
    for fn in _before_exit:
        try:
            fn()
        except GuardError:  # an end-of-run error is already recorded as a finding
            pass
    s = _state.settings
    if s.report_path:
        for path in s.report_path.split(os.pathsep):
            if path:
                _write_or_say(path)
    if s.mode == "warn" and findings():
        _voice.print_summary(findings(), sys.stderr)


def _write_or_say(path: str) -> None:
    """A report that cannot be written at exit is said in one line: the summary still comes."""
    try:
        write_report(path)
    except OSError as exc:
        _say_unwritable(path, exc.strerror or str(exc))


atexit.register(_at_exit)
