"""A registry of every monkey-patch and hook handle the guard installs, so `uninstall()` can
restore torch (and accelerate) exactly as they were."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MISSING = object()
_patches: list[tuple[Any, str, Any]] = []  # (owner, attribute, original or _MISSING)
_handles: list[Any] = []  # objects with .remove() (hook handles)


def patch(owner: Any, attribute: str, replacement: Any) -> Any:
    """Replace `owner.attribute`, remembering the original (returned) for restoration."""
    original = owner.__dict__.get(attribute, _MISSING) if hasattr(owner, "__dict__") else _MISSING
    current = getattr(owner, attribute, None)
    _patches.append((owner, attribute, original))
    setattr(owner, attribute, replacement)
    return current


def track(handle: Any) -> Any:
    """Remember a removable hook handle (e.g. from `register_forward_pre_hook`)."""
    _handles.append(handle)
    return handle


def restore_all() -> None:
    """Undo every patch (last first) and remove every tracked hook handle."""
    while _handles:
        _handles.pop().remove()
    while _patches:
        owner, attribute, original = _patches.pop()
        if original is _MISSING:
            try:
                delattr(owner, attribute)
            except AttributeError:
                pass
        else:
            setattr(owner, attribute, original)


def active() -> bool:
    return bool(_patches or _handles)


def wraps_original(original: Callable) -> Callable[[Callable], Callable]:
    """functools.wraps that also records the original under `__guard_original__`."""
    import functools

    def decorate(wrapper: Callable) -> Callable:
        wrapper = functools.wraps(original)(wrapper)
        wrapper.__guard_original__ = original  # type: ignore[attr-defined]
        return wrapper

    return decorate
