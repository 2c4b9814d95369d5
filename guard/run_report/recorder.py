"""The run report's per-window series, recorded from the tracker's events.

One row per optimizer step attempt (a "window": the micro-batches since the previous attempt),
per optimizer: micro-batches, valid tokens (mean-reduced cross-entropy/NLL losses), the gradient
norm (the one the user's clip returned, else the guard computes it at the step), the learning
rate, the GradScaler's loss scale and whether the step was skipped. Nothing is read on the host
for it: the device values go to the tracker's `StepReads` when a row closes and are read with the
guard's next batched read (a step later at most, or at exit). Past `MAX_ROWS` rows an optimizer's
series keeps every other row and from then records every second window (then every fourth ...),
so a long run costs bounded memory; skipped steps and finding markers are kept apart (bounded
too) so that thinning never hides them.

Only subscribed when a report was asked for (`ACCEL_GUARD_REPORT` / `configure(report_path=)`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from guard import _report
from guard.checks import _graph
from guard.checks._common import grad_norm

MAX_ROWS = 4096  # per optimizer, before thinning
MAX_EVENTS = 4096  # skipped windows and finding markers kept
MAX_HITS = 64  # windows remembered per finding (code, location)
TOKEN_PROBES = 32  # backwards searched for a token-mean loss before the search stops
FIELDS = ("window", "step", "micro_batches", "tokens", "grad_norm", "lr", "loss_scale", "skipped")


@dataclass
class _Window:
    """What the recorder keeps of an optimizer's window until its row closes (`OptState.of`)."""

    row: tuple | None = None  # (Row, tokens, device lr[, grad norm]) of the window being stepped
    tokens: list | None = None  # valid-token counts of this window's backwards
    norm: Any = None  # the norm the user's clip returned this window


class Row:
    """One window of one optimizer; device values are filled in when the step's read comes."""

    __slots__ = FIELDS

    def __init__(self, window: int, step: int, micro_batches: int, lr: float | None):
        self.window, self.step, self.micro_batches = window, step, micro_batches
        self.lr, self.tokens, self.grad_norm = lr, None, None
        self.loss_scale, self.skipped = None, False


class Series:
    """One optimizer's windows (thinned past `MAX_ROWS`), skipped windows and totals."""

    def __init__(self, index: int, optimizer: Any):
        self.index = index
        self.name = type(optimizer).__name__
        self.parameters = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
        self.param_groups = len(optimizer.param_groups)
        self.windows = 0  # attempts so far
        self.skipped_total = 0
        self.skipped_windows: list[int] = []
        self.stride = 1
        self.rows: list[Row] = []
        self.owner: Any = lambda: None  # weakref to the Engine / Accelerator that prepared it

    def wants(self, window: int) -> bool:
        return (window - 1) % self.stride == 0

    def add(self, row: Row) -> None:
        self.rows.append(row)
        if len(self.rows) > MAX_ROWS:
            self.rows = self.rows[::2]
            self.stride *= 2

    def note_skipped(self, window: int) -> None:
        self.skipped_total += 1
        if len(self.skipped_windows) < MAX_EVENTS:
            self.skipped_windows.append(window)


class Recording:
    """Everything the report knows about this process's run beyond the findings."""

    def __init__(self) -> None:
        self.series: list[Series] = []
        self.series_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer ->
        self.schedulers: dict[int, str] = {}  # id -> class name, in first-stepped order
        self.markers: dict[tuple[str, str | None], list[int]] = {}  # finding -> windows it fired
        self.world_size, self.rank = 1, 0
        self.autocast: list[str] = []  # dtypes of the enabled autocast regions entered
        self.token_probes = 0  # backwards searched for a token-mean loss in vain
        self.tokens_found = False
        self.scaled = False  # an enabled GradScaler scaled a loss

    def current_window(self) -> int:
        """The window in progress of the first optimizer (findings are marked there)."""
        return self.series[0].windows + 1 if self.series else 1

    def mark(self, code: str, location: str | None, _first: bool) -> None:
        hits = self.markers.setdefault((code, location), [])
        if len(hits) < MAX_HITS and len(self.markers) <= MAX_EVENTS:
            hits.append(self.current_window())


_RECORDING: list[Recording] = []


def recording() -> Recording | None:
    return _RECORDING[0] if _RECORDING else None


def forget() -> None:
    """Drop the series recorded so far (`guard.reset()`); recording goes on."""
    _UNREAD.clear()
    if _RECORDING:
        _RECORDING[0] = Recording()


def installed_on(tracker) -> bool:
    """Whether the recorder is subscribed to `tracker` now (an uninstall drops it)."""
    return any(entry.fn is _SUBSCRIBED[0] for entry in tracker._entries) if _SUBSCRIBED else False


_SUBSCRIBED: list = []  # the last install's scheduler subscriber, to tell whether it is live


def install(tracker) -> None:
    """Subscribe the recorder (a new recording per install: `uninstall()` ends a run)."""
    if installed_on(tracker):
        return
    _RECORDING[:] = [Recording()]
    _report.observe(_mark)
    pending: dict = {}

    def series(optimizer: Any) -> Series:
        rec = _RECORDING[0]  # `forget()` may have started a new recording
        found = rec.series_of.get(optimizer)
        if found is None:
            found = rec.series_of[optimizer] = Series(len(rec.series), optimizer)
            found.owner = _weak(tracker.state(optimizer).prepared_by)
            rec.series.append(found)
            _note_world(rec)
        return found

    def before_backward(tensors, **_) -> None:
        rec = _RECORDING[0]
        if not rec.tokens_found and rec.token_probes >= TOKEN_PROBES:
            return  # a run whose first losses are no token means has none: stop looking
        if tensors and tensors[0].grad_fn is not None:
            found = pending["tokens"] = _graph.token_mean_count(tensors[0])
            rec.tokens_found = rec.tokens_found or found is not None
            rec.token_probes += found is None

    def after_backward(states, **_) -> None:
        tokens = pending.pop("tokens", None)
        for st in states:
            window = st.of(_Window)
            window.norm = None  # a norm clipped earlier in the window is stale now
            if tokens is not None:
                if window.tokens is None:
                    window.tokens = []
                window.tokens.append(tokens[0])

    def after_clip(kind, states, result, **_) -> None:
        if kind == "norm" and isinstance(result, torch.Tensor):
            for st in states:
                st.of(_Window).norm = result.detach()

    def open_row(optimizer: Any, st) -> None:
        """A step is attempted: the window's host facts now, its device values kept."""
        window = st.of(_Window)
        _close(tracker, st, _take_row(window))  # one whose update never came
        s = series(optimizer)
        s.windows += 1
        tokens, window.tokens = window.tokens, None
        if not s.wants(s.windows):
            return
        row = Row(s.windows, st.steps, st.backwards, _lr(optimizer))
        s.add(row)
        window.row = (row, tokens or [], _device_lr(optimizer))

    def before_scaler_step(optimizer, state, **_) -> None:
        open_row(optimizer, state)

    def before_step(optimizer, state, in_scaler_step, **_) -> None:
        if not in_scaler_step:
            open_row(optimizer, state)
        window = state.of(_Window)
        entry = window.row
        if entry is not None and len(entry) == 3:  # the gradients the step will apply
            norm, window.norm = window.norm, None
            window.row = (*entry, norm if norm is not None else grad_norm(optimizer))

    def after_step(state, **_) -> None:
        if tracker.flags.scaler_step is None:  # a scaler's step closes at its update
            _close(tracker, state, _take_row(state.of(_Window)))

    def after_scaler_step(optimizer, state, ran, **_) -> None:
        if not ran:
            state.of(_Window).norm = None

    def after_update(sstate, skipped, scale_before, scale_after, **_) -> None:
        scale = scale_before if scale_before is not None else scale_after
        for st in sstate.stepped:
            optimizer = st.optimizer
            if optimizer is None:
                continue
            s = series(optimizer)
            if skipped:
                s.note_skipped(s.windows)
            entry = _take_row(st.of(_Window))
            if entry is not None:
                entry[0].loss_scale, entry[0].skipped = scale, bool(skipped)
                _close(tracker, st, entry)

    def before_scheduler_step(scheduler, **_) -> None:
        _RECORDING[0].schedulers.setdefault(id(scheduler), type(scheduler).__name__)

    def entered_autocast(dtype, enabled, **_) -> None:
        seen = _RECORDING[0].autocast
        if enabled and str(dtype) not in seen:
            seen.append(str(dtype))

    def scaled(**_) -> None:
        _RECORDING[0].scaled = True

    tracker.subscribe("backward_pre", before_backward)
    tracker.subscribe("backward", after_backward)
    tracker.subscribe("clip_done", after_clip)
    tracker.subscribe("scaler_step_pre", before_scaler_step)
    tracker.subscribe("optimizer_step_pre", before_step)
    tracker.subscribe("optimizer_step", after_step)
    tracker.subscribe("scaler_step", after_scaler_step)
    tracker.subscribe("update", after_update)
    tracker.subscribe("scheduler_step_pre", before_scheduler_step)
    tracker.subscribe("autocast_enter", entered_autocast, when="autocast")
    tracker.subscribe("scale", scaled)
    _SUBSCRIBED[:] = [before_scheduler_step]


def _mark(code: str, location: str | None, first: bool) -> None:
    rec = recording()
    if rec is not None:
        rec.mark(code, location, first)


def _note_world(rec: Recording) -> None:
    """World size and rank, taken while the process group is up (it may be gone at exit)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rec.world_size = torch.distributed.get_world_size()
        rec.rank = torch.distributed.get_rank()


def _lr(optimizer: Any) -> float | None:
    lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
    return float(lr) if isinstance(lr, (int, float)) else None


def _device_lr(optimizer: Any) -> Any:
    """A tensor learning rate (capturable optimizers) is read with the step's values."""
    lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
    return lr.detach() if isinstance(lr, torch.Tensor) else None


def _take_row(window: _Window) -> tuple | None:
    row, window.row = window.row, None
    return row


def _close(tracker, st, entry: tuple | None) -> None:
    """Hand the row's device values to the step's batched read (nothing is read here)."""
    if entry is None:
        return
    row, tokens, lr = entry[0], entry[1], entry[2]
    norm = entry[3] if len(entry) > 3 else None
    tensors, slots = [], []
    for name, value in (("grad_norm", norm), ("lr", lr)):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            slots.append(name)
    tensors.extend(t if isinstance(t, torch.Tensor) else torch.as_tensor(t) for t in tokens)
    if not tensors:
        return
    named = len(slots)

    def fill(values: list[list[float]]) -> None:
        _UNREAD.pop(id(row), None)
        for name, (value,) in zip(slots, values[:named], strict=True):
            setattr(row, name, value)
        if len(values) > named:
            row.tokens = sum(v[0] for v in values[named:])

    _UNREAD[id(row)] = (tensors, fill)
    tracker.reads.defer(tensors, fill)


_UNREAD: dict[int, tuple] = {}  # rows whose values wait for the next step's read


def read_unread() -> None:
    """At exit: read the last step's values, which no later step's read will carry. Only the
    series' own (in one read): the checks' deferred values are left as the run left them."""
    waiting = list(_UNREAD.values())
    _UNREAD.clear()
    if not waiting:
        return
    flat = [
        _whole(t).detach().reshape(-1).double().cpu() for tensors, _ in waiting for t in tensors
    ]
    values = torch.cat(flat).tolist()
    start = 0
    for tensors, fill in waiting:
        mine = []
        for t in tensors:
            mine.append(values[start : start + t.numel()])
            start += t.numel()
        fill(mine)


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2's clip norm) as a plain tensor."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _weak(obj: Any) -> Any:
    """A weak reference to `obj` (a callable giving None when there is none or it is gone)."""
    if obj is None:
        return lambda: None
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj
