"""What `python -m guard SCRIPT [ARGS]` does, importable so tests can run it in a forked child."""

from __future__ import annotations

import glob
import os
import runpy
import sys
import traceback

from guard import _install, _report, _voice

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


def print_error(error: BaseException) -> None:
    """The script's traceback: from its own first frame down to the user's line (the guard's
    launcher frames, runpy's and the checks' are not the user's; ACCEL_GUARD_DEBUG=1 keeps
    them)."""
    tb = error.__traceback__
    if os.environ.get(_voice.DEBUG_ENV, "") in ("", "0"):
        tb = _voice.user_frames_only(tb, _report._is_internal)
    traceback.print_exception(type(error), error, tb, file=sys.stderr)


def _is_first_process() -> bool:
    """Not a child of a guarded process, and rank 0 (or no rank) under torchrun."""
    return not os.environ.get("ACCEL_GUARD_CHILD") and os.environ.get("LOCAL_RANK", "0") == "0"


def run_script(path: str, argv: list[str], module: bool = False) -> None:
    """Install the checks, then run `path` (or module `path` when `module`) as `__main__`.

    Installing first matters: the script's own `from torch.nn.utils import clip_grad_norm_`
    then binds the guarded function.
    """
    if _is_first_process():
        _remove_stale_reports(_report._state.settings.report_path)
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


def _remove_stale_reports(report_paths: str | None) -> None:
    """Every process adds its part at exit (the JSON file) or writes its own page (HTML, per
    rank or child): start without a previous run's."""
    for path in (report_paths or "").split(os.pathsep):
        if not path:
            continue
        stem, ext = os.path.splitext(path)
        others = glob.glob(f"{glob.escape(stem)}.rank*{ext}") + glob.glob(
            f"{glob.escape(stem)}.pid*{ext}"
        )
        for stale in [path, *others] if ext.lower() in (".html", ".htm") else [path]:
            if os.path.exists(stale):
                os.remove(stale)
