"""ACL313 accumulation-configured-not-applied: K sizes the schedule but no loop accumulates."""

from __future__ import annotations

import textwrap

RAW = """
from transformers import get_linear_schedule_with_warmup

def main(args):
    total_steps = len(dl) * args.epochs // args.gradient_accumulation_steps
    sched = get_linear_schedule_with_warmup(opt, 100, total_steps)
    print(f"accumulating {args.gradient_accumulation_steps} batches")
    for batch in dl:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
"""


def test_schedule_sized_with_k_while_the_loop_steps_every_batch(acl313, at):
    assert acl313.findings(RAW) == [("ACL313", *at(RAW, "args.gradient_accumulation_steps"))]
    (diagnostic,) = acl313.diagnostics(RAW)
    assert "sizes `total_steps`" in diagnostic.message
    assert "the loop at line 8" in diagnostic.message
    assert acl313.fixed(RAW) == textwrap.dedent(RAW)  # no autofix


def test_learning_rate_scaled_by_a_config_k_in_a_while_loop(acl313, at):
    source = """
    GRAD_ACCUM = 4
    lr = cfg["lr"] * cfg["grad_accum"] * cfg["batch_size"] / 256
    steps = total // GRAD_ACCUM
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    it = 0
    while it < steps:
        crit(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        it += 1
    """
    assert acl313.findings(source) == [("ACL313", *at(source, 'cfg["grad_accum"]'))]


def test_trainer_class_with_self_k(acl313, at):
    source = """
    class Trainer:
        def __init__(self, accum):
            self.accum = accum
            self.max_steps = len(self.dl) * self.epochs // self.accum

        def train(self):
            for batch in self.dl:
                self.model(batch).loss.backward()
                self.opt.step()
                self.opt.zero_grad()
    """
    assert acl313.findings(source) == [("ACL313", *at(source, "self.accum", 1))]
    unpacked = source.replace("self.accum = accum", "self.accum, self.seed = accum, 0")
    assert acl313.findings(unpacked) == [("ACL313", *at(unpacked, "self.accum", 1))]


# --- must not flag ------------------------------------------------------------------------


def test_k_handed_to_an_engine_or_a_trainer(acl313):
    engine = """
    import guard
    from accelerate import Accelerator

    num_steps = len(dl) // args.grad_accum
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
    for batch in dl:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
    """
    assert acl313.findings(engine) == []
    guard_engine = engine.replace("Accelerator(", "guard.Engine(")
    assert acl313.findings(guard_engine) == []
    trainer = engine.replace(
        "accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)",
        "training_args = TrainingArguments(out, gradient_accumulation_steps=args.grad_accum)",
    )
    assert acl313.findings(trainer) == []
    deepspeed = engine.replace(
        "accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)",
        'ds_config = {"train_batch_size": 64, "gradient_accumulation_steps": args.grad_accum}',
    )
    assert acl313.findings(deepspeed) == []


def test_k_only_printed_or_logged(acl313):
    source = """
    import logging

    logger = logging.getLogger(__name__)
    total_batch_size = args.batch_size * args.grad_accum
    logger.info(f"  Total train batch size = {total_batch_size}")
    logger.info("  Accumulation steps = %d", args.grad_accum)
    print("effective batch:", args.batch_size * args.grad_accum)
    for batch in dl:
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()
    """
    assert acl313.findings(source) == []


def test_loop_that_accumulates_on_k(acl313):
    gated = """
    total_steps = len(dl) * args.epochs // args.grad_accum
    for i, batch in enumerate(dl):
        (model(**batch).loss / args.grad_accum).backward()
        if (i + 1) % args.grad_accum == 0 or i + 1 == len(dl):
            opt.step()
            opt.zero_grad()
    """
    assert acl313.findings(gated) == []
    micro = """
    total_steps = max_iters // gradient_accumulation_steps
    while True:
        for micro_step in range(gradient_accumulation_steps):
            loss = model(X, Y) / gradient_accumulation_steps
            loss.backward()
        opt.step()
        opt.zero_grad()
    """
    assert acl313.findings(micro) == []


def test_k_passed_on_or_no_training_loop(acl313):
    passed = RAW.replace(
        "    for batch in dl:",
        "    train_one_epoch(model, dl, args.gradient_accumulation_steps)\n    for batch in dl:",
    )
    assert acl313.findings(passed) == []
    no_loop = """
    def schedule_length(args):
        return len(dl) * args.epochs // args.gradient_accumulation_steps
    """
    assert acl313.findings(no_loop) == []
