"""ACL309 accumulate-misuse: entries per batch, backwards per entry, loaders the engine tracks."""

from __future__ import annotations

HEADER = """
from accelerate import Accelerator
from torch.utils.data import DataLoader

accelerator = Accelerator(gradient_accumulation_steps=4)
encoder, head, opt, dl = accelerator.prepare(encoder, head, opt, dl)
"""


def _src(body: str) -> str:
    return HEADER + body


def test_two_entries_in_sequence(acl309, at):
    source = _src(
        """
for batch in dl:
    with accelerator.accumulate(encoder):
        feats = encoder(batch["x"])
    with accelerator.accumulate(head):
        accelerator.backward(crit(head(feats), batch["y"]))
        opt.step()
"""
    )
    assert acl309.findings(source) == [("ACL309", *at(source, "accelerator.accumulate(head)"))]
    (diagnostic,) = acl309.diagnostics(source)
    assert "`accelerator.accumulate(head)` after `accelerator.accumulate(encoder)`" in (
        diagnostic.message
    )
    assert acl309.fixed(source) == source  # no autofix


def test_nested_entries_and_two_items_of_one_with(acl309, at):
    nested = _src(
        """
for batch in dl:
    with accelerator.accumulate(encoder):
        with accelerator.accumulate(head):
            accelerator.backward(crit(head(encoder(batch["x"])), batch["y"]))
            opt.step()
"""
    )
    assert acl309.findings(nested) == [("ACL309", *at(nested, "accelerator.accumulate(head)"))]
    items = _src(
        """
for batch in dl:
    with accelerator.accumulate(encoder), accelerator.accumulate(head):
        accelerator.backward(crit(head(encoder(batch["x"])), batch["y"]))
        opt.step()
"""
    )
    assert acl309.findings(items) == [("ACL309", *at(items, "accelerator.accumulate(head)"))]


def test_an_entry_through_a_step_helper(acl309, at):
    source = _src(
        """
def encode(batch):
    with accelerator.accumulate(encoder):
        return encoder(batch["x"])

for batch in dl:
    feats = encode(batch)
    with accelerator.accumulate(head):
        accelerator.backward(crit(head(feats), batch["y"]))
        opt.step()
"""
    )
    assert acl309.findings(source) == [("ACL309", *at(source, "accelerator.accumulate(head)"))]


def test_two_backwards_of_one_model_in_one_entry(acl309, at):
    source = _src(
        """
for batch in dl:
    with accelerator.accumulate(encoder):
        accelerator.backward(crit(encoder(batch["a"]), batch["y"]))
        accelerator.backward(crit(encoder(batch["b"]), batch["y"]))
        opt.step()
"""
    )
    assert acl309.findings(source) == [("ACL309", *at(source, "accelerator.backward", 1))]


def test_backward_in_a_loop_inside_the_entry(acl309, at):
    source = _src(
        """
class Trainer:
    def train(self):
        for batch in dl:
            with accelerator.accumulate(encoder):
                for chunk in batch["x"].chunk(2):
                    accelerator.backward(crit(encoder(chunk), batch["y"]))
                opt.step()
"""
    )
    assert acl309.findings(source) == [("ACL309", *at(source, "accelerator.backward"))]


def test_loader_that_was_not_prepared(acl309, at):
    source = _src(
        """
train_dl = DataLoader(dataset, batch_size=8)
for epoch in range(3):
    for step, batch in enumerate(train_dl):
        with accelerator.accumulate(encoder):
            accelerator.backward(encoder(batch).loss)
            opt.step()
"""
    )
    assert acl309.findings(source) == [("ACL309", *at(source, "enumerate(train_dl)"))]


def test_loader_parameter_fed_an_unprepared_loader(acl309, at):
    source = _src(
        """
def train_one_epoch(loader):
    for batch in loader:
        with accelerator.accumulate(encoder):
            accelerator.backward(encoder(batch).loss)
            opt.step()

train_one_epoch(DataLoader(dataset, batch_size=8))
"""
    )
    assert acl309.findings(source) == [("ACL309", *at(source, "loader:"))]


def test_batches_drawn_with_next(acl309, at):
    source = _src(
        """
it = iter(dl)
for step in range(max_steps):
    batch = next(it)
    with accelerator.accumulate(encoder):
        accelerator.backward(encoder(batch).loss)
        opt.step()
"""
    )
    assert acl309.findings(source) == [("ACL309", *at(source, "next(it)"))]


def test_loader_loop_inside_the_block(acl309, at):
    source = _src(
        """
for epoch in range(3):
    with accelerator.accumulate(encoder):
        for batch in dl:
            accelerator.backward(encoder(batch).loss)
            opt.step()
"""
    )
    assert acl309.findings(source) == [("ACL309", *at(source, "dl:"))]


# --- must not flag ------------------------------------------------------------------------


def test_next_that_reads_a_parameter_is_no_batch_draw(acl309):
    source = _src(
        """
for step in range(max_steps):
    batch = batches[step]
    with accelerator.accumulate(encoder):
        device = next(encoder.parameters()).device
        accelerator.backward(encoder(batch.to(device)).loss)
        opt.step()
"""
    )
    assert acl309.findings(source) == []


def test_one_entry_with_every_model(acl309):
    source = _src(
        """
for batch in dl:
    with accelerator.accumulate(encoder, head):
        accelerator.backward(crit(head(encoder(batch["x"])), batch["y"]))
        opt.step()
"""
    )
    assert acl309.findings(source) == []


def test_entries_and_backwards_in_exclusive_branches(acl309):
    source = _src(
        """
for step, batch in enumerate(dl):
    if step % 2 == 0:
        with accelerator.accumulate(encoder):
            accelerator.backward(encoder(batch).loss)
            opt.step()
    else:
        with accelerator.accumulate(head):
            accelerator.backward(head(batch).loss)
            opt.step()
for batch in dl:
    with accelerator.accumulate(encoder, head):
        if batch["kind"] == "a":
            accelerator.backward(encoder(batch).loss)
        elif batch["kind"] == "b":
            accelerator.backward(head(encoder(batch)).loss)
        else:
            accelerator.backward(head(batch).loss)
"""
    )
    assert acl309.findings(source) == []


def test_prepared_loaders_in_every_spelling(acl309):
    source = _src(
        """
from accelerate.data_loader import prepare_data_loader
from tqdm import tqdm

def run(loader):
    for batch in tqdm(loader):
        with accelerator.accumulate(encoder):
            accelerator.backward(encoder(batch).loss)
            opt.step()

run(dl)
other = prepare_data_loader(DataLoader(dataset))
if resume:
    active = accelerator.skip_first_batches(dl, resume_step)
else:
    active = dl
for loader in (other, active):
    pass
for step, batch in enumerate(active):
    with accelerator.accumulate(encoder):
        accelerator.backward(encoder(batch).loss)
        opt.step()
for batch in other:
    with accelerator.accumulate(encoder):
        accelerator.backward(encoder(batch).loss)
        opt.step()
"""
    )
    assert acl309.findings(source) == []


def test_loader_of_unknown_origin(acl309):
    source = _src(
        """
def fit(self, loader):
    for batch in loader:
        with self.accelerator.accumulate(self.model):
            self.accelerator.backward(self.model(batch).loss)
            self.opt.step()
"""
    )
    assert acl309.findings(source) == []


def test_evaluation_loop_outside_the_block(acl309):
    source = _src(
        """
eval_dl = DataLoader(eval_set)
for batch in dl:
    with accelerator.accumulate(encoder):
        accelerator.backward(encoder(batch).loss)
        opt.step()
    if accelerator.sync_gradients and step % 100 == 0:
        for eval_batch in eval_dl:
            evaluate(encoder(eval_batch))
"""
    )
    assert acl309.findings(source) == []


def test_code_that_manages_its_own_windows(acl309):
    source = """
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin

    plugin = GradientAccumulationPlugin(num_steps=4, sync_with_dataloader=False)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin)
    model, opt = accelerator.prepare(model, opt)
    it = iter(stream)
    for step in range(max_steps):
        batch = next(it)
        with accelerator.accumulate(model):
            accelerator.backward(model(batch).loss)
            opt.step()
    for batch in DataLoader(dataset):
        with accelerator.accumulate(model):
            accelerator.backward(model(batch).loss)
            opt.step()
    """
    assert acl309.findings(source) == []


def test_two_models_each_backpropagated_once(acl309):
    source = _src(
        """
for batch in dl:
    with accelerator.accumulate(encoder, head):
        accelerator.backward(encoder(batch).loss)
        opt.step()
        accelerator.backward(head(batch).loss)
        head_opt.step()
"""
    )
    assert acl309.findings(source) == []


def test_gan_generator_then_discriminator_step_in_one_entry(acl309):
    """Each backward is followed by its own optimizer's step: one backward per model and entry,
    even when the discriminator's loss also reads the generator's output (holdout3, TiTok)."""
    source = _src(
        """
for images in dl:
    with accelerator.accumulate([encoder, head]):
        recon, extra = encoder(images)
        gen_loss, logs = loss_module(images, recon, extra, mode="generator")
        accelerator.backward(gen_loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if loss_module.should_discriminator_be_trained(step):
            disc_loss, logs = loss_module(images, recon, extra, mode="discriminator")
            accelerator.backward(disc_loss)
            head_opt.step()
            head_opt.zero_grad(set_to_none=True)
"""
    )
    assert acl309.findings(source) == []


def test_two_backwards_before_one_step_beside_a_second_optimizer_are_flagged(acl309, at):
    source = _src(
        """
for images in dl:
    with accelerator.accumulate([encoder, head]):
        accelerator.backward(loss_module(images, encoder(images), mode="generator"))
        accelerator.backward(loss_module(images, encoder(images), mode="generator"))
        opt.step()
        accelerator.backward(loss_module(images, encoder(images), mode="discriminator"))
        head_opt.step()
"""
    )
    assert acl309.findings(source) == [("ACL309", *at(source, "accelerator.backward", 1))]
