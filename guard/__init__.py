"""accel-guard: a correct training engine plus runtime checks for the accel-lint catalogue.

`import guard` installs the checks process-wide (unless ACCEL_GUARD=off); `guard.uninstall()`
removes them. `guard.Engine` is the training engine with Accelerate's method names.
"""

from guard._report import GuardError, GuardWarning, configure, findings, reset

__all__ = ["GuardError", "GuardWarning", "configure", "findings", "reset"]


def __getattr__(name: str):  # lazy: the engine imports torch, `import guard` must stay cheap
    if name == "Engine":
        from guard.engine import Engine

        return Engine
    raise AttributeError(f"module 'guard' has no attribute {name!r}")
