"""Turn the runtime checks on and off, process-wide.

`install()` patches torch once through the tracker, loads every check module under
`guard/checks/`, and arranges for accelerate to be patched whenever it is imported (before or
after the guard). `uninstall()` undoes all of it, so torch behaves exactly as before.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType

from guard import _patch, _report

_installed = False
_lock = threading.RLock()
_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that runs callbacks right after a watched module finishes executing."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):  # noqa: D401 (importlib protocol)
        if fullname not in _callbacks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader)
        return spec


class _NotifyingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then fires the module's `when_imported` callbacks."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _fire(module.__name__)

    def __getattr__(self, name):  # e.g. get_source / is_package, used by tracebacks and runpy
        return getattr(self._loader, name)


_finder = _PostImportFinder()


def _fire(name: str) -> None:
    module = sys.modules.get(name)
    if module is None:
        return
    for callback in _callbacks.pop(name, []):
        callback(module)


def when_imported(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` now if `module_name` is imported, else right after its import."""
    with _lock:
        module = sys.modules.get(module_name)
        if module is not None and not _is_initialising(module):
            callback(module)
            return
        _callbacks.setdefault(module_name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def _is_initialising(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(spec is not None and getattr(spec, "_initializing", False))


def mode_allows() -> bool:
    """False when ACCEL_GUARD=off (or `configure(mode="off")`): nothing is patched then."""
    return _report.mode() != "off"


def installed() -> bool:
    return _installed


def install() -> bool:
    """Install every runtime check (idempotent). Returns False when ACCEL_GUARD=off."""
    global _installed
    with _lock:
        if _installed:
            return True
        if not mode_allows():
            return False
        from guard import _run_settings, _tracker, checks

        _run_settings.install()  # the command line's settings, for messages and the report
        _tracker.TRACKER.install()
        _tracker.TRACKER.rebind_imported_clips([sys.modules.get("__main__")])
        checks.install_all(_tracker.TRACKER)
        when_imported("accelerate", _patch_accelerate)
        _installed = True
        return True


def _start_recording() -> None:
    """A report asked for after the install: start its recorder now (once per install)."""
    tracker = sys.modules.get("guard._tracker")
    if not _report._state.settings.report_path or tracker is None or not tracker.TRACKER.active:
        return  # the install will start it
    from guard.run_report import recorder

    if not recorder.installed_on(tracker.TRACKER):
        recorder.install(tracker.TRACKER)


def _write_report(path: str) -> None:
    from guard import run_report

    run_report.write(path)


_report.set_run_report(_start_recording, _write_report)  # the run report sits above _report


def _patch_accelerate(_module: ModuleType) -> None:
    from guard import _accelerate, _tracker

    if _installed or _tracker.TRACKER.active:
        _accelerate.install(_tracker.TRACKER)


def uninstall() -> None:
    """Remove every patch, hook and subscription; torch and accelerate are as before install."""
    global _installed
    with _lock:
        from guard import _tracker

        _tracker.TRACKER.uninstall()
        _patch.restore_all()
        _callbacks.clear()
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _installed = False
