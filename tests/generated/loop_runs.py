"""Lint, fix and run generated programs in this process (no subprocess per example).

A program runs as `__main__` from a real file (so tracebacks and the guard's file:line point at
it), one thread, its own seeds; Accelerate's process-wide state is reset first. Under the guard it
runs in warn mode, and the end-of-run checks fire as they would at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import sys
import tempfile
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.append(str(_ROOT))

import linter.analysis  # noqa: E402
from linter import fixer  # noqa: E402
from rules import ALL_RULES  # noqa: E402

STATIC_CODES = sorted(code for code, rule in ALL_RULES.items() if rule.static)
_WORKDIR = Path(tempfile.mkdtemp(prefix="accel-generated-"))
atexit.register(shutil.rmtree, _WORKDIR, ignore_errors=True)


def lint(source: str, name: str = "train.py") -> set[tuple[str, int]]:
    found = linter.analysis.analyze_source(source, name, STATIC_CODES)
    return {(d.code, d.start.line) for d in found}


def fix(source: str, name: str = "train.py") -> fixer.FixOutcome:
    """What `accel-lint --fix --unsafe-fixes` computes for the file (no noqa in these files)."""

    def analyse(text: str):
        return linter.analysis.analyze_source(text, name, STATIC_CODES)

    return fixer.fix_text(source, analyse, unsafe=True)


@dataclass
class Outcome:
    params: dict[str, torch.Tensor] | None
    error: str | None
    findings: list = field(default_factory=list)

    @property
    def codes(self) -> set[str]:
        return {f.code for f in self.findings}


def run(source: str, with_guard: bool = False, name: str = "train.py") -> Outcome:
    path = _WORKDIR / name
    path.write_text(source, encoding="utf-8")
    out = _WORKDIR / (name + ".params.pt")
    out.unlink(missing_ok=True)
    _reset_accelerate()
    torch.set_num_threads(1)
    with _environ(ACCEL_FIXTURE_OUT=str(out)), _quiet(), _guard_as_it_was():
        if with_guard:
            error, findings = _run_guarded(path)
        else:
            error, findings = _run_plain(path), []
    _reset_accelerate()  # leave no Accelerator state to the tests that follow
    params = torch.load(out) if out.exists() else None
    return Outcome(params, error, findings)


def _run_plain(path: Path) -> str | None:
    """Without the guard: an engine program's `import guard` must not install it."""
    import guard
    from guard import _report

    guard.uninstall()
    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode="off")
    try:
        return _exec(path)
    finally:
        _report._state.settings = saved


def _run_guarded(path: Path) -> tuple[str | None, list]:
    import guard
    from guard import _report, _tracker

    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode="warn")
    guard.uninstall()  # a fresh tracker: nothing remembered from earlier programs
    guard.install()
    guard.reset()
    try:
        error = _exec(path)
        if _tracker.TRACKER.active:
            _tracker.TRACKER.emit("finish")  # what the exit hook does in `python -m guard`
        return error, guard.findings()
    finally:
        guard.uninstall()
        guard.reset()
        _report._state.settings = saved


def _exec(path: Path) -> str | None:
    code = compile(path.read_text(encoding="utf-8"), str(path), "exec")
    try:
        exec(code, {"__name__": "__main__", "__file__": str(path), "__builtins__": __builtins__})
    except Exception:  # the program's failure is data (a bad loop may crash)
        return traceback.format_exc()
    return None


def _reset_accelerate() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@contextlib.contextmanager
def _guard_as_it_was():
    """Other tests in this process may expect the guard installed (as `import guard` leaves it)."""
    import guard

    was = guard.installed()
    try:
        yield
    finally:
        if was:
            guard.install()


@contextlib.contextmanager
def _environ(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
