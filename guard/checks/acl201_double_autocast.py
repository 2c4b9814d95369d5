"""ACL201 / ACL204: autocast regions that stack on each other or disagree with the Accelerator.

ACL201: an enabled region entered while a user region is already enabled (a user region around a
prepared model, or nested user regions): the outer region's loss code runs in low precision.
ACL204: a user region whose dtype differs from the Accelerator's precision, or
`accelerator.autocast()` entered while the Accelerator trains in fp32 (a no-op).
"""

from __future__ import annotations

from guard.checks._common import dtype_name, precision_of, report

CODES = ("ACL201", "ACL204")


def install(tracker) -> None:
    tracker.subscribe("autocast_enter", lambda **kw: _after_enter(tracker, **kw))
    tracker.subscribe("accelerate_autocast", _accelerate_autocast)


def _after_enter(tracker, device, dtype, enabled, origin, ambient_enabled, ambient_dtype) -> None:
    if not enabled or origin == "engine":
        return
    outer = tracker.autocast_stack[-1] if tracker.autocast_stack else None
    if ambient_enabled and outer is not None and outer.origin == "user" and outer.enabled:
        _nested(origin, dtype, ambient_dtype, outer.location)
        if origin == "accelerate-forward" and ambient_dtype != dtype:
            _region_against_accelerator(ambient_dtype, dtype, outer.location)
    elif origin == "user":
        _against_accelerator(tracker.accelerator(), device, dtype)


def _nested(origin: str, dtype, ambient_dtype, outer_location) -> None:
    inner = "a prepared model's forward" if origin == "accelerate-forward" else "another region"
    switch = (
        f" and switches the dtype from {dtype_name(ambient_dtype)} mid-way"
        if dtype != ambient_dtype
        else ""
    )
    report(
        "ACL201",
        f"{inner} enters {dtype_name(dtype)} autocast inside a user autocast region "
        f"({outer_location}): one of the regions is redundant{switch}, and the code around the "
        "inner one runs in low precision; keep a single region (accelerator.autocast() follows "
        "the Accelerator's precision)",
        "warning",
    )


def _region_against_accelerator(user_dtype, wanted, location) -> None:
    report(
        "ACL204",
        f"the user autocast region at {location} runs in {dtype_name(user_dtype)} but the "
        f"Accelerator trains in {dtype_name(wanted)}; use accelerator.autocast()",
        "warning",
    )


def _against_accelerator(accelerator, device, dtype) -> None:
    wanted = precision_of(accelerator)
    if wanted is None or dtype == wanted or accelerator.device.type != device:
        return
    report(
        "ACL204",
        f"a user autocast region runs in {dtype_name(dtype)} but the Accelerator trains in "
        f"{dtype_name(wanted)}: mixing them loses range or fails in uncovered ops; use "
        "accelerator.autocast()",
        "warning",
    )


def _accelerate_autocast(accelerator) -> None:
    if precision_of(accelerator) is None:
        requested = getattr(accelerator, "mixed_precision", "no")
        report(
            "ACL204",
            f"accelerator.autocast() entered while the Accelerator trains in fp32 (requested "
            f"mixed_precision={requested!r}): the region is a no-op; configure fp16/bf16 or drop "
            "it",
            "warning",
        )
