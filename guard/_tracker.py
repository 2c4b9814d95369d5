"""The guard's event tracker: torch is patched once, here, and every check subscribes to events.

Checks never patch torch themselves. They call `TRACKER.subscribe(event, fn)`; `fn` receives the
payload as keyword arguments (accept `**_` for the ones you ignore). The events and their payloads
are `guard.events` (an `Event` and a frozen dataclass each); `subscribe` refuses any other name.

`OptState` (one per optimizer): `backwards` / `scaled_backwards` since the last step,
`contrib_backwards` / `contrib_scaled` since the last step or `zero_grad`, `scaled_pending`
(gradients hold S*g that no `scaler.step` or `zero_grad` consumed), `scaler`, `unscaled`
(`unscale_` ran this window), `steps` (inner `step()` calls), `skipped_steps`,
`last_step_skipped`, `windows` (backward counts of the last steps), `prepared_by` (the
Accelerator), `wrapper`; a check keeps its own per-optimizer fields in a dataclass of its own,
`state.of(CheckState)`, and silences another check's finding with `state.suppress(code, because=)`.
`ScalerState` (one per GradScaler): `stepped` (optimizer states stepped since the last update),
`updates`, `skips`, `consecutive_skips`, `last_scale`.

Host reads: checks hand device values to `TRACKER.reads` (`guard._step_reads.StepReads`) instead
of reading them, so the guard reads the device at most once per optimizer step.

Other readable state: `TRACKER.states` (the live optimizers' `OptState`s, for a cheap test
before per-micro-step work), `autocast_stack` (open `AutocastFrame`s), `regions_since_backward`
(enabled, grad-enabled regions entered since the last backward), `accelerator()` (the latest
Accelerator), `prepared_schedulers` (inner scheduler -> (accelerator, wrapper)), `owners(params)`.

Writing a check: add `guard/checks/aclNNN_<rule>.py` (its rule's module name) with `CODES = (...)`
and `install(tracker)` that subscribes; it is discovered automatically. A subscriber that cannot
find anything until some fact holds (a GradScaler scaled a loss, an Accelerator exists; see `FACTS`)
subscribes with `when=fact`: until then it is not called, so loops that never get there do not pay
for it on every micro-step. The engine marks its own calls with `TRACKER.owning("engine")`
(backward), `TRACKER.autocast_origin("engine")` (its autocast) and `TRACKER.flag("step_wrapper",
wrapper)` / `flag("sched_wrapper", wrapper)` (prepared objects).
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from guard import _patch, events
from guard._step_reads import StepReads
from guard._tracker_amp import AmpPatches
from guard._tracker_optim import OptimizerPatches
from guard._tracker_state import (  # noqa: F401  (re-exported: the checks' vocabulary)
    FACTS,
    WINDOW_HISTORY,
    AutocastFrame,
    OptState,
    ScalerState,
    _Flags,
    _Subscription,
    sampled_window,
)
from guard.events import Event


class Tracker(OptimizerPatches, AmpPatches):
    """Singleton (`TRACKER`): owns the torch patches, the counters and the subscriptions."""

    def __init__(self) -> None:
        self.active = False
        self._subs: dict[str, list[Callable[..., None]]] = {}  # event -> the live subscribers
        self._unsampled: dict[str, list[Callable[..., None]]] = {}  # the same, less sampled-only
        self.sampling = True  # the current window is a sampled one for some optimizer
        self._entries: list[_Subscription] = []  # every subscription in order, live or waiting
        self.facts: set[str] = set()
        self.flags = _Flags()
        self.optimizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.scalers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.prepared_schedulers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.accelerators: list[Any] = []  # weakrefs, most recent last
        self.backward_id = 0  # the latest backward pass started, in any thread
        self._pass_ids = itertools.count(1)
        # Passes in flight in every thread: autograd runs hooks (FSDP's) in its own threads.
        self.backward_depth = 0
        self.max_steps = 0
        self.scaled = False  # an enabled GradScaler has scaled a tensor since install
        self._param_owner: dict[int, tuple[Any, OptState]] = {}
        self.states: list[OptState] = []  # the live optimizers' states, cheap to scan
        self.reads = StepReads()  # the checks' device values, one host read per step

    @property
    def autocast_stack(self) -> list[AutocastFrame]:
        """This thread's open autocast regions, innermost last."""
        return self.flags.autocast_stack

    @property
    def regions_since_backward(self) -> list[AutocastFrame]:
        """This thread's enabled, grad-enabled regions entered since its last backward."""
        return self.flags.regions_since_backward

    # -- subscriptions -------------------------------------------------------------------------

    def subscribe(
        self,
        event: str,
        fn: Callable[..., None],
        *,
        when: str | None = None,
        sampled: bool = False,
    ) -> Callable[[], None]:
        """Call `fn(**payload)` on every `event`; returns a function that unsubscribes.

        With `when`, only once that fact holds (see `establish`): a check that cannot fire
        before, e.g. until a GradScaler scaled a loss, then costs nothing per micro-step in the
        loops that never get there. With `sampled`, only in sampled windows (`sampling`: some
        optimizer's window is one, see `sampled_window`): a per-micro-step measurement that
        describes the loop's structure costs nothing in the other 15 of 16 windows. Subscribers
        run in the order they subscribed either way.
        """
        event = events.checked(event, fn)
        if when is not None and when not in FACTS:
            raise ValueError(f"unknown fact {when!r}; known: {', '.join(FACTS)}")
        entry = _Subscription(event, fn, when, sampled)
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
        """New lists, not edits: an `emit` in progress keeps iterating the old one."""
        live = [
            entry
            for entry in self._entries
            if entry.event == event and (entry.when is None or entry.when in self.facts)
        ]
        self._subs[event] = [entry.fn for entry in live]
        self._unsampled[event] = [entry.fn for entry in live if not entry.sampled]

    def emit(self, event: str, **payload: Any) -> None:
        for fn in (self._subs if self.sampling else self._unsampled).get(event, ()):
            fn(**payload)

    def update_sampling(self) -> None:
        """After an optimizer step: is the window that starts now a sampled one (for any live
        optimizer; always while none is known)?"""
        for st in self.states:  # a loop: this runs at every optimizer step
            if sampled_window(st.steps):
                self.sampling = True
                return
        self.sampling = not self.states

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
            self.sampling = True  # its first windows are sampled ones
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
            # The pass of the thread running the hook: the caller's on CPU. Autograd's device
            # threads run it on CUDA, where the latest pass stands in (exact with one thread).
            own = self.flags.pass_id
            st.hit = own if own is not None else self.backward_id

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
            if _inside_a_backward(tracker):  # reentrant (activation checkpointing): not a pass
                return original(tensors, *args, **kwargs)
            flags = tracker.flags
            roots = _tensor_roots(tensors)
            scaled_by = (  # an attribute miss costs an exception: only once a scaler scaled
                getattr(roots[0], "_guard_scaled_by", None) if roots and tracker.scaled else None
            )
            via = flags.owner
            tracker.emit(Event.BACKWARD_PRE, tensors=roots, scaled_by=scaled_by, via=via)
            pass_id = tracker.backward_id = next(tracker._pass_ids)
            flags.pass_id = pass_id
            tracker.backward_depth += 1
            try:
                result = original(tensors, *args, **kwargs)
            finally:
                tracker.backward_depth -= 1
                flags.pass_id = None
            tracker._after_backward(roots, scaled_by, via, pass_id)
            return result

        _patch.patch(torch.autograd, "backward", backward)

    def _after_backward(self, roots: tuple, scaled_by: Any, via: str, pass_id: int) -> None:
        hit = []
        for st in self.states:  # a loop, not a comprehension: one Python frame less per backward
            if st.hit == pass_id:
                hit.append(st)
        for st in hit:
            st.backwards += 1
            st.contrib_backwards += 1
            if scaled_by is not None:
                st.scaled_backwards += 1
                st.contrib_scaled += 1
                st.scaled_pending = True
                st.scaler = scaled_by
        self.emit(Event.BACKWARD, tensors=roots, scaled_by=scaled_by, via=via, states=hit)
        self.regions_since_backward.clear()

    @contextlib.contextmanager
    def owning(self, owner: str) -> Iterator[None]:
        """Mark backward passes started inside as the engine's or Accelerate's, not the user's."""
        previous, self.flags.owner = self.flags.owner, owner
        try:
            yield
        finally:
            self.flags.owner = previous

    @contextlib.contextmanager
    def flag(self, name: str, value: Any) -> Iterator[None]:
        """Temporarily set one of the caller flags (`step_wrapper`, `sched_wrapper`, `clip_via`)."""
        previous = getattr(self.flags, name)
        setattr(self.flags, name, value)
        try:
            yield
        finally:
            setattr(self.flags, name, previous)


_graph_task_id = getattr(torch._C, "_current_graph_task_id", None)


def _inside_a_backward(tracker: Tracker) -> bool:
    """Whether this call comes from inside a running backward (a reentrant checkpoint's, in
    whatever thread autograd runs it): then autograd has a graph task in this thread. Without
    that private query, any pass in flight counts (exact with one training thread)."""
    if _graph_task_id is not None:
        return _graph_task_id() >= 0
    return tracker.backward_depth > 0


def _tensor_roots(tensors: Any) -> tuple:
    """The tensors among backward's roots (GradientEdge roots carry no tensor: skipped)."""
    if isinstance(tensors, torch.Tensor):  # `loss.backward()`: no generator on the hot path
        return (tensors,)
    items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
    return tuple(t for t in items if isinstance(t, torch.Tensor))


TRACKER = Tracker()
