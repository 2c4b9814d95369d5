"""What `python -m guard SCRIPT [ARGS]` does, importable so tests can run it in a forked child."""

from __future__ import annotations

import os
import runpy
import sys

from guard import _install, _report

_CHILD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def export_to_children() -> None:
    """Make Python child processes (torchrun workers, spawn) install the guard themselves."""
    import site

    # A source checkout must be importable in the children; an installed guard already is (and
    # putting site-packages ahead of the standard library could shadow it).
    installed = _ROOT in [*site.getsitepackages(), site.getusersitepackages()]
    own = [_CHILD_DIR] if installed else [_CHILD_DIR, _ROOT]
    parts = own + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    os.environ["ACCEL_GUARD"] = _report.mode()


def _is_first_process() -> bool:
    """Not a child of a guarded process, and rank 0 (or no rank) under torchrun."""
    return not os.environ.get("ACCEL_GUARD_CHILD") and os.environ.get("LOCAL_RANK", "0") == "0"


def run_script(path: str, argv: list[str], module: bool = False) -> None:
    """Install the checks, then run `path` (or module `path` when `module`) as `__main__`.

    Installing first matters: the script's own `from torch.nn.utils import clip_grad_norm_`
    then binds the guarded function.
    """
    report_path = _report._state.settings.report_path
    if report_path and os.path.exists(report_path) and _is_first_process():
        os.remove(report_path)  # every process adds its findings at exit: start empty
    if _install.mode_allows():
        import torch  # noqa: F401  (triggers the install registered by `import guard`)

        _install.install()
        export_to_children()
        os.environ["ACCEL_GUARD_CHILD"] = "1"
    if module:
        sys.argv = [path, *argv]
        runpy.run_module(path, run_name="__main__", alter_sys=True)
        return
    sys.argv = [path, *argv]
    script_dir = os.path.dirname(os.path.abspath(path))
    if sys.path and sys.path[0] in ("", os.getcwd(), _ROOT):
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    runpy.run_path(path, run_name="__main__")
