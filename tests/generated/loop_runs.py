"""Lint, fix and run generated programs in this process (no subprocess per example).

A program runs as `__main__` from a real file (so tracebacks and the guard's file:line point at
it), one thread, its own seeds; Accelerate's process-wide state is reset first. Under the guard it
runs in warn mode, and the end-of-run checks fire as they would at exit. A DDP program gets
torchrun's environment for one gloo rank, and its run records, at every backward, whether the
DDP model would sync the gradients (`syncs`): with one rank the parameters cannot show it.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import os
import shutil
import socket
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


def fix(
    source: str, name: str = "train.py", unsafe: bool = True, codes: set[str] | None = None
) -> fixer.FixOutcome:
    """What `accel-lint --fix --unsafe-fixes` computes for the file (no noqa in these files);
    `unsafe=False` is plain `--fix`; `codes` limits it to those codes' findings (`--select`)."""

    def analyse(text: str):
        found = linter.analysis.analyze_source(text, name, STATIC_CODES)
        return found if codes is None else [d for d in found if d.code in codes]

    return fixer.fix_text(source, analyse, unsafe=unsafe)


def safe_fix_codes(source: str, name: str = "train.py") -> set[str]:
    """The codes of the findings whose fix plain `--fix` would apply."""
    found = linter.analysis.analyze_source(source, name, STATIC_CODES)
    return {d.code for d in found if fixer.applicable(d, unsafe=False)}


@dataclass
class Outcome:
    params: dict[str, torch.Tensor] | None
    error: str | None
    findings: list = field(default_factory=list)
    syncs: list[tuple[bool, ...]] = field(default_factory=list)  # per backward, per DDP model

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
    rank = _one_rank() if "init_process_group" in source else {}
    with _environ(ACCEL_FIXTURE_OUT=str(out), **rank), _quiet(), _guard_as_it_was():
        with _process_group_ended():
            if with_guard:
                error, findings, syncs = _run_guarded(path)
            else:
                (error, syncs), findings = _run_plain(path), []
    _reset_accelerate()  # leave no Accelerator state to the tests that follow
    params = torch.load(out) if out.exists() else None
    return Outcome(params, error, findings, syncs)


def _one_rank() -> dict[str, str]:
    """torchrun's variables for a world of one, on a port free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")


@contextlib.contextmanager
def _process_group_ended():
    """A program that failed before `destroy_process_group` leaves none to the next one.

    The program's own `destroy_process_group()` is deferred until its DDP models are gone:
    destroying a gloo group while a DDP reducer still holds it leaves the reducer to destroy
    it later, and that destructor joins gloo's threads while holding the GIL, which hung a
    test worker for good (seen twice on the 2-core machine)."""
    import torch.distributed as dist

    destroy = dist.destroy_process_group
    dist.destroy_process_group = lambda *args, **kwargs: None
    try:
        yield
    finally:
        dist.destroy_process_group = destroy
        gc.collect()  # the program's models and their reducers, while the group still exists
        if dist.is_available() and dist.is_initialized():
            destroy()


@contextlib.contextmanager
def _sync_trace():
    """Record `require_backward_grad_sync` of every DDP model at each `torch.autograd.backward`
    (which `Tensor.backward` calls): what `no_sync()` around a backward means. torch's C++
    reducer reads the flag at the forward, but FSDP's `no_sync`, DDP's Python reducer (compiled
    autograd) and other engines read it during the backward, so a fix that changes it for any
    backward changes what the program computes on several ranks."""
    from torch.nn.parallel import DistributedDataParallel

    models: list = []
    syncs: list[tuple[bool, ...]] = []
    init, backward = DistributedDataParallel.__init__, torch.autograd.backward

    def tracked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        models.append(self)

    def traced_backward(*args, **kwargs):
        syncs.append(tuple(bool(m.require_backward_grad_sync) for m in models))
        return backward(*args, **kwargs)

    DistributedDataParallel.__init__, torch.autograd.backward = tracked_init, traced_backward
    try:
        yield syncs
    finally:
        DistributedDataParallel.__init__, torch.autograd.backward = init, backward


def _run_plain(path: Path) -> tuple[str | None, list]:
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


def _run_guarded(path: Path) -> tuple[str | None, list, list]:
    import guard
    from guard import _report, _tracker

    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode="warn")
    guard.uninstall()  # a fresh tracker: nothing remembered from earlier programs
    guard.install()
    guard.reset()
    try:
        error, syncs = _exec(path)
        if _tracker.TRACKER.active:
            _tracker.TRACKER.emit("finish")  # what the exit hook does in `python -m guard`
        return error, guard.findings(), syncs
    finally:
        guard.uninstall()
        guard.reset()
        _report._state.settings = saved


def _exec(path: Path) -> tuple[str | None, list]:
    """The program's failure (a bad loop may crash) and its gradient syncs."""
    code = compile(path.read_text(encoding="utf-8"), str(path), "exec")
    scope = {"__name__": "__main__", "__file__": str(path), "__builtins__": __builtins__}
    with _sync_trace() as syncs:  # inside the guard's wrappers, which (un)install their own
        try:
            exec(code, scope)
        except Exception:
            return traceback.format_exc(), syncs
    return None, syncs


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


def same_training(a: Outcome, b: Outcome) -> bool:
    """Bitwise the same parameters, and the same gradient syncs: the fixes move no arithmetic
    (they insert or move whole statements that compute the same values in the same order), so
    nothing but equality is expected."""
    return same_params(a.params, b.params) and a.syncs == b.syncs
