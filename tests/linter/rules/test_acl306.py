"""ACL306 accumulate-context-missing: K > 1 configured, but the loop never enters accumulate()."""

from __future__ import annotations

import textwrap

ACCELERATE = """
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    batch = to_device(batch)
    outputs = model(**batch)
    loss = outputs.loss  # the mean over the batch
    accelerator.backward(loss)

    opt.step()
    opt.zero_grad()
    log(loss)
"""

WRAPPED = """
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    batch = to_device(batch)
    with accelerator.accumulate(model):
        outputs = model(**batch)
        loss = outputs.loss  # the mean over the batch
        accelerator.backward(loss)

        opt.step()
        opt.zero_grad()
    log(loss)
"""


def test_accelerate_loop_is_flagged_and_wrapped_as_an_unsafe_fix(acl306, at):
    assert acl306.findings(ACCELERATE) == [("ACL306", *at(ACCELERATE, "accelerator.backward"))]
    assert acl306.fixed(ACCELERATE) == textwrap.dedent(ACCELERATE)
    assert acl306.fixed(ACCELERATE, unsafe=True) == textwrap.dedent(WRAPPED)
    (diagnostic,) = acl306.diagnostics(ACCELERATE)
    assert diagnostic.fix.applicability == "unsafe"
    assert "configured for 4 accumulation steps" in diagnostic.message


def test_k_from_args_and_a_plugin(acl306, at):
    from_args = ACCELERATE.replace("steps=4", "steps=args.gradient_accumulation_steps")
    (diagnostic,) = acl306.diagnostics(from_args)
    assert "configured for `args.gradient_accumulation_steps` accumulation steps" in (
        diagnostic.message
    )
    plugin = ACCELERATE.replace(
        "accelerator = Accelerator(gradient_accumulation_steps=4)",
        "from accelerate.utils import GradientAccumulationPlugin\n"
        "plugin = GradientAccumulationPlugin(num_steps=2)\n"
        "accelerator = Accelerator(gradient_accumulation_plugin=plugin)",
    )
    assert acl306.findings(plugin) == [("ACL306", *at(plugin, "accelerator.backward"))]


def test_raw_backward_of_a_prepared_model(acl306, at):
    source = ACCELERATE.replace("accelerator.backward(loss)", "loss.backward()")
    assert acl306.findings(source) == [("ACL306", *at(source, "loss.backward()"))]


def test_guard_engine_in_a_while_loop(acl306, at):
    source = """
    import guard

    engine = guard.Engine(gradient_accumulation_steps=cfg["grad_accum"])
    model, opt, dl = engine.prepare(model, opt, dl)
    it = iter(dl)
    step = 0
    while step < max_steps:
        batch = next(it)
        engine.backward(crit(model(batch["x"]), batch["y"]))
        opt.step()
        opt.zero_grad()
        step += 1
    """
    assert acl306.findings(source) == [("ACL306", *at(source, "engine.backward"))]
    expected = (
        "    with engine.accumulate(model):\n"
        '        engine.backward(crit(model(batch["x"]), batch["y"]))\n'
        "        opt.step()\n"
        "        opt.zero_grad()\n"
        "    step += 1\n"
    )
    assert expected in acl306.fixed(source, unsafe=True)


def test_helper_function_and_trainer_method(acl306, at):
    helper = """
    from accelerate import Accelerator

    def train_one_epoch(accelerator, model, dl, opt):
        for batch in dl:
            accelerator.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()

    def main():
        accelerator = Accelerator(gradient_accumulation_steps=args.accum)
        model, opt, dl = accelerator.prepare(model, opt, dl)
        train_one_epoch(accelerator, model, dl, opt)
    """
    assert acl306.findings(helper) == [("ACL306", *at(helper, "accelerator.backward"))]
    assert "        with accelerator.accumulate(model):\n" in acl306.fixed(helper, unsafe=True)
    trainer = """
    from accelerate import Accelerator

    class Trainer:
        def __init__(self, model, opt):
            self.accelerator = Accelerator(gradient_accumulation_steps=self.accum)
            self.model, self.opt = self.accelerator.prepare(model, opt)

        def train(self, dl):
            for batch in dl:
                self.accelerator.backward(self.model(**batch).loss)
                self.opt.step()
    """
    assert acl306.findings(trainer) == [("ACL306", *at(trainer, "self.accelerator.backward"))]
    wrapped = acl306.fixed(trainer, unsafe=True)
    assert "            with self.accelerator.accumulate(self.model):\n" in wrapped


def test_no_fix_when_indenting_would_change_a_string(acl306):
    source = ACCELERATE.replace(
        "    opt.zero_grad()\n", '    opt.zero_grad()\n    note = """a\nb"""\n    opt.zero_grad()\n'
    )
    (diagnostic,) = acl306.diagnostics(source)
    assert diagnostic.fix is None


# --- must not flag ------------------------------------------------------------------------


def test_no_accumulation_configured(acl306):
    assert acl306.findings(ACCELERATE.replace("gradient_accumulation_steps=4", "")) == []
    literal_one = ACCELERATE.replace("steps=4", "steps=1")
    assert acl306.findings(literal_one) == []
    unknown = ACCELERATE.replace("gradient_accumulation_steps=4", "**accelerator_kwargs")
    assert acl306.findings(unknown) == []
    opaque_plugin = ACCELERATE.replace(
        "gradient_accumulation_steps=4",
        "gradient_accumulation_plugin=GradientAccumulationPlugin(**plugin_kwargs)",
    )
    assert acl306.findings(opaque_plugin) == []


def test_loop_calls_a_step_helper_that_enters_accumulate(acl306):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, opt, dl = accelerator.prepare(model, opt, dl)

    def train_step(batch):
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()

    def compute(batch):
        accelerator.backward(model(**batch).loss)

    for batch in dl:
        train_step(batch)
    for batch in dl:
        with accelerator.accumulate(model):
            compute(batch)
            opt.step()
    """
    assert acl306.findings(source) == []


def test_accumulate_entered_through_a_name_or_a_conditional(acl306):
    named = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        window = accelerator.accumulate(model)
        with window:
            accelerator.backward(model(**batch).loss)
            opt.step()
    """
    assert acl306.findings(named) == []
    conditional = named.replace(
        "window = accelerator.accumulate(model)\n        with window:",
        "with accelerator.accumulate(model) if accumulating else nullcontext():",
    )
    assert "if accumulating" in conditional
    assert acl306.findings(conditional) == []


def test_manual_gate_on_the_same_k(acl306):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=args.accum)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for step, batch in enumerate(dl):
        accelerator.backward(model(**batch).loss)
        if (step + 1) % args.accum == 0 or step + 1 == len(dl):
            opt.step()
            opt.zero_grad()
    """
    assert acl306.findings(source) == []


def test_no_loop_backpropagates_through_the_engine(acl306):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    probe = Probe()
    for x, y in dl:
        crit(probe(x), y).backward()
        opt.step()
    """
    assert acl306.findings(source) == []
