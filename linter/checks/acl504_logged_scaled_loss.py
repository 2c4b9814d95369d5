"""ACL504: a log of a loss divided by K or multiplied by the loss scale, at any cadence."""

from __future__ import annotations

from linter.context import RuleContext
from linter.model.config_space import k_configuration
from linter.model.cst_util import code
from linter.model.logged_losses import DIVIDED, SCALED, logged_losses


def check(ctx: RuleContext) -> None:
    """Report each logging statement once, at its logger call (else its `.item()`)."""
    for logged in logged_losses(ctx.model):
        hint = logged.kind not in (DIVIDED, SCALED)
        configuration = None
        if logged.kind == DIVIDED and logged.binding is not None:
            # a loss divided by K = 1 logs the loss itself
            configuration = k_configuration(ctx.model, logged.k, logged.binding.scope)
        ctx.report(
            logged.node,
            _message(ctx, logged),
            severity="info" if hint else None,
            configuration=configuration,
        )


def _message(ctx, logged) -> str:
    name = f"`{logged.name}`"
    k = f"`{code(logged.k)}`" if logged.k is not None else "K"
    if logged.kind == DIVIDED:
        by = f"K = {k}" if logged.k is not None else "the accumulation value K"
        return (
            f"{name} is logged after line {ctx.line_of(logged.binding.node)} divided it by {by} "
            "for the backward: the logged value is K times smaller than the loss, so runs "
            f"with accumulation look better than runs without. Log the undivided loss (or "
            f"multiply it back by {k}), summed over the window and logged once per optimizer step"
        )
    if logged.kind == SCALED:
        return (
            f"{name} holds `scaler.scale(...)` of the loss (line "
            f"{ctx.line_of(logged.binding.node)}): the logged value is the loss times the "
            "current loss scale (65536 at the start). Log the loss before scaling it"
        )
    return (
        f"hint: `{logged.name}.item()` runs on every micro-step of a window of K = {k}: each "
        "call waits for the device, and the value is one micro-batch's loss. Add "
        f"`{logged.name}.detach()` to a window sum and call `.item()` once per optimizer step "
        "(under the step gate or a log interval)"
    )
