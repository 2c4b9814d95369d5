"""ACL309: `accelerator.accumulate()` used in a way that breaks its one-tick-per-batch counting.

(a) two entries for one batch drawn from the loader (one per model) tick the counter twice;
(b) two backward passes in one entry that reach the same optimizers make a window of k*N passes;
(c) an entry with no prepared loader active (a plain loader, a list): the end-of-loader flush
never fires. Code that opted out with `sync_with_dataloader=False` manages its own windows and
is left alone for (a) and (c). Each is reported before the damage: at the second entry, at the
second backward, and at the entry.
"""

from __future__ import annotations

from guard.checks import _sources
from guard.checks._common import report

CODES = ("ACL309",)


def install(tracker) -> None:
    _sources.ensure(tracker, "loader")
    batch = {"entries": 0, "in_entry": False, "hits": []}

    def next_batch(**_) -> None:
        batch["entries"] = 0

    def enter(accelerator, models, **_) -> None:
        batch["in_entry"], batch["hits"] = True, []
        if not _syncs_with_loader(accelerator):
            return
        batch["entries"] += 1
        if batch["entries"] == 2:
            _report_second_entry(accelerator, models)
        elif not accelerator.gradient_state.in_dataloader:
            _report_unprepared_loader(accelerator)

    def leave(**_) -> None:
        batch["in_entry"] = False

    def after_backward(states, **_) -> None:
        if not batch["in_entry"] or not states:
            return
        hit = frozenset(id(st) for st in states)
        if hit in batch["hits"]:
            _report_second_backward(states, len(batch["hits"]) + 1)
        batch["hits"].append(hit)

    tracker.subscribe("loader_next", next_batch)
    tracker.subscribe("loader_end", next_batch)  # a prepared loader yields its last batch then
    tracker.subscribe("accumulate_enter", enter)
    tracker.subscribe("accumulate_exit", leave)
    tracker.subscribe("backward", after_backward)


def _syncs_with_loader(accelerator) -> bool:
    state = accelerator.gradient_state
    return bool(state.plugin_kwargs.get("sync_with_dataloader", True)) and state.num_steps > 1


def _report_second_entry(accelerator, models) -> None:
    n = accelerator.gradient_accumulation_steps
    names = ", ".join(type(m).__name__ for m in models) or "no model"
    report(
        "ACL309",
        f"a second accelerator.accumulate() entry ({names}) for the same batch: the micro-step "
        f"counter ticks twice per batch, so with N={n} windows are {n // 2 or 1} batches long "
        "and the models entered separately sync at different times; enter once per batch with "
        "all models: `with accelerator.accumulate(model_a, model_b):`",
    )


def _report_unprepared_loader(accelerator) -> None:
    report(
        "ACL309",
        "accelerator.accumulate() is entered while no prepared dataloader is being iterated "
        f"(N={accelerator.gradient_accumulation_steps}): the end-of-loader sync never fires, so "
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
