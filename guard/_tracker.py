"""The guard's event tracker: torch is patched once, here, and every check subscribes to events.

Checks never patch torch themselves. They call `TRACKER.subscribe(event, fn)`; `fn` receives the
payload as keyword arguments (accept `**_` for the ones you ignore). A check that raises
`GuardError` from a `*_pre` event stops the operation before it has any effect.

Events and payloads (states are `OptState` / `ScalerState` objects documented below):

- `backward_pre(tensors, scaled_by, via)`: before autograd runs. `tensors` are the roots,
  `scaled_by` the enabled GradScaler whose `scale()` produced the first root (or None), `via` who
  called it: "raw" (user code), "accelerate" (`Accelerator.backward`) or "engine".
- `backward(tensors, scaled_by, via, states)`: after autograd ran; `states` are the optimizers
  whose parameters received gradients in this pass (their counters are already updated).
- `optimizer_step_pre(optimizer, state, in_scaler_step, via_wrapper)`: torch's global step
  pre-hook, before any parameter changes. `via_wrapper` is the Accelerate/engine wrapper that is
  stepping it, or None. `optimizer_step(optimizer, state)`: after the step.
- `zero_grad(owner, states, set_to_none)`: before `Optimizer.zero_grad` / `Module.zero_grad`.
- `scale(scaler, outputs, scaled)`: after an enabled `GradScaler.scale`; `outputs` the unscaled
  input, `scaled` the result.
- `unscale_pre(scaler, optimizer, state)`, `unscale(...)` after.
- `scaler_step_pre(scaler, optimizer, state)`, `scaler_step(scaler, optimizer, state, ran)`
  after; `ran` tells whether the inner optimizer's `step()` was called (False = skipped on inf).
- `update_pre(scaler, sstate)`, `update(scaler, sstate, skipped, scale_before, scale_after)`;
  `skipped` means the scale backed off or the scaler recorded inf/NaN (its found-inf state) for
  the step(s) since the last update, i.e. they were skipped.
- `clip(kind, parameters, states, via, redirect)`: before torch's `clip_grad_norm_` or
  `clip_grad_value_`; `kind` is "norm" or "value", `parameters` the materialised list actually
  passed on, `via` "torch" or "accelerate" (inside `Accelerator.clip_grad_*`); a check may append
  to the list `redirect` a callable that runs instead of torch's function, with its remaining
  arguments.
  `clip_done(..., result, limit)` after, with the `max_norm` / `clip_value` passed and torch's
  return value (the total norm before clipping, for "norm").
- `scheduler_step_pre(scheduler, state, via_wrapper)`: before `LRScheduler.step` (not the call
  made by its constructor); `state` is its optimizer's state.
- `autocast_enter(device, dtype, enabled, origin, ambient_enabled, ambient_dtype)`: an autocast
  region was just entered (raising leaves it again); `ambient_*` is the state it replaced;
  `origin` is "user", "accelerate" (`Accelerator.autocast`), "accelerate-forward" (a prepared
  model's forward) or "engine". `autocast_exit(frame)` after.
- `prepare(accelerator, inputs, outputs)`: after `Accelerator.prepare`.
- `accumulate_enter(accelerator, models)` / `accumulate_exit(accelerator, models)`.
- `accelerate_autocast(accelerator)`: `Accelerator.autocast()` is being entered.

`OptState` (one per optimizer): `backwards` / `scaled_backwards` since the last step,
`contrib_backwards` / `contrib_scaled` since the last step or `zero_grad`, `scaled_pending`
(gradients hold S*g that no `scaler.step` or `zero_grad` consumed), `scaler`, `unscaled`
(`unscale_` ran this window), `steps` (inner `step()` calls), `skipped_steps`,
`last_step_skipped`, `windows` (backward counts of the last steps), `prepared_by` (the
Accelerator), `wrapper`, and `extra` (a dict where checks keep their own per-optimizer data).
`ScalerState` (one per GradScaler): `stepped` (optimizer states stepped since the last update),
`updates`, `skips`, `consecutive_skips`, `last_scale`.

Host reads: checks hand device values to `TRACKER.reads` (`guard._step_reads.StepReads`) instead
of reading them, so the guard reads the device at most once per optimizer step.

Other readable state: `TRACKER.states` (the live optimizers' `OptState`s, for a cheap test
before per-micro-step work), `autocast_stack` (open `AutocastFrame`s), `regions_since_backward`
(enabled, grad-enabled regions entered since the last backward), `accelerator()` (the latest
Accelerator), `prepared_schedulers` (inner scheduler -> (accelerator, wrapper)), `owners(params)`.

Writing a check: add `guard/checks/<module>.py` with `CODES = (...)` and `install(tracker)` that
subscribes; it is discovered automatically. A subscriber that cannot find anything until some
fact holds (a GradScaler scaled a loss, an Accelerator exists; see `FACTS`) subscribes with
`when=fact`: until then it is not called, so loops that never get there do not pay for it on
every micro-step. The engine marks its own calls with
`TRACKER.owning("engine")` (backward), `TRACKER.autocast_origin("engine")` (its autocast) and
`TRACKER.flag("step_wrapper", wrapper)` / `flag("sched_wrapper", wrapper)` (prepared objects).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from guard import _patch, _private, _report
from guard._step_reads import StepReads

WINDOW_HISTORY = 8


@dataclass(eq=False)
class OptState:
    """Per-optimizer counters; see the module docstring."""

    ref: Any  # weakref to the optimizer
    sentinels: list = field(default_factory=list)
    backwards: int = 0
    scaled_backwards: int = 0
    contrib_backwards: int = 0
    contrib_scaled: int = 0
    scaled_pending: bool = False
    scaler: Any = None
    unscaled: bool = False
    steps: int = 0
    skipped_steps: int = 0
    last_step_skipped: bool = False
    windows: list[int] = field(default_factory=list)
    prepared_by: Any = None
    wrapper: Any = None
    hit: int = -1  # id of the last backward pass that reached a sentinel
    extra: dict = field(default_factory=dict)  # per-check scratch space, keyed by code

    @property
    def optimizer(self):
        return self.ref()


@dataclass(eq=False)
class ScalerState:
    """Per-GradScaler counters; see the module docstring."""

    stepped: list = field(default_factory=list)
    updates: int = 0
    skips: int = 0
    consecutive_skips: int = 0
    last_scale: float | None = None


@dataclass
class AutocastFrame:
    device: str
    dtype: Any
    enabled: bool
    origin: str
    grad_enabled: bool
    location: str | None = None


# Facts a subscription can wait for (`subscribe(..., when=fact)`), and who establishes them.
FACTS = {
    "scaled": "an enabled GradScaler scaled a tensor (the tracker's scale wrapper)",
    "autocast": "an enabled autocast region was entered (the tracker's autocast wrappers)",
    "fp16-autocast": "an enabled float16 autocast region was entered (the same wrappers)",
    "accelerator": "an accelerate Accelerator was built (guard._accelerate)",
    "prepared": "an Accelerator or guard.Engine prepared an optimizer or scheduler",
    "accumulate": "Accelerator.accumulate() was entered (guard._accelerate)",
    "ddp": "a DistributedDataParallel wrapper was built or ran a forward (checks._sources)",
    "eval": "a module with children was switched to eval mode (ACL502's own subscriber)",
}


@dataclass(eq=False)
class _Subscription:
    event: str
    fn: Callable[..., None]
    when: str | None


class _Flags:
    """Who is calling: set by the wrappers around the caller-owned entry points."""

    def __init__(self) -> None:
        self.backward_depth = 0
        self.owner = "raw"
        self.scaler_step: Any = None
        self.step_wrapper: Any = None
        self.sched_wrapper: Any = None
        self.clip_via = "torch"
        self.autocast_origin = "user"


class Tracker:
    """Singleton (`TRACKER`): owns the torch patches, the counters and the subscriptions."""

    def __init__(self) -> None:
        self.active = False
        self._subs: dict[str, list[Callable[..., None]]] = {}  # event -> the live subscribers
        self._entries: list[_Subscription] = []  # every subscription in order, live or waiting
        self.facts: set[str] = set()
        self.flags = _Flags()
        self.optimizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.scalers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.prepared_schedulers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.autocast_stack: list[AutocastFrame] = []
        self.regions_since_backward: list[AutocastFrame] = []
        self.accelerators: list[Any] = []  # weakrefs, most recent last
        self.backward_id = 0
        self.max_steps = 0
        self.scaled = False  # an enabled GradScaler has scaled a tensor since install
        self._param_owner: dict[int, tuple[Any, OptState]] = {}
        self.states: list[OptState] = []  # the live optimizers' states, cheap to scan
        self.reads = StepReads()  # the checks' device values, one host read per step

    # -- subscriptions -------------------------------------------------------------------------

    def subscribe(
        self, event: str, fn: Callable[..., None], *, when: str | None = None
    ) -> Callable[[], None]:
        """Call `fn(**payload)` on every `event`; returns a function that unsubscribes.

        With `when`, only once that fact holds (see `establish`): a check that cannot fire
        before, e.g. until a GradScaler scaled a loss, then costs nothing per micro-step in the
        loops that never get there. Subscribers run in the order they subscribed either way.
        """
        if when is not None and when not in FACTS:
            raise ValueError(f"unknown fact {when!r}; known: {', '.join(FACTS)}")
        entry = _Subscription(event, fn, when)
        self._entries.append(entry)
        self._rebuild(event)

        def unsubscribe() -> None:
            if entry in self._entries:
                self._entries.remove(entry)
                self._rebuild(event)

        return unsubscribe

    def establish(self, fact: str) -> None:
        """Record that `fact` holds from now on (see `FACTS`); wakes the subscriptions waiting
        for it. Cheap when it already holds: the sources call it on every occurrence."""
        if fact in self.facts:
            return
        if fact not in FACTS:
            raise ValueError(f"unknown fact {fact!r}; known: {', '.join(FACTS)}")
        self.facts.add(fact)
        for event in {entry.event for entry in self._entries if entry.when == fact}:
            self._rebuild(event)

    def _rebuild(self, event: str) -> None:
        """A new list, not an edit: an `emit` in progress keeps iterating the old one."""
        self._subs[event] = [
            entry.fn
            for entry in self._entries
            if entry.event == event and (entry.when is None or entry.when in self.facts)
        ]

    def emit(self, event: str, **payload: Any) -> None:
        for fn in self._subs.get(event, ()):
            fn(**payload)

    def wants(self, event: str) -> bool:
        return bool(self._subs.get(event))

    # -- state lookup --------------------------------------------------------------------------

    def state(self, optimizer: Any) -> OptState:
        """The optimizer's state, registering it (and its sentinel hooks) on first sight."""
        if not self._is_real_optimizer(optimizer):  # e.g. a scheduler built on the wrapper
            optimizer = optimizer.optimizer
        st = self.optimizers.get(optimizer)
        if st is None:
            st = OptState(weakref.ref(optimizer, self._forget))
            self.optimizers[optimizer] = st
            self.states.append(st)
            self._watch(optimizer, st)
        return st

    def _forget(self, ref: Any) -> None:
        """An optimizer was collected: drop its state everywhere, or the parameter map would keep
        it (and through `OptState.scaler` its GradScaler) alive for the rest of the process."""
        self.states = [st for st in self.states if st.ref is not ref]
        owned = self._param_owner
        self._param_owner = {key: entry for key, entry in owned.items() if entry[1].ref is not ref}

    def scaler_state(self, scaler: Any) -> ScalerState:
        st = self.scalers.get(scaler)
        if st is None:
            st = self.scalers[scaler] = ScalerState()
        return st

    def owners(self, params: list) -> list[OptState]:
        """States of the optimizers that own any of `params` (in first-seen order)."""
        found: dict[int, OptState] = {}
        for p in params:
            entry = self._param_owner.get(id(p))
            if entry is not None and entry[0]() is p:
                found.setdefault(id(entry[1]), entry[1])
        return list(found.values())

    def accelerator(self) -> Any:
        """The most recently created (still alive) Accelerator, or None."""
        while self.accelerators:
            acc = self.accelerators[-1]()
            if acc is not None:
                return acc
            self.accelerators.pop()
        return None

    def _watch(self, optimizer: Any, st: OptState) -> None:
        """Map parameters to the optimizer; hook one sentinel per group to count backward passes.

        One hook per param group (not per parameter) keeps the per-micro-step cost constant.
        """

        def hit(_param: Any, st: OptState = st) -> None:
            st.hit = self.backward_id

        for group in getattr(optimizer, "param_groups", []):
            sentinel = None
            for p in group["params"]:
                entry = self._param_owner.get(id(p))
                if entry is None or entry[0]() is None:  # ids of collected params are reused
                    self._param_owner[id(p)] = (weakref.ref(p), st)
                if sentinel is None and getattr(p, "requires_grad", False):
                    sentinel = p
            if sentinel is not None and hasattr(sentinel, "register_post_accumulate_grad_hook"):
                st.sentinels.append(_patch.track(sentinel.register_post_accumulate_grad_hook(hit)))

    # -- install / uninstall -------------------------------------------------------------------

    def install(self) -> None:
        if self.active:
            return
        self.active = True
        self._patch_backward()
        self._patch_optimizer()
        self._patch_scaler()
        self._patch_clip()
        self._patch_scheduler()
        self._patch_autocast()

    def uninstall(self) -> None:
        self.__init__()

    # -- backward ------------------------------------------------------------------------------

    def _patch_backward(self) -> None:
        original = torch.autograd.backward
        tracker = self

        @_patch.wraps_original(original)
        def backward(tensors, *args, **kwargs):
            flags = tracker.flags
            if flags.backward_depth:  # reentrant (e.g. activation checkpointing): not a new pass
                return original(tensors, *args, **kwargs)
            roots = _tensor_roots(tensors)
            scaled_by = (  # an attribute miss costs an exception: only once a scaler scaled
                getattr(roots[0], "_guard_scaled_by", None) if roots and tracker.scaled else None
            )
            via = flags.owner
            tracker.emit("backward_pre", tensors=roots, scaled_by=scaled_by, via=via)
            tracker.backward_id += 1
            flags.backward_depth += 1
            try:
                result = original(tensors, *args, **kwargs)
            finally:
                flags.backward_depth -= 1
            tracker._after_backward(roots, scaled_by, via)
            return result

        _patch.patch(torch.autograd, "backward", backward)

    def _after_backward(self, roots: tuple, scaled_by: Any, via: str) -> None:
        hit = []
        for st in self.states:  # a loop, not a comprehension: one Python frame less per backward
            if st.hit == self.backward_id:
                hit.append(st)
        for st in hit:
            st.backwards += 1
            st.contrib_backwards += 1
            if scaled_by is not None:
                st.scaled_backwards += 1
                st.contrib_scaled += 1
                st.scaled_pending = True
                st.scaler = scaled_by
        self.emit("backward", tensors=roots, scaled_by=scaled_by, via=via, states=hit)
        self.regions_since_backward.clear()

    @contextlib.contextmanager
    def owning(self, owner: str) -> Iterator[None]:
        """Mark backward passes started inside as the engine's or Accelerate's, not the user's."""
        previous, self.flags.owner = self.flags.owner, owner
        try:
            yield
        finally:
            self.flags.owner = previous

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
        self.emit("zero_grad", owner=owner, states=states, set_to_none=set_to_none)
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
            "optimizer_step_pre",
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
        self.emit("optimizer_step", optimizer=optimizer, state=st)

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
                tracker.emit("scale", scaler=scaler, outputs=outputs, scaled=scaled)
            return scaled

        @_patch.wraps_original(unscale_)
        def unscale(scaler, optimizer):
            if not scaler.is_enabled():
                return unscale_(scaler, optimizer)
            st = tracker.state(optimizer)
            tracker.emit("unscale_pre", scaler=scaler, optimizer=optimizer, state=st)
            result = unscale_(scaler, optimizer)
            st.unscaled = True
            tracker.emit("unscale", scaler=scaler, optimizer=optimizer, state=st)
            return result

        @_patch.wraps_original(step)
        def step_(scaler, optimizer, *args, **kwargs):
            if not scaler.is_enabled():
                return step(scaler, optimizer, *args, **kwargs)
            st = tracker.state(optimizer)
            tracker.emit("scaler_step_pre", scaler=scaler, optimizer=optimizer, state=st)
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
            tracker.emit("scaler_step", scaler=scaler, optimizer=optimizer, state=st, ran=ran)
            return result

        @_patch.wraps_original(update)
        def update_(scaler, new_scale=None):
            if not scaler.is_enabled():
                return update(scaler, new_scale)
            sst = tracker.scaler_state(scaler)
            tracker.emit("update_pre", scaler=scaler, sstate=sst)
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
            "update",
            scaler=scaler,
            sstate=sst,
            skipped=skipped,
            scale_before=before,
            scale_after=after,
        )
        sst.stepped = []

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
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            states = tracker.owners(params)
            via = tracker.flags.clip_via
            redirect: list[Callable] = []  # a check may put a replacement for torch's call here
            tracker.emit(
                "clip", kind=kind, parameters=params, states=states, via=via, redirect=redirect
            )
            result = redirect[0](*args, **kwargs) if redirect else original(params, *args, **kwargs)
            tracker.emit(
                "clip_done",
                kind=kind,
                parameters=params,
                states=states,
                via=via,
                result=result,
                limit=args[0] if args else kwargs.get("max_norm", kwargs.get("clip_value")),
            )
            return result

        return clip

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
                    "scheduler_step_pre",
                    scheduler=scheduler,
                    state=tracker.state(optimizer) if optimizer is not None else None,
                    via_wrapper=tracker.flags.sched_wrapper,
                )
            return step(scheduler, *args, **kwargs)

        _patch.patch(cls, "step", scheduler_step)

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
                    "autocast_enter",
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
                tracker.emit("autocast_exit", frame=frame)
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

    @contextlib.contextmanager
    def flag(self, name: str, value: Any) -> Iterator[None]:
        """Temporarily set one of the caller flags (`step_wrapper`, `sched_wrapper`, `clip_via`)."""
        previous = getattr(self.flags, name)
        setattr(self.flags, name, value)
        try:
            yield
        finally:
            setattr(self.flags, name, previous)


def _tensor_roots(tensors: Any) -> tuple:
    """The tensors among backward's roots (GradientEdge roots carry no tensor: skipped)."""
    if isinstance(tensors, torch.Tensor):  # `loss.backward()`: no generator on the hot path
        return (tensors,)
    items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
    return tuple(t for t in items if isinstance(t, torch.Tensor))


def _hashable(value: Any) -> bool:
    return callable(value) and getattr(value, "__hash__", None) is not None


TRACKER = Tracker()
