"""ACL502: evaluation with gradients on or in train mode, and training resumed in eval mode."""

from __future__ import annotations

from linter.context import RuleContext
from linter.model.eval_modes import (
    eval_mode_leaks,
    imports_lightning,
    loaded_in_eval_mode,
    mode_matters,
    sets_eval_mode_anywhere,
)
from linter.model.evaluation import eval_contexts, grad_free


def check(ctx: RuleContext) -> None:
    """One finding per evaluation: the first model call that builds a graph (or runs in train
    mode), with a mode leak of the same function folded into its message. Gradients alone are a
    warning (memory and time wasted, the results are right); a wrong mode is an error."""
    model = ctx.model
    leaks = eval_mode_leaks(model)
    reported: set[int] = set()
    contexts = eval_contexts(model)
    judged_mode = bool(contexts) and _mode_never_set(model)
    for context in contexts:
        with_grad = [c for c in context.model_calls if not grad_free(model, c.stmt)]
        first = with_grad[0] if with_grad else context.model_calls[0]
        if id(first.call) in reported or not (with_grad or judged_mode):
            continue
        reported.add(id(first.call))
        mode_wrong = judged_mode and not loaded_in_eval_mode(model, first)
        if not (with_grad or mode_wrong):
            continue
        parts = []
        if with_grad:
            parts.append(
                f"{context.label} calls `{first.func}` with gradients enabled: an autograd graph "
                "is recorded for every batch (wrap it in `torch.no_grad()` or "
                "`torch.inference_mode()`)"
            )
        if mode_wrong:
            parts.append(
                "no `.eval()` is called anywhere in this file, so dropout and BatchNorm run in "
                "training mode during evaluation"
            )
        for leak in [k for k in leaks if _inside(context, k.eval_call.stmt)]:
            leaks.remove(leak)
            parts.append(_leak_text(leak))
        wrong_mode = mode_wrong or len(parts) > bool(with_grad)
        ctx.report(first.call, "; ".join(parts), severity="error" if wrong_mode else None)
    for leak in leaks:
        ctx.report(leak.eval_call.call, _leak_text(leak), severity="error")


def _mode_never_set(model) -> bool:
    """A file that never calls `.eval()`, has dropout or BatchNorm, and is not Lightning (which
    switches modes itself)."""
    return (
        not sets_eval_mode_anywhere(model) and not imports_lightning(model) and mode_matters(model)
    )


def _inside(context, stmt) -> bool:
    return any(s is stmt for s in context.stmts) or (
        context.kind == "function" and stmt.scope is context.scope
    )


def _leak_text(leak) -> str:
    receiver = leak.eval_call.receiver
    return (
        f"`{receiver}.eval()` runs every epoch but nothing calls `{receiver}.train()` before "
        "the next training step: training continues with dropout off and BatchNorm frozen"
    )
