"""ACL405 ddp-sync-bypassed: DDP gradients not all-reduced on the steps that count."""

from __future__ import annotations

import textwrap

import pytest

HEADER = """
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net, device_ids=[rank])
"""

MODULE_FORWARD = (
    HEADER
    + """for batch in dl:
    loss = model.module(batch).mean()
    loss.backward(); opt.step(); opt.zero_grad()
"""
)


def test_forward_through_module_is_flagged_and_fixed(acl405, at):
    assert acl405.findings(MODULE_FORWARD) == [("ACL405", *at(MODULE_FORWARD, "model.module("))]
    (diagnostic,) = acl405.diagnostics(MODULE_FORWARD)
    assert diagnostic.fix.applicability == "safe"
    assert acl405.fixed(MODULE_FORWARD) == textwrap.dedent(MODULE_FORWARD).replace(
        "model.module(batch)", "model(batch)"
    )


def test_module_forward_method_in_a_trainer_class(acl405, at):
    source = """
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Trainer:
        def __init__(self, net):
            self.model = DDP(net)

        def fit(self, dl):
            for x, y in dl:
                out = self.model.module.forward(x)
                self.crit(out, y).backward()
                self.opt.step()
    """
    assert acl405.findings(source) == [("ACL405", *at(source, "self.model.module.forward"))]
    assert "            out = self.model(x)\n" in acl405.fixed(source)


def test_module_for_saving_attributes_and_evaluation_is_not_flagged(acl405):
    source = (
        HEADER
        + """import torch
for x, y in dl:
    loss = crit(model(x), y)
    loss.backward()
    opt.step()
    with torch.no_grad():
        preds = model.module(x)
    print(model.module.config, model.module.generate(x))
torch.save(model.module.state_dict(), "w.pt")
"""
    )
    assert acl405.findings(source) == []


TOGGLE = (
    HEADER
    + """while True:
    for micro_step in range(grad_accum):
        if ddp:
            model.require_backward_grad_sync = EXPR
        logits, loss = model(X, Y)
        scaler.scale(loss / grad_accum).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
"""
)


@pytest.mark.parametrize(
    "expr",
    [
        "(micro_step == grad_accum - 1)",
        "micro_step + 1 == grad_accum",
        "micro_step >= grad_accum - 1",
    ],
)
def test_sync_flag_true_on_the_last_micro_step_is_not_flagged(acl405, expr):
    assert acl405.findings(TOGGLE.replace("EXPR", expr)) == []


@pytest.mark.parametrize("expr", ["micro_step == grad_accum", "False", "micro_step > grad_accum"])
def test_sync_flag_that_stays_false_is_flagged(acl405, at, expr):
    source = TOGGLE.replace("EXPR", expr)
    assert acl405.findings(source) == [("ACL405", *at(source, expr))]
    (diagnostic,) = acl405.diagnostics(source)
    assert diagnostic.fix is None


def test_sync_flag_under_a_modulo_gate(acl405, at):
    source = (
        HEADER
        + """for i, (x, y) in enumerate(dl):
    model.require_backward_grad_sync = EXPR
    (crit(model(x), y) / K).backward()
    if (i + 1) % K == 0:
        opt.step(); opt.zero_grad()
"""
    )
    good = source.replace("EXPR", "(i + 1) % K == 0")
    stuck = source.replace("EXPR", "(i + 1) % K == 1")
    unknown = source.replace("EXPR", "is_last(i)")
    assert acl405.findings(good) == []
    assert acl405.findings(stuck) == [("ACL405", *at(stuck, "(i + 1) % K == 1"))]
    assert acl405.findings(unknown) == []


def test_no_sync_around_the_optimizer_step(acl405, at):
    source = (
        HEADER
        + """for i, (x, y) in enumerate(dl):
    with model.no_sync():
        loss = crit(model(x), y) / K
        loss.backward()
        if (i + 1) % K == 0:
            opt.step(); opt.zero_grad()
"""
    )
    assert acl405.findings(source) == [("ACL405", *at(source, "model.no_sync()"))]
    conditional = source.replace(
        "with model.no_sync():", "with nullcontext() if (i + 1) % K == 0 else model.no_sync():"
    )
    assert acl405.findings(conditional) == []


def test_no_sync_held_in_a_name_around_the_optimizer_step(acl405, at):
    source = (
        HEADER
        + """for i, (x, y) in enumerate(dl):
    quiet = model.no_sync()
    with quiet:
        loss = crit(model(x), y) / K
        loss.backward()
        if (i + 1) % K == 0:
            opt.step(); opt.zero_grad()
"""
    )
    assert acl405.findings(source) == [("ACL405", *at(source, "quiet:"))]
    (diagnostic,) = acl405.diagnostics(source)
    assert diagnostic.message.startswith(
        "`with quiet:` (`quiet` is `model.no_sync()`, line 6) also covers the optimizer step"
    )
    branch = source.replace(
        "    quiet = model.no_sync()\n",
        "    quiet = model.no_sync()\n    if (i + 1) % K == 0:\n        quiet = nullcontext()\n",
    )
    assert acl405.findings(branch) == []
