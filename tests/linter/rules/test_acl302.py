"""ACL302 double-loss-division: a manual `/ K` before an engine backward that divides again."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source
from linter.fixer import fix_text

INLINE = """
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss / args.grad_accum)  # keep me
        opt.step()
        opt.zero_grad()
"""


def test_inline_division_is_flagged_and_removed(acl302, at):
    assert acl302.findings(INLINE) == [("ACL302", *at(INLINE, "accelerator.backward("))]
    assert acl302.fixed(INLINE) == textwrap.dedent(INLINE).replace(
        "model(**batch).loss / args.grad_accum)", "model(**batch).loss)"
    )


def test_message_names_k_and_the_effect(acl302):
    (diagnostic,) = acl302.diagnostics(INLINE.replace("args.grad_accum", "4"))
    assert "divided by 4 by hand" in diagnostic.message
    assert "the gradients are 4 times too small" in diagnostic.message


def test_single_use_name_keeps_its_forward(acl302, at):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=cfg["grad_accum"])
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            loss = model(**batch).loss / cfg["grad_accum"]
            accelerator.backward(loss)
            opt.step()
    """
    assert acl302.findings(source) == [("ACL302", *at(source, "accelerator.backward"))]
    assert "        loss = model(**batch).loss\n" in acl302.fixed(source)


def test_in_place_division_line_goes(acl302, at):
    source = """
    from accelerate import Accelerator

    ACCUM = 4
    accelerator = Accelerator(gradient_accumulation_steps=ACCUM)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            # scale for accumulation
            loss /= ACCUM
            accelerator.backward(loss)
            opt.step()
    """
    assert acl302.findings(source) == [("ACL302", *at(source, "accelerator.backward"))]
    expected = "        # scale for accumulation\n        accelerator.backward(loss)\n"
    assert expected in acl302.fixed(source)


def test_reciprocal_factor(acl302, at):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss * (1 / args.gradient_accumulation_steps))
            opt.step()
    """
    assert acl302.findings(source) == [("ACL302", *at(source, "accelerator.backward"))]
    assert "accelerator.backward(model(**batch).loss)" in acl302.fixed(source)


def test_engine_attribute_is_flagged_even_without_configured_k(acl302, at):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss / accelerator.gradient_accumulation_steps)
            opt.step()
    """
    assert acl302.findings(source) == [("ACL302", *at(source, "accelerator.backward"))]


def test_guard_engine_in_a_helper_function(acl302, at):
    source = """
    import guard

    def train_step(engine, model, batch, accum_steps):
        loss = model(batch).loss / accum_steps
        engine.backward(loss)

    def main():
        engine = guard.Engine(gradient_accumulation_steps=args.accum_steps)
        model, opt, dl = engine.prepare(model, opt, dl)
        for batch in dl:
            with engine.accumulate(model):
                train_step(engine, model, batch, args.accum_steps)
                opt.step()
    """
    assert acl302.findings(source) == [("ACL302", *at(source, "engine.backward(loss)"))]
    assert "    loss = model(batch).loss\n" in acl302.fixed(source)


def test_trainer_method_with_self_k(acl302, at):
    source = """
    from accelerate import Accelerator

    class Trainer:
        def __init__(self, accum):
            self.accum = accum
            self.accelerator = Accelerator(gradient_accumulation_steps=self.accum)

        def step(self, batch):
            with self.accelerator.accumulate(self.model):
                loss = self.model(batch).loss
                self.accelerator.backward(loss / self.accum)
                self.opt.step()
    """
    assert acl302.findings(source) == [("ACL302", *at(source, "self.accelerator.backward"))]
    assert "self.accelerator.backward(loss)" in acl302.fixed(source)


def test_deepspeed_engine_backward(acl302, at):
    source = """
    import deepspeed

    ds_config = {"train_batch_size": 32, "gradient_accumulation_steps": 4}
    model_engine, optimizer, _, _ = deepspeed.initialize(model=model, config=ds_config)
    for step, batch in enumerate(dl):
        loss = model_engine(batch).loss
        model_engine.backward(loss / model_engine.gradient_accumulation_steps())
        model_engine.step()
        loss = model_engine(batch).loss
        model_engine.backward(loss / 4)
        model_engine.step()
    """
    assert acl302.findings(source) == [
        ("ACL302", *at(source, "model_engine.backward")),
        ("ACL302", *at(source, "model_engine.backward", 1)),
    ]


def test_a_divided_loss_read_again_is_reported_without_fix(acl302, at):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            loss = model(**batch).loss / args.grad_accum
            accelerator.backward(loss)
            total_loss += loss.detach()
            opt.step()
    """
    (diagnostic,) = acl302.diagnostics(source)
    assert diagnostic.fix is None
    assert "remove the division by `args.grad_accum` at line 8" in diagnostic.notes[0]
    assert acl302.fixed(source) == textwrap.dedent(source)


# --- must not flag ------------------------------------------------------------------------


def test_manual_gate_without_configured_accumulation(acl302):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=1)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for step, batch in enumerate(dl):
        loss = model(**batch).loss / args.grad_accum
        accelerator.backward(loss)
        if (step + 1) % args.grad_accum == 0 or step + 1 == len(dl):
            opt.step()
            opt.zero_grad()
        logged = loss.item() * args.grad_accum  # the window's mean, multiplied back for the log
    """
    assert acl302.findings(source) == []
    assert acl302.findings(source.replace("gradient_accumulation_steps=1", "")) == []


def test_token_count_and_global_normalisation(acl302):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            loss = model(**batch, num_items_in_batch=num_items).loss
            accelerator.backward(loss)
            summed = model(**batch).loss
            scaled = summed * args.grad_accum * accelerator.num_processes / n_items
            accelerator.backward(scaled)
            accelerator.backward(model(**batch).loss / n_tokens)
            opt.step()
    """
    assert acl302.findings(source) == []


def test_divided_copy_used_only_for_logging(acl302):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            window_loss += loss.detach() / args.grad_accum
            accelerator.backward(loss)
            opt.step()
    """
    assert acl302.findings(source) == []


def test_division_in_a_branch_that_backpropagates_by_hand(acl302):
    source = """
    from accelerate import Accelerator

    def step_model(model, batch, accelerator, do_backward):
        loss = model(batch).loss
        if not do_backward:
            loss /= accelerator.gradient_accumulation_steps
            loss.backward()
        else:
            accelerator.backward(loss)
    """
    assert acl302.findings(source) == []


def test_deepspeed_config_out_of_sight(acl302):
    """A JSON config: its K is unknown, so only the engine's own value counts as K."""
    source = """
    import deepspeed

    model_engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model)
    for batch in dl:
        model_engine.backward(model_engine(batch).loss / args.grad_accum)
        model_engine.step()
    """
    assert acl302.findings(source) == []


def test_a_name_bound_to_the_engines_own_k_is_the_engines_k(acl302, at):
    """DeepSpeedExamples' BingBertSquad: the config's K is copied from the engine into
    `args.gradient_accumulation_steps`, then the loss is divided by it before the engine's
    backward divides again; the fix drops the manual division."""
    source = """
    import deepspeed

    model_engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model)
    args.gradient_accumulation_steps = model_engine.gradient_accumulation_steps()
    for batch in dl:
        loss = model_engine(batch).loss
        loss = loss / args.gradient_accumulation_steps
        model_engine.backward(loss)
        model_engine.step()
    """
    assert acl302.findings(source) == [("ACL302", *at(source, "model_engine.backward(loss)"))]
    assert "loss = loss / args" not in acl302.fixed(source)
    rebound = source.replace(
        "model_engine.gradient_accumulation_steps()\n",
        "model_engine.gradient_accumulation_steps()\n    args.gradient_accumulation_steps = 1\n",
    )
    assert acl302.findings(rebound) == []  # the last binding is not the engine's


def test_backward_calls_that_do_not_divide(acl302):
    source = """
    from lightning.fabric import Fabric

    fabric = Fabric()
    for batch in dl:
        fabric.backward(model(batch).loss / args.grad_accum)
        optimizer.backward(model(batch).loss / args.grad_accum)
        opt.step()

    class Module(LightningModule):
        def training_step(self, batch):
            self.manual_backward(self.model(batch).loss / self.grad_accum)
    """
    assert acl302.findings(source) == []


# --- composition with ACL101 ----------------------------------------------------------------


def _fix_both(source: str) -> tuple[str, list]:
    """Both rules in one fix pass, as `accel-lint --fix --select ACL101,ACL302` runs them."""
    source = textwrap.dedent(source)
    analyse = lambda text: analyze_source(text, "snippet.py", ["ACL101", "ACL302"])  # noqa: E731
    outcome = fix_text(source, analyse, unsafe=False)
    assert outcome.error is None
    return outcome.text, outcome.diagnostics


RAW_DIVIDED = """
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
model, opt, dl = accelerator.prepare(model, opt, dl)
accum_steps = args.grad_accum
for batch in dl:
    with accelerator.accumulate(model):
        loss = model(**batch).loss / accum_steps
        loss.backward()
        opt.step()
"""


def test_raw_backward_of_a_divided_loss_loses_the_division_once(acl101, acl302):
    assert acl302.findings(RAW_DIVIDED) == []  # ACL101's finding: a raw backward
    fixed, left = _fix_both(RAW_DIVIDED)
    assert left == []
    assert fixed == textwrap.dedent(RAW_DIVIDED).replace(
        "        loss = model(**batch).loss / accum_steps\n        loss.backward()\n",
        "        loss = model(**batch).loss\n        accelerator.backward(loss)\n",
    )


def test_a_division_acl101_leaves_is_removed_by_acl302():
    source = RAW_DIVIDED.replace(
        "        loss.backward()\n", "        log_every(step)\n        loss.backward()\n"
    )
    fixed, left = _fix_both(source)
    assert left == []
    assert "        loss = model(**batch).loss\n" in fixed
    assert fixed.count("accelerator.backward(loss)") == 1


def test_inline_division_by_the_engine_attribute():
    source = RAW_DIVIDED.replace(
        "        loss = model(**batch).loss / accum_steps\n        loss.backward()\n",
        "        (model(**batch).loss / accelerator.gradient_accumulation_steps).backward()\n",
    )
    fixed, left = _fix_both(source)
    assert left == []
    assert "        accelerator.backward(model(**batch).loss)\n" in fixed
