"""The deprecated AMP constructors' source: the event `deprecated_amp`."""

from __future__ import annotations

from guard import _patch
from guard.events import Event
from guard.sources._hooks import called_by_user, installed

DEPRECATED_AMP = {  # module path -> class names whose torch.amp spelling takes the device first
    "torch.cuda.amp": ("autocast", "GradScaler"),
    "torch.cpu.amp": ("autocast", "GradScaler"),
}


def deprecated_amp(tracker) -> None:
    import importlib

    for module_name, class_names in DEPRECATED_AMP.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a torch without the old namespace: nothing deprecated to catch
            continue
        for class_name in class_names:
            cls = getattr(module, class_name, None)
            if cls is not None and not installed(cls, "__init__"):
                _wrap_deprecated_init(tracker, cls, f"{module_name}.{class_name}")


def _wrap_deprecated_init(tracker, cls: type, api: str) -> None:
    original = cls.__dict__.get("__init__", cls.__init__)
    device = api.split(".")[1]
    replacement = f"torch.amp.{cls.__name__}({device!r}, ...)"

    @_patch.wraps_original(original)
    def __init__(self, *args, **kwargs):
        if called_by_user():
            tracker.emit(Event.DEPRECATED_AMP, api=api, replacement=replacement)
        original(self, *args, **kwargs)

    _patch.patch(cls, "__init__", __init__)
