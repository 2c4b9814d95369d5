"""The tracker's patches of GradScaler and autocast: the events `scale`, `unscale_pre`,
`unscale`, `scaler_step_pre`, `scaler_step`, `update`, `autocast_enter` and
`autocast_exit` (see `guard._tracker`). A mixin of `Tracker`: it uses the tracker's state and
`emit`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from guard import _patch, _private, _report
from guard._tracker_state import AutocastFrame, ScalerState
from guard.events import Event


class AmpPatches:
    """`Tracker`'s GradScaler and autocast wrappers."""

    # -- GradScaler ----------------------------------------------------------------------------

    def _patch_scaler(self) -> None:
        cls = torch.amp.GradScaler
        tracker = self
        scale, unscale_, step, update = cls.scale, cls.unscale_, cls.step, cls.update

        @_patch.wraps_original(scale)
        def scale_(scaler, outputs):
            scaled = scale(scaler, outputs)
            if scaler.is_enabled():
                for t in scaled if isinstance(scaled, (list, tuple)) else (scaled,):
                    if isinstance(t, torch.Tensor):
                        t._guard_scaled_by = scaler
                        tracker.scaled = True
                tracker.establish("scaled")
                tracker.emit(Event.SCALE, scaler=scaler, outputs=outputs, scaled=scaled)
            return scaled

        @_patch.wraps_original(unscale_)
        def unscale(scaler, optimizer):
            if not scaler.is_enabled():
                return unscale_(scaler, optimizer)
            st = tracker.state(optimizer)
            tracker.emit(Event.UNSCALE_PRE, scaler=scaler, optimizer=optimizer, state=st)
            result = unscale_(scaler, optimizer)
            st.unscaled = True
            tracker.emit(Event.UNSCALE, scaler=scaler, optimizer=optimizer, state=st)
            return result

        @_patch.wraps_original(step)
        def step_(scaler, optimizer, *args, **kwargs):
            if not scaler.is_enabled():
                return step(scaler, optimizer, *args, **kwargs)
            st = tracker.state(optimizer)
            tracker.emit(Event.SCALER_STEP_PRE, scaler=scaler, optimizer=optimizer, state=st)
            steps_before = st.steps
            previous, tracker.flags.scaler_step = tracker.flags.scaler_step, scaler
            try:
                result = step(scaler, optimizer, *args, **kwargs)
            finally:
                tracker.flags.scaler_step = previous
            ran = st.steps > steps_before
            if not ran:
                tracker._end_window(st)
            tracker.scaler_state(scaler).stepped.append(st)
            tracker.emit(Event.SCALER_STEP, scaler=scaler, optimizer=optimizer, state=st, ran=ran)
            return result

        @_patch.wraps_original(update)
        def update_(scaler, new_scale=None):
            if not scaler.is_enabled():
                return update(scaler, new_scale)
            sst = tracker.scaler_state(scaler)
            before = _private.scaler_scale(scaler) if sst.stepped else None
            before = before.clone() if before is not None else None  # update() writes in place
            found_inf = tracker._found_inf(scaler, sst)
            result = update(scaler, new_scale)
            found, before, after = tracker._read_update(scaler, found_inf, before)
            skipped = bool(found) or (before is not None and new_scale is None and after < before)
            tracker._after_update(scaler, sst, skipped, before, after)
            return result

        for name, fn in (("scale", scale_), ("unscale_", unscale), ("step", step_)):
            _patch.patch(cls, name, fn)
        _patch.patch(cls, "update", update_)

    @staticmethod
    def _found_inf(scaler: Any, sst: ScalerState) -> torch.Tensor | None:
        """The scaler's own skip record for the optimizers stepped since the last update (a
        device tensor, > 0 when inf/NaN was found; no host read)."""
        optimizers = [o for o in (st.optimizer for st in sst.stepped) if o is not None]
        if not optimizers:
            return None
        return _private.scaler_found_inf(scaler, optimizers, "ACL603's found-inf check")

    def _read_update(self, scaler: Any, found_inf, before) -> tuple[float, Any, float]:
        """(found-inf, scale before, scale after) as numbers, from the step's one host read,
        which also reads whatever the checks deferred this step. Without the private scale
        tensor, `get_scale()` reads the scales instead."""
        after = _private.scaler_scale(scaler)
        if after is None:
            before, after = None, scaler.get_scale()
        tensors = [t for t in (found_inf, before, after) if isinstance(t, torch.Tensor)]
        values = iter(v[0] for v in self.reads.read(tensors))
        found = next(values) if found_inf is not None else 0.0
        before = next(values) if before is not None else None
        return found, before, next(values) if isinstance(after, torch.Tensor) else after

    def _after_update(self, scaler, sst: ScalerState, skipped: bool, before, after) -> None:
        sst.updates += 1
        sst.last_scale = after
        if skipped:
            sst.skips += 1
            sst.consecutive_skips += 1
        elif sst.stepped:
            sst.consecutive_skips = 0
        for st in sst.stepped:
            st.last_step_skipped = skipped
            st.skipped_steps += int(skipped)
        self.emit(
            Event.UPDATE,
            scaler=scaler,
            sstate=sst,
            skipped=skipped,
            scale_before=before,
            scale_after=after,
        )
        sst.stepped = []

    # -- autocast ------------------------------------------------------------------------------

    def _patch_autocast(self) -> None:
        cls = torch.amp.autocast_mode.autocast
        enter, exit_ = cls.__enter__, cls.__exit__
        tracker = self

        @_patch.wraps_original(enter)
        def __enter__(ac):
            device = ac.device
            ambient_enabled = torch.is_autocast_enabled(device)
            ambient_dtype = torch.get_autocast_dtype(device)
            result = enter(ac)
            frame = AutocastFrame(
                device=device,
                dtype=torch.get_autocast_dtype(device),
                enabled=torch.is_autocast_enabled(device),
                origin=tracker.flags.autocast_origin,
                grad_enabled=torch.is_grad_enabled(),
            )
            tracker.flags.autocast_origin = "user"  # regions nested inside are the user's again
            if frame.enabled:
                tracker.establish("autocast")
                if frame.dtype == torch.float16:
                    tracker.establish("fp16-autocast")
            try:
                tracker.emit(
                    Event.AUTOCAST_ENTER,
                    device=device,
                    dtype=frame.dtype,
                    enabled=frame.enabled,
                    origin=frame.origin,
                    ambient_enabled=ambient_enabled,
                    ambient_dtype=ambient_dtype,
                )
            except BaseException:
                exit_(ac, None, None, None)  # a check refused the region: leave autocast as it was
                raise
            tracker.autocast_stack.append(frame)
            if frame.enabled and frame.grad_enabled:
                frame.location = _report.user_location()
                tracker.regions_since_backward.append(frame)
            return result

        @_patch.wraps_original(exit_)
        def __exit__(ac, *exc):
            result = exit_(ac, *exc)
            if tracker.autocast_stack:
                frame = tracker.autocast_stack.pop()
                tracker.emit(Event.AUTOCAST_EXIT, frame=frame)
            return result

        _patch.patch(cls, "__enter__", __enter__)
        _patch.patch(cls, "__exit__", __exit__)

    @contextlib.contextmanager
    def autocast_origin(self, origin: str) -> Iterator[None]:
        """The next autocast region entered inside is attributed to `origin` (not the user)."""
        previous, self.flags.autocast_origin = self.flags.autocast_origin, origin
        try:
            yield
        finally:
            self.flags.autocast_origin = previous
