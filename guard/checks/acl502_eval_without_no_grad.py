"""ACL502: evaluation that builds autograd graphs, and training steps taken in eval mode.

`model.eval()` on a model (not a single layer such as a BatchNorm frozen on purpose) with
trainable parameters is tracked until `model.train()`. If an optimizer had already trained that
model before `eval()`, a later step of it with gradients through the still-evaluating model is
training with dropout off and BatchNorm frozen: an error, raised before the step (test-time
adaptation, which adapts a model in eval mode from the start, is left alone). Forwards of such a
model with gradients enabled whose outputs record a graph (a frozen module's do not) are
counted: several before one backward (or before `model.train()`), with no backward using them,
were evaluation without `torch.no_grad()` (a warning; one forward per backward, as in test-time
adaptation, is fine).

The forwards are counted by a forward hook on the model while it is in eval mode, which
pickles, `torch.save` and `copy.deepcopy` leave out (`_patch.hidden_forward_hook`): a
checkpoint of the whole model after evaluation (PyTorch's word-language-model example) must
neither fail on the guard's function nor carry it into the file.
"""

from __future__ import annotations

import weakref

import torch

from guard import _patch, sources
from guard.checks._common import records_graph, report

CODES = ("ACL502",)


class _EvalForwards:
    """The models in eval mode (by id, weakly: an evaluated model may be dropped), each with its
    counting hook, and the count of their graph-recording forwards."""

    def __init__(self, tracker) -> None:
        self.tracker = tracker
        self.in_eval: dict[int, tuple] = {}  # id(module) -> (weakref, hook handle, states)
        self.forwards = 0
        self.module_name = ""

    def add(self, module) -> None:
        trained = [st for st in self.tracker.owners(list(module.parameters())) if st.steps]
        handle = _patch.hidden_forward_hook(module, _count_forward)
        ref = weakref.ref(module, self._collected(id(module)))
        self.in_eval[id(module)] = (ref, handle, trained)
        _COUNTERS[id(module)] = self
        self.tracker.establish("eval")

    def _collected(self, key: int):
        def forget(_ref) -> None:
            self.in_eval.pop(key, None)
            _COUNTERS.pop(key, None)

        return forget

    def discard(self, module) -> bool:
        """Stop tracking `module`; True when it was tracked."""
        entry = self.in_eval.pop(id(module), None)
        if entry is None:
            return False
        entry[1].remove()
        _COUNTERS.pop(id(module), None)
        return True

    def remove(self) -> None:
        """Forget every tracked model and drop its hook (`guard.uninstall()`)."""
        for key, (_ref, handle, _trained) in list(self.in_eval.items()):
            handle.remove()
            _COUNTERS.pop(key, None)
        self.in_eval.clear()

    def count(self, module, output) -> None:
        if not module.training and torch.is_grad_enabled() and records_graph(output):
            self.forwards += 1
            self.module_name = type(module).__name__

    def tracked(self):
        """(module, optimizer states that had trained it) for each live tracked module."""
        for ref, _handle, trained in list(self.in_eval.values()):
            module = ref()
            if module is not None:
                yield module, trained


_COUNTERS: dict[int, _EvalForwards] = {}  # id(module in eval) -> its counter


def _count_forward(module, _inputs, output) -> None:
    """The hook: a module-level function, found through `_COUNTERS` (a copy of the model that
    kept the hook by other means than pickling would find no counter and count nothing)."""
    if torch.compiler.is_compiling():
        return
    counter = _COUNTERS.get(id(module))
    if counter is not None:
        counter.count(module, output)


def install(tracker) -> None:
    sources.ensure(tracker, "train_mode")
    evals = _patch.track(_EvalForwards(tracker))  # `guard.uninstall()` calls its remove()

    def mode_changed(module, mode, **_) -> None:
        if not mode:
            if id(module) not in evals.in_eval and _is_trainable_model(module):
                evals.add(module)
        elif evals.discard(module):
            _report_eval_graphs(evals, "model.train()")

    def after_backward(**_) -> None:
        if evals.forwards:  # cheap test first: this runs on every micro-step
            _report_eval_graphs(evals, "this backward", keep=1)

    def before_step(optimizer, state, **_) -> None:
        for module, trained in evals.tracked():
            if state in trained and not module.training and _trained_by(module, optimizer):
                _report_eval_step(module, state)
                return

    tracker.subscribe("train_mode", mode_changed)
    tracker.subscribe("backward", after_backward, when="eval")
    tracker.subscribe("optimizer_step_pre", before_step, when="eval")


def _is_trainable_model(module) -> bool:
    """A model (it has children) with a trainable parameter: a frozen teacher or VAE kept in
    eval mode records no graph through its weights."""
    if next(module.children(), None) is None:
        return False
    return any(p.requires_grad for p in module.parameters())


def _trained_by(module, optimizer) -> bool:
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return any(p.grad is not None and id(p) in owned for p in module.parameters())


def _report_eval_graphs(evals: _EvalForwards, until: str, keep: int = 0) -> None:
    """`keep` forwards may legitimately feed the backward that ends the count."""
    forwards, evals.forwards = evals.forwards, 0
    if forwards > keep:
        report(
            "ACL502",
            f"{forwards - keep} forward(s) of {evals.module_name} in eval mode recorded autograd "
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
