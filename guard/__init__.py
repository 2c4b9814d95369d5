"""accel-guard: a correct training engine plus runtime checks for the accel-lint catalogue.

`import guard` installs the checks process-wide (unless ACCEL_GUARD=off); `guard.uninstall()`
removes them. `guard.Engine` is the training engine with Accelerate's method names.
"""

from guard import _install
from guard._install import install, installed, uninstall
from guard._report import GuardError, GuardWarning, configure, findings, reset, summary_text

__all__ = [
    "GuardError",
    "GuardWarning",
    "configure",
    "findings",
    "install",
    "installed",
    "reset",
    "summary_text",
    "uninstall",
]

# Install as soon as torch is importable here: now if it is already imported, else right after
# the script imports it, so `import guard` itself stays cheap.
if _install.mode_allows():
    _install.when_imported("torch", lambda _torch: _install.install())


def __getattr__(name: str):  # lazy: the engine imports torch, `import guard` must stay cheap
    if name == "Engine":
        from guard.engine import Engine

        return Engine
    if name == "FSDP2Plugin":
        from guard._fsdp2 import FSDP2Plugin

        return FSDP2Plugin
    raise AttributeError(f"module 'guard' has no attribute {name!r}")
