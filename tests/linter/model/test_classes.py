"""Class facts and summaries (`linter/model/classes.py`): what a trainer binds on `self`, what each
method does to the step, and what the module's context managers enter, as plain data."""

from __future__ import annotations

import textwrap

import libcst

from linter.model import Model
from linter.model.classes import context_summary, summarize

TRAINER = """
import contextlib

import torch


@contextlib.contextmanager
def maybe_no_sync(model, sync):
    if sync:
        yield
    else:
        with model.no_sync():
            yield


class MixedPrecision:
    def __enter__(self):
        self._ctx = torch.autocast("cuda", dtype=torch.float16)
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


class Trainer:
    def __init__(self, model, cfg):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.scaler = torch.amp.GradScaler("cuda")
        self.accum_steps = cfg.grad_accum_steps
        self.micro_step = 0

    def backward(self, loss):
        self.scaler.scale(loss / self.accum_steps).backward()

    def _clip(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)

    def optimizer_step(self):
        self.scaler.unscale_(self.optimizer)
        self._clip()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.micro_step = 0

    def train_step(self, batch):
        with MixedPrecision():
            loss = self.model(**batch).loss
        self.backward(loss)
        self.micro_step += 1
        if self.micro_step >= self.accum_steps:
            self.optimizer_step()

    def fit(self, loader):
        for batch in loader:
            self.train_step(batch)
"""


def build(source: str) -> Model:
    source = textwrap.dedent(source)
    return Model(libcst.parse_module(source), source)


def method(model: Model, name: str):
    return next(s for s in model.scopes if s.name == name and s.class_name == "Trainer")


def test_attributes_bound_in_any_method_are_the_classes():
    model = build(TRAINER)
    facts = model.classes.by_name["Trainer"]
    assert {"self.scaler", "self.optimizer", "self.accum_steps", "self.micro_step"} <= set(
        facts.attributes
    )
    resets = model.classes.attribute_defs(method(model, "train_step"), "self.micro_step")
    assert sorted(d.stmt.scope.name for d in resets) == ["__init__", "optimizer_step"]


def test_method_summary_says_what_the_step_does():
    model = build(TRAINER)
    step = summarize(model, method(model, "optimizer_step"))
    assert {"unscale", "clip", "scaler_step", "scaler_update", "zero_grad"} <= step.does
    assert step.scales_and_steps() and step.through == ("Trainer._clip",)
    whole = summarize(model, method(model, "train_step"))
    assert {"backward", "scaler_step"} <= whole.does
    assert "Trainer.backward" in whole.through


def test_context_managers_are_summarised_by_what_they_enter():
    model = build(TRAINER)
    no_sync = context_summary(model, "maybe_no_sync")
    assert [(e.kind, e.conditional) for e in no_sync.enters] == [("no_sync", True)]
    autocast = context_summary(model, "MixedPrecision")
    assert [(e.kind, e.conditional) for e in autocast.enters] == [("autocast", False)]
    assert context_summary(model, "Trainer") is None  # no `__enter__`
    assert context_summary(model, "fit") is None


def test_the_split_step_is_one_gated_step():
    model = build(TRAINER)
    loops = {(lp.scope.name, lp.gate.kind if lp.gate else None) for lp in model.loops}
    assert loops == {("backward", "counter"), ("train_step", "counter")}
    autocast = [r for r in model.regions if r.kind == "autocast"]
    assert len(autocast) == 1 and autocast[0].with_node in [
        w for w, _ in method(model, "train_step").withs
    ]
