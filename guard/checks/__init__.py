"""Runtime checks, one module per catalogue code (or tight family of codes).

Each module defines `CODES` (the codes it reports) and `install(tracker)`, which subscribes its
callbacks to tracker events (see `guard.events`). Modules are discovered, so adding a file here
is enough to ship a new check. A code's module also judges what `guard.Engine` sees of that code
from the inside (its `engine_*` functions and `Engine*` classes, called by the engine), so every
code is judged in one place.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def check_modules() -> list[ModuleType]:
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


def install_all(tracker) -> None:
    for module in check_modules():
        module.install(tracker)


def runtime_codes() -> set[str]:
    """Every code some installed check can report."""
    return {code for module in check_modules() for code in module.CODES}
