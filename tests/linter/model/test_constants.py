"""K's value from a module constant (`ACCUM_STEPS = 4`), as `--show-loops` and the rules read it."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source, describe_loops

MODULE_GATE = """
import torch

ACCUM_STEPS = 4
scaler = torch.amp.GradScaler("cuda")
for i, (images, labels) in enumerate(train_loader):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(images), labels) / ACCUM_STEPS
    scaler.scale(loss).backward()
    if (i + 1) % ACCUM_STEPS == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
"""

FUNCTION_GATE = """
import torch

GRAD_ACCUM = 4


def train_one_epoch(model, loader, optimizer):
    model.train()
    for step, batch in enumerate(loader):
        loss = model(**batch).loss / GRAD_ACCUM
        loss.backward()
        if (step + 1) % GRAD_ACCUM == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def accumulation(source: str) -> dict:
    (loop,) = describe_loops(textwrap.dedent(source), "train.py")["loops"]
    return loop["accumulation"]


def test_module_constant_in_a_module_level_gate_has_its_value():
    assert accumulation(MODULE_GATE) == {
        "k": "ACCUM_STEPS",
        "value": 4,
        "source": "modulus of the step gate",
        "line": 10,
        "setting": "with ACCUM_STEPS > 1 (default 4)",  # a module constant is a setting
    }


def test_module_constant_read_in_a_function_has_its_value():
    assert accumulation(FUNCTION_GATE)["value"] == 4


def test_constant_reassigned_once_under_main_guard_has_its_value():
    source = FUNCTION_GATE.replace(
        "GRAD_ACCUM = 4\n", 'if __name__ == "__main__":\n    GRAD_ACCUM = 8\n'
    )
    assert accumulation(source)["value"] == 8


def test_a_name_bound_in_several_places_has_no_known_value():
    """Reassigned in a branch, by a function's `global`, by a loop, a parameter, an import or a
    star import: which value the gate reads is not fixed in code."""
    rebound = [
        FUNCTION_GATE.replace(
            "GRAD_ACCUM = 4\n", "GRAD_ACCUM = 4\nif args.big_batch:\n    GRAD_ACCUM = 8\n"
        ),
        FUNCTION_GATE.replace(
            "    model.train()\n", "    global GRAD_ACCUM\n    GRAD_ACCUM *= 2\n    model.train()\n"
        ),
        FUNCTION_GATE.replace(
            "def train_one_epoch(model, loader, optimizer):",
            "def train_one_epoch(model, loader, optimizer, GRAD_ACCUM=1):",
        ),
        FUNCTION_GATE.replace("GRAD_ACCUM = 4\n", "GRAD_ACCUM = 4\nfrom config import *\n"),
        FUNCTION_GATE.replace(
            "GRAD_ACCUM = 4\n", "from config import GRAD_ACCUM\nGRAD_ACCUM = 4\n"
        ),
        MODULE_GATE.replace("for i,", "for ACCUM_STEPS in (2, 4):\n    pass\nfor i,"),
        FUNCTION_GATE.replace("GRAD_ACCUM = 4\n", "GRAD_ACCUM = int(os.environ['GRAD_ACCUM'])\n"),
    ]
    assert [accumulation(source)["value"] for source in rebound] == [None] * len(rebound)


def test_name_bound_to_another_constant_has_its_value():
    source = FUNCTION_GATE.replace(
        "GRAD_ACCUM = 4\n", "DEFAULT_ACCUM = 2\nGRAD_ACCUM = (DEFAULT_ACCUM)\n"
    )
    assert accumulation(source)["value"] == 2


SCHEDULED = """
import math
from accelerate import Accelerator
from transformers import get_scheduler

GRAD_ACCUM = {k}


def main(args):
    accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM)
    train_loader = build_loader(args)
    total_steps = len(train_loader) * args.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = get_scheduler(
        "linear", optimizer, num_warmup_steps=0, num_training_steps=total_steps
    )
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
    for epoch in range(args.epochs):
        for batch in train_loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(**batch).loss)
                optimizer.step()
                if accelerator.sync_gradients:
                    scheduler.step()
                optimizer.zero_grad()
"""


def acl310(source: str):
    return analyze_source(textwrap.dedent(source), "train.py", ["ACL310"])


def test_acl310_judges_a_constant_one_by_its_code():
    """`GRAD_ACCUM = 1` is a setting, not the catalogue's "absent or literal 1": the schedule
    sized in batches is wrong the day it is 2, so the finding stays (its value is shown)."""
    (found,) = acl310(SCHEDULED.format(k=1))
    assert (found.code, found.start.line, found.start.column) == ("ACL310", 15, 68)
    literal = SCHEDULED.format(k=1).replace("gradient_accumulation_steps=GRAD_ACCUM", "")
    assert acl310(literal) == []  # no accumulation in code: a length in batches is right


def test_acl310_still_flags_the_micro_batch_length_of_a_constant_four():
    source = SCHEDULED.format(k=4)
    (found,) = acl310(source)
    assert (found.code, found.start.line, found.start.column) == ("ACL310", 15, 68)
    assert "is not divided by K = `GRAD_ACCUM`" in found.message


def test_acl301_judges_a_constant_one_gate_by_its_code():
    """`(i + 1) % ACCUM_STEPS == 0` with `ACCUM_STEPS = 1` steps on every batch today, but the
    constant is there to be changed: the undivided loss is reported as for any K (a literal
    `% 1` gate is no window at all)."""
    source = MODULE_GATE.replace("ACCUM_STEPS = 4", "ACCUM_STEPS = 1").replace(" / ACCUM_STEPS", "")
    (found,) = analyze_source(textwrap.dedent(source), "train.py", ["ACL301"])
    assert (found.code, found.start.line, found.start.column) == ("ACL301", 9, 4)
    literal = source.replace("% ACCUM_STEPS", "% 1")
    assert analyze_source(textwrap.dedent(literal), "train.py", ["ACL301"]) == []
    four = MODULE_GATE.replace(" / ACCUM_STEPS", "")
    (found,) = analyze_source(textwrap.dedent(four), "train.py", ["ACL301"])
    assert (found.code, found.start.line, found.start.column) == ("ACL301", 9, 4)
