"""The tracker's patches of optimizers, clipping and schedulers: the events `optimizer_step_pre`,
`optimizer_step`, `zero_grad`, `clip`, `clip_done` and `scheduler_step_pre` (see
`guard._tracker`). A mixin of `Tracker`: it uses the tracker's state and `emit`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from guard import _patch, _report, _user_warnings
from guard._tracker_state import WINDOW_HISTORY, OptState
from guard.events import Event


class OptimizerPatches:
    """`Tracker`'s optimizer, clipping and scheduler wrappers."""

    # -- optimizers ----------------------------------------------------------------------------

    def _patch_optimizer(self) -> None:
        from torch.optim import optimizer as optim_mod

        tracker = self
        init = torch.optim.Optimizer.__init__

        @_patch.wraps_original(init)
        def __init__(opt, *args, **kwargs):
            init(opt, *args, **kwargs)
            tracker.state(opt)

        _patch.patch(torch.optim.Optimizer, "__init__", __init__)
        _patch.track(optim_mod.register_optimizer_step_pre_hook(self._step_pre))
        _patch.track(optim_mod.register_optimizer_step_post_hook(self._step_post))

        zero_grad = torch.optim.Optimizer.zero_grad

        @_patch.wraps_original(zero_grad)
        def optimizer_zero_grad(opt, set_to_none: bool = True):
            tracker._zero_grad(
                opt, [tracker.optimizers.get(opt) or tracker.state(opt)], set_to_none
            )
            return zero_grad(opt, set_to_none)

        _patch.patch(torch.optim.Optimizer, "zero_grad", optimizer_zero_grad)

        module_zero_grad = torch.nn.Module.zero_grad

        @_patch.wraps_original(module_zero_grad)
        def module_zero_grad_(module, set_to_none: bool = True):
            first = next(module.parameters(), None)
            states = tracker.owners([first]) if first is not None else []
            tracker._zero_grad(module, states, set_to_none)
            return module_zero_grad(module, set_to_none)

        _patch.patch(torch.nn.Module, "zero_grad", module_zero_grad_)

    def _zero_grad(self, owner: Any, states: list[OptState], set_to_none: bool) -> None:
        self.emit(Event.ZERO_GRAD, owner=owner, states=states, set_to_none=set_to_none)
        for st in states:
            st.scaled_pending = False
            st.contrib_backwards = st.contrib_scaled = 0

    def _step_pre(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        st = self.optimizers.get(optimizer)  # one lookup for a known optimizer, every step
        if st is None:
            if not self._is_real_optimizer(optimizer):
                return  # a wrapper: its inner optimizer's own step is the one counted
            st = self.state(optimizer)
        self.reads.flush_stale()
        self.emit(
            Event.OPTIMIZER_STEP_PRE,
            optimizer=optimizer,
            state=st,
            in_scaler_step=self.flags.scaler_step is not None,
            via_wrapper=self.flags.step_wrapper,
        )

    def _step_post(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        st = self.optimizers.get(optimizer)
        if st is None:
            return
        st.steps += 1
        st.last_step_skipped = False
        self._end_window(st)
        if st.steps > self.max_steps:
            self.max_steps = st.steps
            _report.set_step(st.steps)
        self.emit(Event.OPTIMIZER_STEP, optimizer=optimizer, state=st)
        self.update_sampling()

    @staticmethod
    def _is_real_optimizer(optimizer: Any) -> bool:
        """Wrappers such as AcceleratedOptimizer hold an inner `.optimizer`: count the inner."""
        return not isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer)

    def _end_window(self, st: OptState) -> None:
        st.windows.append(st.backwards)
        del st.windows[:-WINDOW_HISTORY]
        st.backwards = st.scaled_backwards = 0
        st.contrib_backwards = st.contrib_scaled = 0
        st.scaled_pending = False
        st.unscaled = False

    # -- clipping ------------------------------------------------------------------------------

    def _patch_clip(self) -> None:
        from torch.nn.utils import clip_grad

        self.clip_originals = {}
        for kind, name in (("norm", "clip_grad_norm_"), ("value", "clip_grad_value_")):
            original = getattr(clip_grad, name)
            wrapper = self._clip_wrapper(kind, original)
            self.clip_originals[original] = wrapper
            _patch.patch(clip_grad, name, wrapper)
            _patch.patch(torch.nn.utils, name, wrapper)

    def _clip_wrapper(self, kind: str, original: Callable) -> Callable:
        tracker = self

        @_patch.wraps_original(original)
        def clip(parameters, *args, **kwargs):
            if tracker.flags.clip_open:  # inside a clip already announced (Accelerate's)
                return original(parameters, *args, **kwargs)
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            return tracker.clipping(kind, params, tracker.flags.clip_via, original, args, kwargs)

        return clip

    def clipping(
        self, kind: str, params: list, via: str, original: Callable, args: tuple, kwargs: dict
    ) -> Any:
        """Run one clip of `params` (`original(params, *args, **kwargs)`) between its CLIP and
        CLIP_DONE events; clips it calls on the way (Accelerate's own torch calls, whichever
        torch functions a version uses) are not announced again."""
        states = self.owners(params)
        redirect: list[Callable] = []  # a check may put a replacement for torch's call here
        self.emit(
            Event.CLIP, kind=kind, parameters=params, states=states, via=via, redirect=redirect
        )
        previous, self.flags.clip_open = self.flags.clip_open, True
        try:
            result = redirect[0](*args, **kwargs) if redirect else original(params, *args, **kwargs)
        finally:
            self.flags.clip_open = previous
        self.emit(
            Event.CLIP_DONE,
            kind=kind,
            parameters=params,
            states=states,
            via=via,
            result=result,
            limit=args[0] if args else kwargs.get("max_norm", kwargs.get("clip_value")),
        )
        return result

    def rebind_imported_clips(self, modules: list) -> None:
        """Point `from torch.nn.utils import clip_grad_norm_` names already bound in user
        modules at the wrappers (restored on uninstall)."""
        for module in modules:
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for name, value in list(namespace.items()):
                wrapper = self.clip_originals.get(value) if _hashable(value) else None
                if wrapper is not None:
                    _patch.patch(module, name, wrapper)

    # -- schedulers ----------------------------------------------------------------------------

    def _patch_scheduler(self) -> None:
        cls = torch.optim.lr_scheduler.LRScheduler
        step = cls.step
        tracker = self

        @_patch.wraps_original(step)
        def scheduler_step(scheduler, *args, **kwargs):
            if getattr(scheduler, "last_epoch", 0) >= 0:  # -1 only in the constructor's own step
                optimizer = getattr(scheduler, "optimizer", None)
                tracker.emit(
                    Event.SCHEDULER_STEP_PRE,
                    scheduler=scheduler,
                    state=tracker.state(optimizer) if optimizer is not None else None,
                    via_wrapper=tracker.flags.sched_wrapper,
                )
            return step(scheduler, *args, **kwargs)

        _patch.patch(cls, "step", scheduler_step)
        # torch warns from inside step() one frame up (the order of the first steps, a
        # deprecated epoch argument): that frame is this wrapper, so point it at the user's.
        _user_warnings.redirect(torch.optim.lr_scheduler)


def _hashable(value: Any) -> bool:
    return callable(value) and getattr(value, "__hash__", None) is not None
