"""ACL102: `opt.step()` applies gradients that a GradScaler has scaled."""

from __future__ import annotations

from linter.checks._scaler_edits import insert_after
from linter.context import make_fix
from linter.model import scaler_protocol as protocol


def check(ctx) -> None:
    """Report direct optimizer steps fed by a scaled backward, with no `scaler.step(opt)`."""
    model = ctx.model
    for body in protocol.bodies(model):
        for bypass in protocol.bypassing_steps(model, body):
            _report(ctx, bypass)


def _report(ctx, bypass: protocol.Bypass) -> None:
    model = ctx.model
    site, scaler = bypass.site, bypass.scaled.scaler
    optimizer = site.receiver
    fix = None
    if site.call is not None and not site.call.args and optimizer:
        edits = [ctx.replace(site.call, f"{scaler}.step({optimizer})")]
        message = f"Step through the scaler: `{scaler}.step({optimizer})`"
        if not protocol.has_update(model, bypass.body, scaler):
            anchor = protocol.update_anchor(model, bypass.body, scaler, site.stmt)
            edits.append(insert_after(ctx, anchor, f"{scaler}.update()"))
            message += f", then `{scaler}.update()`"
        fix = make_fix(message, *edits)
    ctx.report(
        site.call,
        f"`{optimizer}.step()` applies gradients that `{scaler}.scale(...)` multiplied by the loss "
        f"scale: the update is that many times too large and inf/NaN steps are not skipped (use "
        f"`{scaler}.step({optimizer})` and `{scaler}.update()`)",
        fix,
    )
