"""ACL503: a resumable checkpoint that saves the optimizer but not the GradScaler."""

from __future__ import annotations

from linter.context import RuleContext
from linter.model.checkpoints import checkpoints, enabled_scalers, is_scaler_text
from linter.model.kinds import CheckpointKind
from linter.model.precision_runs import scaler_configuration


def check(ctx: RuleContext) -> None:
    """Report `torch.save` of a training state without the scaler, where a scaler is enabled."""
    model = ctx.model
    scalers = enabled_scalers(model)
    if not scalers:
        return
    seen = set()  # one dict saved to `last.pt` and `best.pt` is one finding
    for checkpoint in checkpoints(model):
        if checkpoint.kind != CheckpointKind.TORCH_SAVE or not checkpoint.fully_visible:
            continue
        if checkpoint.binding is not None and id(checkpoint.binding) in seen:
            continue
        optimizers = checkpoint.state_dicts_of(model.is_optimizer)
        if not optimizers or checkpoint.mentions(_is_scaler(model)):
            continue
        if checkpoint.binding is not None:
            seen.add(id(checkpoint.binding))
        ctx.report(
            checkpoint.call,
            f"this checkpoint saves `{optimizers[0]}.state_dict()` but not "
            f"`{scalers[0]}.state_dict()`: a resumed run restarts the loss scale at 65536 and "
            f'skips its first steps on overflow (add `"scaler": {scalers[0]}.state_dict()`)',
            configuration=scaler_configuration(model, scalers[0]),
        )


def _is_scaler(model):
    def predicate(text: str | None) -> bool:
        return bool(text) and (is_scaler_text(text) or model.scaler_role(text) is not None)

    return predicate
