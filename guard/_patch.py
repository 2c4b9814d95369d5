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


class TransparentWrapper:
    """Base of the callables the guard (and its engine) store on a user's object, such as a
    model's instance `forward`: pickling, `torch.save` and `copy.deepcopy` see the wrapped
    callable instead, so a checkpoint of the object neither fails on a guard function nor
    needs the guard to load, and a copy carries nothing of the guard. `__wrapped__` lets
    unwrappers (Accelerate's `unwrap_model`) walk through it."""

    def __init__(self, wrapped: Callable) -> None:
        self.__wrapped__ = wrapped
        self.__guard_original__ = wrapped
        for name in ("__name__", "__qualname__", "__doc__", "__module__"):
            value = getattr(wrapped, name, None)
            if value is not None:
                try:
                    setattr(self, name, value)
                except (AttributeError, TypeError):
                    pass

    def __reduce_ex__(self, protocol: int):
        return self.__wrapped__.__reduce_ex__(protocol)


_hidden_hooks: Any = None  # WeakKeyDictionary: module -> ids of its forward hooks the guard owns


def hidden_forward_hook(module: Any, hook: Callable) -> Any:
    """`module.register_forward_hook(hook)` (its caller removes it, also on `uninstall()`), left
    out of every
    pickle, `torch.save` and `copy.deepcopy` of the module: a class-level `__reduce_ex__` on
    `nn.Module` (restored by `restore_all`) drops the guard's hooks from the state it returns,
    so a checkpoint neither fails on the guard's function nor carries it. A process-wide hook
    would do without this but makes torch warn at every call of a compiled module."""
    global _hidden_hooks
    import weakref

    import torch

    if _hidden_hooks is None or "__reduce_ex__" not in torch.nn.Module.__dict__:
        _hidden_hooks = weakref.WeakKeyDictionary()
        patch(torch.nn.Module, "__reduce_ex__", _module_reduce_ex)
    handle = module.register_forward_hook(hook)
    _hidden_hooks.setdefault(module, set()).add(handle.id)
    return handle


def _module_reduce_ex(module: Any, protocol: int) -> Any:
    reduced = object.__reduce_ex__(module, protocol)
    hidden = _hidden_hooks.get(module) if _hidden_hooks is not None else None
    if not hidden or len(reduced) < 3 or not isinstance(reduced[2], dict):
        return reduced
    state = dict(reduced[2])
    hooks = state.get("_forward_hooks")
    if hooks is not None:
        state["_forward_hooks"] = type(hooks)((k, v) for k, v in hooks.items() if k not in hidden)
    return (*reduced[:2], state, *reduced[3:])
