"""ACL309: `accelerator.accumulate()` used in a way that breaks its one-tick-per-batch counting.

(a) two entries for one batch drawn from the prepared loader (one per model) tick the counter
twice (a batch is identified by the active loader and the number of batches fetched so far);
(b) two backward passes in one entry that reach the same optimizers make k times K passes;
(c) an entry with no prepared loader active (a plain loader, a list): the end-of-loader flush
never fires. Code that opted out with `sync_with_dataloader=False` manages its own windows and
is left alone for (a) and (c). Each is reported before the damage: at the second entry, at the
second backward, and at the entry.
(d) under DDP, DDP models whose forwards in one micro-step (since the last backward) with an
accumulate() entry disagree on `require_backward_grad_sync`: a model left out of the entry (a
GAN's or a two-tower loop's second model) all-reduces on every micro-step, and one kept under
no_sync() on the update step never syncs. Reported at the disagreeing forward, before its backward.
"""

from __future__ import annotations

from guard import _report, sources
from guard.checks._common import first_params, report
from guard.sources import loaders

CODES = ("ACL309",)


def install(tracker) -> None:
    sources.ensure(tracker, "loader", "ddp")
    entry = {"batch": None, "open": False, "hits": []}
    micro: dict = {"accelerator": None, "sync": {}}  # since the last backward

    def enter(accelerator, models, **_) -> None:
        entry["open"], entry["hits"] = False, []
        if _syncs_with_loader(accelerator):
            state = accelerator.gradient_state
            if not state.in_dataloader:
                _report_unprepared_loader(accelerator)
            batch = (id(state.active_dataloader), loaders.LOADERS.fetched)
            if batch == entry["batch"]:
                _report_second_entry(accelerator, models)
            entry["batch"] = batch
        entry["open"] = True
        micro["accelerator"] = accelerator

    def leave(**_) -> None:
        entry["open"] = False

    def ddp_forward(module, sync, **_) -> None:
        flags = micro["sync"]
        flags[id(module)] = (sync, type(getattr(module, "module", module)).__name__, module)
        agreed = len({flag for flag, _, _ in flags.values()}) == 1
        accelerator = micro["accelerator"]
        if not agreed and accelerator is not None and not micro.get("reported"):
            micro["reported"] = True
            if not accelerator.sync_gradients and _report.enabled("ACL309"):
                _mark_left_out(tracker, flags.values())  # else ACL401 must still report it
            _report_mixed_sync(accelerator, flags.values())

    def after_backward(states, **_) -> None:
        micro.update(accelerator=None, sync={}, reported=False)
        if not entry["open"] or not states:
            return
        hit = frozenset(id(st) for st in states)
        if hit in entry["hits"]:
            _report_second_backward(states, len(entry["hits"]) + 1)
        entry["hits"].append(hit)

    tracker.subscribe("accumulate_enter", enter)
    tracker.subscribe("accumulate_exit", leave)
    # what a micro-step did matters only inside accumulate(), entered at least once
    tracker.subscribe("ddp_forward", ddp_forward, when="accumulate")
    tracker.subscribe("backward", after_backward, when="accumulate")


def _syncs_with_loader(accelerator) -> bool:
    state = accelerator.gradient_state
    return bool(state.plugin_kwargs.get("sync_with_dataloader", True)) and state.num_steps > 1


def _report_second_entry(accelerator, models) -> None:
    n = accelerator.gradient_accumulation_steps
    names = ", ".join(type(m).__name__ for m in models) or "no model"
    report(
        "ACL309",
        f"a second accelerator.accumulate() entry ({names}) for the same batch: the micro-step "
        f"counter ticks twice per batch, so with K={n} windows are {n // 2 or 1} batches long "
        "and the models entered separately sync at different times; enter once per batch with "
        "all models: `with accelerator.accumulate(model_a, model_b):`",
    )


def _report_unprepared_loader(accelerator) -> None:
    report(
        "ACL309",
        "accelerator.accumulate() is entered while no prepared dataloader is being iterated "
        f"(K={accelerator.gradient_accumulation_steps}): the end-of-loader sync never fires, so "
        "the tail of each epoch joins the next epoch's window; pass the loader through "
        "accelerator.prepare (or opt out with GradientAccumulationPlugin(sync_with_dataloader="
        "False) and manage windows yourself)",
    )


def _report_second_backward(states, k: int) -> None:
    report(
        "ACL309",
        f"{k} backward passes reached the same optimizer(s) inside one accumulate() entry, which "
        f"counts as one micro-step: each window sums {k}x as many passes as it divides by, so "
        "the gradient is that many times the intended mean; run one backward per entry (sum the "
        "losses first) or enter accumulate() once per backward",
    )


def _mark_left_out(tracker, flags) -> None:
    """The optimizers of the models that all-reduce off the update step: ACL401 leaves their
    window to this finding."""
    for sync, _name, module in flags:
        for st in tracker.owners(first_params(module)) if sync else []:
            st.suppress("ACL401", because="ACL309")


def _report_mixed_sync(accelerator, flags) -> None:
    """An error when a model waits on the update step (its replicas diverge); a warning otherwise.

    A model left out of `accumulate()` all-reduces on every micro-step: correct numbers, wasted
    communication. A model kept under `no_sync()` on the update step never syncs that window.
    """
    calls = ", ".join(
        f"model {i} ({name}) {'all-reduces in its backward' if sync else 'waits under no_sync()'}"
        for i, (sync, name, _module) in enumerate(flags, start=1)
    )
    n = accelerator.gradient_accumulation_steps
    if accelerator.sync_gradients:
        consequence = (
            "this is the update step, so the waiting model's replicas keep their local gradients "
            "and diverge"
        )
    else:
        consequence = (
            f"a model left out of accelerator.accumulate() all-reduces on every micro-step, "
            f"{n}x the communication of a window"
        )
    report(
        "ACL309",
        f"DDP models called in one micro-step disagree on gradient sync: {calls} (in call order; "
        f"K={n}): {consequence}; enter once with every model trained in the window: "
        "`with accelerator.accumulate(model_a, model_b):`",
        "error" if accelerator.sync_gradients else "warning",
    )
