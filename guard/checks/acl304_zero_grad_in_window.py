"""ACL304: `zero_grad()` that throws away micro-batches no optimizer step has consumed yet.

A zero_grad is a discard when a backward reached the optimizer since its last step and no
optimizer at all stepped after that backward (a GAN's `opt_d.zero_grad()` clearing what the
generator's backward left in D is not a discard: `opt_g.step()` consumed that backward). Prepared
optimizers only really zero on update steps, so there the discard is reported at once. In plain
loops a single discard before the first step is allowed (a sanity-check backward followed by
zero_grad); the second one, or any after training started, raises before the window is lost.
`model.zero_grad()` on a model in eval mode clears evaluation-time gradients (saliency maps),
not a training window, and is left alone. So is dropping gradients that hold inf/NaN (`backward();
if not finite: zero_grad(); continue`): throwing away a poisoned window is deliberate. That costs
one gradient norm (a host sync), only at a zero_grad that would otherwise be reported.
An optimizer that zeroes its own gradients is left alone too: LBFGS's closure runs zero_grad
inside `step()`, and two-pass optimizers such as SAM zero between their passes in `first_step()`
after using the gradients themselves. A zero_grad after a loader pass ended with no backward
since (the next epoch's first zero_grad) drops the pass's unstepped tail: that is ACL307's
finding, reported when the pass ended, so it is not reported twice. Prepared loaders flush their
tail and read one batch ahead (the pass "ends" before its last batch runs), so for prepared
optimizers a discard right after a pass ended is still this finding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from guard import sources
from guard._report import user_frame
from guard.checks._common import grad_norm, report

CODES = ("ACL304",)


@dataclass
class Discards:
    """An optimizer's discards before its first step (`OptState.of`): one is allowed."""

    seen: int = 0


def install(tracker) -> None:
    sources.ensure(tracker, "loader")
    last_step = {"backward_id": 0}
    pass_end = {"backward_id": -1}  # tracker.backward_id when a loader pass last ended
    stepping: set[int] = set()  # optimizers inside their step() (an LBFGS closure runs there)

    def before_step(optimizer, **_) -> None:
        stepping.add(id(optimizer))

    def after_step(optimizer, **_) -> None:
        stepping.discard(id(optimizer))
        last_step["backward_id"] = tracker.backward_id

    def loader_ended(**_) -> None:
        pass_end["backward_id"] = tracker.backward_id

    def before_zero_grad(owner, states, **_) -> None:
        if tracker.backward_id == last_step["backward_id"]:
            return  # every backward was followed by a step
        if getattr(owner, "training", True) is False:
            return  # a module in eval mode: gradients of an evaluation (saliency), not a window
        pass_ended = tracker.backward_id == pass_end["backward_id"]
        for st in states:
            if id(st.optimizer) in stepping:
                continue
            if pass_ended and st.prepared_by is None:
                continue  # the end of a plain pass left this tail: ACL307's finding
            if st.contrib_backwards and _finite_grads(st.optimizer) and _is_discard(st):
                if not _called_by_an_optimizer():
                    _report(owner, st)
                return

    tracker.subscribe("optimizer_step_pre", before_step)
    tracker.subscribe("optimizer_step", after_step)
    tracker.subscribe("zero_grad", before_zero_grad)
    tracker.subscribe("loader_end", loader_ended)


def _is_discard(st) -> bool:
    if st.prepared_by is not None or st.steps > 0:
        return True
    discards = st.of(Discards)
    discards.seen += 1
    return discards.seen > 1


def _called_by_an_optimizer() -> bool:
    """Whether the user's frame that called zero_grad is a method of an optimizer (SAM)."""
    frame = user_frame()
    caller = frame.f_locals.get("self") if frame is not None else None
    return isinstance(caller, torch.optim.Optimizer)


def _finite_grads(optimizer) -> bool:
    """Whether the gradients about to be zeroed are all finite (one host read)."""
    norm = grad_norm(optimizer)
    return norm is None or bool(torch.isfinite(norm))


def _report(owner, st) -> None:
    k = st.contrib_backwards
    n = getattr(st.prepared_by, "gradient_accumulation_steps", None)
    window = f" of a {n}-micro-batch window" if n else ""
    where = "the top of the accumulate() block" if n else "every micro-batch"
    report(
        "ACL304",
        f"{type(owner).__name__}.zero_grad() discards the gradients of {k} micro-batch(es){window} "
        "that no optimizer step has used, so the step sees only the micro-batches after it; "
        f"call zero_grad() right after optimizer.step(), not at {where}",
    )
