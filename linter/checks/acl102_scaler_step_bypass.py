"""ACL102: `opt.step()` applies gradients that a GradScaler has scaled."""

from __future__ import annotations

from linter.context import RuleContext, make_fix
from linter.edits import insert_after
from linter.model import scaler_protocol as protocol
from linter.model import scaler_updates
from linter.model.precision_runs import scaler_configuration


def check(ctx: RuleContext) -> None:
    """Report direct optimizer steps fed by a scaled backward, with no `scaler.step(opt)`."""
    model = ctx.model
    for body in protocol.bodies(model):
        for bypass in protocol.bypassing_steps(model, body):
            _report(ctx, bypass)


def _report(ctx, bypass: protocol.Bypass) -> None:
    scaler, optimizer = bypass.scaled.scaler, bypass.site.receiver
    ctx.report(
        bypass.site.call,
        f"`{optimizer}.step()` applies gradients that `{scaler}.scale(...)` multiplied by the loss "
        f"scale: the update is that many times too large and inf/NaN steps are not skipped (use "
        f"`{scaler}.step({optimizer})` and `{scaler}.update()`)",
        _fix(ctx, bypass),
        configuration=scaler_configuration(ctx.model, scaler),
    )


def _fix(ctx, bypass: protocol.Bypass):
    """`opt.step()` -> `scaler.step(opt)`, plus the iteration's `update()` when the loop has none.
    None for `opt.step(closure)` (the scaler takes no closure), and when another function updates
    a scaler of that name: an inserted update would be followed by that one with no step between,
    which torch rejects."""
    model, site, scaler = ctx.model, bypass.site, bypass.scaled.scaler
    optimizer = site.receiver
    if site.call is None or site.call.args or not optimizer:
        return None
    needs_update = not scaler_updates.has_update(model, bypass.body, scaler)
    if needs_update and scaler_updates.updated_in_other_scopes(model, bypass.body, scaler):
        return None
    edits = [ctx.replace(site.call, f"{scaler}.step({optimizer})")]
    message = f"Step through the scaler: `{scaler}.step({optimizer})`"
    if needs_update:
        anchor = scaler_updates.update_anchor(model, bypass.body, scaler, site.stmt)
        edits.append(insert_after(ctx, anchor, f"{scaler}.update()"))
        message += f", then `{scaler}.update()`"
    return make_fix(message, *edits)
