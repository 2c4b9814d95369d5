"""ACL103: `scaler.step(...)` with no `scaler.update()` on every path that steps."""

from __future__ import annotations

from linter.context import RuleContext, make_fix
from linter.edits import delete_alone, insert_after
from linter.model import scaler_protocol as protocol
from linter.model import scaler_updates
from linter.model.precision_runs import scaler_configuration


def check(ctx: RuleContext) -> None:
    """Report, once per path, scaler steps that no update follows in every stepping iteration."""
    model = ctx.model
    for body in protocol.bodies(model):
        for missing in scaler_updates.missing_updates(model, body):
            _report(ctx, missing)


def _report(ctx, missing: scaler_updates.MissingUpdate) -> None:
    scaler = missing.scaler
    site = missing.steps[-1]
    edits = [insert_after(ctx, missing.anchor, f"{scaler}.update()")]
    edits += [delete_alone(ctx, update) for update in missing.partial]
    message = f"Call `{scaler}.update()` after the step"
    if missing.partial:
        message += " on every iteration (instead of in the branch)"
    fix = None if missing.updated_elsewhere else make_fix(message, *edits)
    where = "on some iterations only" if missing.partial else "never"
    consequence = (
        "the next iteration's step raises `RuntimeError` (the optimizer stays `STEPPED`) and the "
        "loss scale never adapts"
        if missing.body.repeats
        else "a second call raises `RuntimeError` (the optimizer stays `STEPPED`) and the loss "
        "scale never adapts"
    )
    ctx.report(
        site.call,
        f"`{scaler}.step(...)` is followed by `{scaler}.update()` {where}: {consequence} "
        f"(call `{scaler}.update()` once after the iteration's last `{scaler}.step`)",
        fix,
        configuration=scaler_configuration(ctx.model, scaler),
    )
