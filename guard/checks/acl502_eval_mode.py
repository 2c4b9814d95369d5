"""ACL502: evaluation that builds autograd graphs, and training steps taken in eval mode.

`model.eval()` on a model (not a single layer such as a BatchNorm frozen on purpose) is tracked
until `model.train()`. If an optimizer had already trained that model before `eval()`, a later
step of it with gradients through the still-evaluating model is training with dropout off and
BatchNorm frozen: an error, raised before the step (test-time adaptation, which adapts a model
in eval mode from the start, is left alone). Forwards of such a model with gradients enabled
whose outputs record a graph (a frozen module's do not) are counted: several before one
backward (or before `model.train()`), with no backward using them, were evaluation without
`torch.no_grad()` (a warning; one forward per backward, as in test-time adaptation, is fine).
"""

from __future__ import annotations

import torch

from guard import _patch
from guard.checks import _sources
from guard.checks._common import records_graph, report

CODES = ("ACL502",)


def install(tracker) -> None:
    _sources.ensure(tracker, "train_mode")
    in_eval: dict[int, tuple] = {}  # id(module) -> (module, hook handle, optimizers it had)
    graphs = {"forwards": 0, "module": None}

    def count_forward(module, _inputs, output) -> None:
        if not module.training and torch.is_grad_enabled() and records_graph(output):
            graphs["forwards"] += 1
            graphs["module"] = type(module).__name__

    def mode_changed(module, mode, **_) -> None:
        if not mode and next(module.children(), None) is not None:
            if id(module) not in in_eval:
                handle = _patch.track(module.register_forward_hook(count_forward))
                trained = [st for st in tracker.owners(list(module.parameters())) if st.steps]
                in_eval[id(module)] = (module, handle, trained)
                tracker.establish("eval")
        elif mode and id(module) in in_eval:
            _module, handle, _trained = in_eval.pop(id(module))
            handle.remove()
            _report_eval_graphs(graphs, "model.train()")

    def after_backward(**_) -> None:
        if graphs["forwards"]:  # cheap test first: this runs on every micro-step
            _report_eval_graphs(graphs, "this backward", keep=1)

    def before_step(optimizer, state, **_) -> None:
        for module, _handle, trained in list(in_eval.values()):
            if state in trained and not module.training and _trained_by(module, optimizer):
                _report_eval_step(module, state)
                return

    tracker.subscribe("train_mode", mode_changed)
    tracker.subscribe("backward", after_backward, when="eval")
    tracker.subscribe("optimizer_step_pre", before_step, when="eval")


def _trained_by(module, optimizer) -> bool:
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return any(p.grad is not None and id(p) in owned for p in module.parameters())


def _report_eval_graphs(graphs: dict, until: str, keep: int = 0) -> None:
    """`keep` forwards may legitimately feed the backward that ends the count."""
    forwards, graphs["forwards"] = graphs["forwards"], 0
    if forwards > keep:
        report(
            "ACL502",
            f"{forwards - keep} forward(s) of {graphs['module']} in eval mode recorded autograd "
            f"graphs that no backward used before {until}: evaluation ran with gradients "
            "enabled (time and memory wasted); wrap it in torch.no_grad() or "
            "torch.inference_mode()",
            level="warning",
        )


def _report_eval_step(module, state) -> None:
    report(
        "ACL502",
        f"optimizer step {state.steps + 1} uses gradients computed through "
        f"{type(module).__name__} while it is in eval mode (dropout off, BatchNorm statistics "
        "frozen): training resumed after evaluation without model.train(); call model.train() "
        "after evaluating (or at the top of each epoch)",
    )
