"""ACL310 schedule-length-mismatch: schedules sized per process, or in micro-batches."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source

HEADER = """
import math
import torch
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup, get_scheduler

accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
"""

LOOP = """
for epoch in range(epochs):
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step()
            sched.step()
            opt.zero_grad()
"""


def snippet(setup: str) -> str:
    return HEADER + setup + LOOP


def test_per_process_length_of_a_scheduler_prepared_afterwards(acl310, at):
    source = snippet(
        """
model, opt, dl = accelerator.prepare(model, opt, dl)
steps = math.ceil(len(dl) / args.gradient_accumulation_steps) * epochs
sched = get_linear_schedule_with_warmup(opt, 100, steps)
sched = accelerator.prepare(sched)
"""
    )
    line, column = at(source, "100, steps")
    assert acl310.findings(source) == [("ACL310", line, column + 5)]
    message = acl310.diagnostics(source)[0].message
    assert "counts the batches of one process" in message
    assert "accelerator.num_processes" in message
    assert "micro-batches" not in message


def test_micro_batch_length_under_accumulate(acl310, at):
    source = snippet(
        """
sched = get_scheduler("linear", opt, num_warmup_steps=0, num_training_steps=len(dl) * epochs)
model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)
"""
    )
    assert acl310.findings(source) == [("ACL310", *at(source, "len(dl) * epochs"))]
    message = acl310.diagnostics(source)[0].message
    assert "micro-batches" in message and "args.gradient_accumulation_steps" in message
    assert "one process" not in message


def test_both_mistakes_are_one_finding(acl310, at):
    source = snippet(
        """
model, opt, dl = accelerator.prepare(model, opt, dl)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, 1e-3, total_steps=len(dl) * epochs)
sched = accelerator.prepare(sched)
"""
    )
    assert acl310.findings(source) == [("ACL310", *at(source, "len(dl) * epochs"))]
    message = acl310.diagnostics(source)[0].message
    assert "one process" in message and "micro-batches" in message


def test_divided_then_multiplied_back_by_k_counts_micro_batches(acl310, at):
    source = snippet(
        """
updates_per_epoch = math.ceil(len(dl) / args.gradient_accumulation_steps)
if args.max_train_steps is None:
    args.max_train_steps = args.num_train_epochs * updates_per_epoch
sched = get_scheduler(
    args.lr_scheduler_type,
    optimizer=opt,
    num_warmup_steps=args.num_warmup_steps * args.gradient_accumulation_steps,
    num_training_steps=args.max_train_steps * args.gradient_accumulation_steps,
)
model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)
"""
    )
    assert acl310.findings(source) == [("ACL310", *at(source, "args.max_train_steps * args"))]


def test_cosine_t_max_in_a_manual_gate(acl310, at):
    source = """
    import torch

    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(train_loader) * epochs)
    for epoch in range(epochs):
        for i, (x, y) in enumerate(train_loader):
            (crit(model(x), y) / accum).backward()
            if (i + 1) % accum == 0 or i + 1 == len(train_loader):
                opt.step()
                sched.step()
                opt.zero_grad()
    """
    assert acl310.findings(source) == [("ACL310", *at(source, "len(train_loader) * epochs"))]


def test_length_from_the_unprepared_loader_is_global(acl310):
    source = snippet(
        """
steps = math.ceil(len(dl) / accelerator.gradient_accumulation_steps) * epochs
sched = get_linear_schedule_with_warmup(opt, 100, num_training_steps=steps)
model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)
"""
    )
    assert acl310.findings(source) == []


def test_recomputation_after_prepare_does_not_resize_the_built_scheduler(acl310):
    """The HF example scripts recompute the per-epoch update count from the prepared loader
    after `prepare`, for the progress bar; the scheduler was built from the earlier value."""
    source = snippet(
        """
overrode = False
updates_per_epoch = math.ceil(len(dl) / args.gradient_accumulation_steps)
if args.max_train_steps is None:
    args.max_train_steps = args.num_train_epochs * updates_per_epoch
    overrode = True
sched = get_scheduler(
    name=args.lr_scheduler_type,
    optimizer=opt,
    num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
    num_training_steps=args.max_train_steps
    if overrode
    else args.max_train_steps * accelerator.num_processes,
)
model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)
updates_per_epoch = math.ceil(len(dl) / args.gradient_accumulation_steps)
if overrode:
    args.max_train_steps = args.num_train_epochs * updates_per_epoch
"""
    )
    assert acl310.findings(source) == []


def test_per_process_length_compensated_by_the_number_of_processes(acl310):
    source = snippet(
        """
model, opt, dl = accelerator.prepare(model, opt, dl)
steps = math.ceil(len(dl) / args.gradient_accumulation_steps) * epochs
sched = get_linear_schedule_with_warmup(opt, 100, steps * accelerator.num_processes)
sched = accelerator.prepare(sched)
"""
    )
    assert acl310.findings(source) == []


def test_split_batches_steps_once_per_update(acl310):
    source = snippet(
        """
model, opt, dl = accelerator.prepare(model, opt, dl)
steps = math.ceil(len(dl) / args.gradient_accumulation_steps) * epochs
sched = get_linear_schedule_with_warmup(opt, 100, steps)
sched = accelerator.prepare(sched)
"""
    ).replace("Accelerator(", "Accelerator(split_batches=True, ")
    assert acl310.findings(source) == []


def test_scheduler_not_stepped_with_the_optimizer(acl310):
    """`step_scheduler_with_optimizer=False`: the wrapper steps on every call, in micro-batches
    and without the W multiplier, so a per-process micro-batch length matches it."""
    source = snippet(
        """
model, opt, dl = accelerator.prepare(model, opt, dl)
sched = get_linear_schedule_with_warmup(opt, 100, len(dl) * epochs)
sched = accelerator.prepare(sched)
"""
    ).replace("Accelerator(", "Accelerator(step_scheduler_with_optimizer=False, ")
    assert acl310.findings(source) == []


def test_max_steps_from_configuration(acl310):
    source = snippet(
        """
model, opt, dl = accelerator.prepare(model, opt, dl)
sched = get_scheduler("cosine", opt, num_warmup_steps=500, num_training_steps=args.max_steps)
sched = accelerator.prepare(sched)
"""
    )
    assert acl310.findings(source) == []


def test_unprepared_scheduler_stepped_by_hand_in_per_process_steps(acl310):
    """The older HF example layout: the loader is prepared first, the scheduler is sized in
    per-process optimizer steps and stepped in the step branch, never wrapped."""
    source = """
    import math
    from accelerate import Accelerator
    from transformers import get_scheduler

    accelerator = Accelerator()
    model, opt, train_dataloader = accelerator.prepare(model, opt, train_dataloader)
    updates_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * updates_per_epoch
    sched = get_scheduler(args.lr_scheduler_type, opt, num_training_steps=args.max_train_steps)
    for epoch in range(args.num_train_epochs):
        for step, batch in enumerate(train_dataloader):
            loss = model(**batch).loss / args.gradient_accumulation_steps
            accelerator.backward(loss)
            if step % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                opt.step()
                sched.step()
                opt.zero_grad()
    """
    assert acl310.findings(source) == []


def test_no_accumulation_counts_batches(acl310):
    source = (HEADER + LOOP).replace(
        "gradient_accumulation_steps=args.gradient_accumulation_steps", "mixed_precision='bf16'"
    )
    source = source.replace(
        "\nfor epoch",
        "\nsched = get_scheduler('linear', opt, num_training_steps=len(dl) * epochs)\n"
        "model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)\nfor epoch",
    )
    assert acl310.findings(source) == []


def test_scheduler_in_micro_batches_stepped_on_every_micro_step_is_consistent(acl310):
    """Sized in micro-batches and stepped on each: the schedule ends with training (issue 22);
    ACL305 reads the same length and stays silent too."""
    source = """
    import torch

    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=len(loader) * epochs)
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            (crit(model(x), y) / 4).backward()
            sched.step()
            if (i + 1) % 4 == 0 or i + 1 == len(loader):
                opt.step()
                opt.zero_grad()
    """
    assert acl310.findings(source) == []
    assert analyze_source(textwrap.dedent(source), "snippet.py", ["ACL305"]) == []


def test_epochs_over_loader_length_is_no_length(acl310):
    source = snippet(
        """
epochs = math.ceil(args.max_steps / len(dl))
sched = get_scheduler("linear", opt, num_training_steps=args.max_steps)
model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)
"""
    )
    assert acl310.findings(source) == []


FACTORY = """
import math
from accelerate import Accelerator
from transformers import get_scheduler


def build_schedule(optimizer, loader, args):
    per_epoch = math.ceil(len(loader) / args.gradient_accumulation_steps)
    return get_scheduler("cosine", optimizer, num_training_steps=per_epoch * args.epochs)


def train(args, model, opt, train_loader):
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    PREPARE_LOADER
    sched = build_schedule(opt, train_loader, args)
    model, opt, train_loader, sched = accelerator.prepare(model, opt, train_loader, sched)
    for batch in train_loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step()
            sched.step()
            opt.zero_grad()
"""


def test_scheduler_built_by_a_helper_from_the_prepared_loader(acl310, at):
    source = FACTORY.replace("PREPARE_LOADER", "train_loader = accelerator.prepare(train_loader)")
    assert acl310.findings(source) == [("ACL310", *at(source, "per_epoch * args.epochs"))]
    assert "one process" in acl310.diagnostics(source)[0].message


def test_scheduler_built_by_a_helper_from_the_unprepared_loader(acl310):
    assert acl310.findings(FACTORY.replace("PREPARE_LOADER", "pass")) == []


def test_literal_k_divides_like_the_gate(acl310):
    source = """
    import torch

    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(loader) // 4 * epochs)
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            (crit(model(x), y) / 4).backward()
            if (i + 1) % 4 == 0 or i + 1 == len(loader):
                opt.step()
                sched.step()
                opt.zero_grad()
    """
    assert acl310.findings(source) == []
    assert acl310.findings(source.replace("len(loader) // 4", "len(loader)")) != []


MICRO_STEPS = """
from transformers import get_scheduler


def train(args, model, optimizer, train_dataloader):
    K = args.gradient_accumulation_steps
    lr_scheduler = get_scheduler(
        "cosine",
        optimizer=optimizer,
        num_warmup_steps=args.warmup_steps * K,
        num_training_steps=args.max_steps * K,
    )
    for epoch in range(args.num_train_epochs):
        for step, batch in enumerate(train_dataloader):
            loss = model(**batch).loss / K
            loss.backward()
            if (step + 1) % K == 0 or step + 1 == len(train_dataloader):
                optimizer.step()
                optimizer.zero_grad()
            lr_scheduler.step()
"""


def test_configured_steps_times_k_stepped_on_every_micro_step(acl310):
    """`max_steps * K` stepped on each micro-step is a schedule in micro-steps on purpose."""
    assert acl310.findings(MICRO_STEPS) == []
    assert analyze_source(textwrap.dedent(MICRO_STEPS), "snippet.py", ["ACL305"]) == []


def test_loader_length_stepped_only_on_the_update_step(acl310, at):
    """The same micro-batch length stepped only when the optimizer steps runs K times slow."""
    source = """
    from transformers import get_linear_schedule_with_warmup

    def train(args, model, optimizer, train_dataloader):
        lr_scheduler = get_linear_schedule_with_warmup(
            optimizer, args.num_warmup_steps, len(train_dataloader) * args.num_train_epochs
        )
        for epoch in range(args.num_train_epochs):
            for step, batch in enumerate(train_dataloader):
                loss = model(**batch).loss / args.gradient_accumulation_steps
                loss.backward()
                if (step + 1) % args.gradient_accumulation_steps == 0:
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
    """
    assert acl310.findings(source) == [("ACL310", *at(source, "len(train_dataloader) *"))]
