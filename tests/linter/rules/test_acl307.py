"""ACL307 dropped-tail-window: a modulo step gate over a sized loader with no last-batch clause."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source
from linter.fixer import fix_text

RAW = """
for epoch in range(epochs):
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / N).backward()
        if (i + 1) % N == 0:
            opt.step()
            opt.zero_grad()
"""


def test_raw_gate_without_last_batch_clause(acl307, at):
    assert acl307.findings(RAW) == [("ACL307", *at(RAW, "(i + 1) % N"))]
    assert acl307.fixed(RAW) == RAW  # unsafe: not applied by default
    assert acl307.fixed(RAW, unsafe=True) == textwrap.dedent(RAW).replace(
        "(i + 1) % N == 0:", "(i + 1) % N == 0 or i + 1 == len(dl):"
    )


def test_last_remainder_spelling(acl307, at):
    source = """
    for i, batch in enumerate(loader):
        (model(batch).loss / args.gradient_accumulation_steps).backward()
        if i % args.gradient_accumulation_steps == args.gradient_accumulation_steps - 1:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "i % args"))]
    assert "== args.gradient_accumulation_steps - 1 or i + 1 == len(loader):" in acl307.fixed(
        source, unsafe=True
    )


def test_gate_bound_to_a_name_is_extended_where_it_is_bound(acl307, at):
    source = """
    for step, batch in enumerate(train_loader):
        is_update = (step + 1) % cfg["grad_accum"] == 0
        (model(batch).loss / cfg["grad_accum"]).backward()
        if is_update:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(step + 1) %"))]
    fixed = acl307.fixed(source, unsafe=True)
    assert (
        'is_update = (step + 1) % cfg["grad_accum"] == 0 or step + 1 == len(train_loader)' in fixed
    )


def test_helper_function_and_progress_bar(acl307, at):
    source = """
    from tqdm import tqdm

    def train_one_epoch(model, loader, optimizer, accum):
        for i, (x, y) in enumerate(tqdm(loader)):
            (crit(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(i + 1) % accum"))]
    assert "(i + 1) % accum == 0 or i + 1 == len(loader):" in acl307.fixed(source, unsafe=True)


def test_trainer_method_with_self_attributes(acl307, at):
    source = """
    class Trainer:
        def train_epoch(self):
            for i, batch in enumerate(self.train_loader):
                (self.model(batch).loss / self.accum).backward()
                if (i + 1) % self.accum == 0:
                    self.optimizer.step()
                    self.optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(i + 1) % self"))]
    fixed = acl307.fixed(source, unsafe=True)
    assert "(i + 1) % self.accum == 0 or i + 1 == len(self.train_loader):" in fixed


def test_early_exit_gate_gets_an_and_clause(acl307, at):
    source = """
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / 4).backward()
        if (i + 1) % 4 != 0:
            continue
        opt.step()
        opt.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(i + 1) % 4"))]
    assert "if (i + 1) % 4 != 0 and i + 1 != len(dl):" in acl307.fixed(source, unsafe=True)


def test_one_based_enumerate_and_a_compound_gate(acl307, at):
    source = """
    for i, (x, y) in enumerate(dl, start=1):
        (crit(model(x), y) / K).backward()
        if i % K == 0 and not args.dry_run:
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "i % K"))]
    fixed = acl307.fixed(source, unsafe=True)
    assert "if (i % K == 0 and not args.dry_run) or i == len(dl):" in fixed


def test_gates_with_a_last_batch_clause(acl307):
    for clause in (
        "or i + 1 == len(dl)",
        "or i == len(dl) - 1",
        "or is_last",
        "or accelerator.sync_gradients",
    ):
        assert acl307.findings(RAW.replace("== 0:", f"== 0 {clause}:")) == []


def test_last_batch_clause_through_a_named_flag(acl307):
    source = """
    for i, (x, y) in enumerate(dl):
        last = i + 1 == len(dl)
        (crit(model(x), y) / K).backward()
        if last or (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == []


def test_global_step_over_an_endless_loader(acl307):
    """Step-based training: windows span epochs on purpose."""
    source = """
    import itertools

    global_step = 0
    for batch in itertools.cycle(dl):
        (model(batch).loss / K).backward()
        global_step += 1
        if global_step % K == 0:
            opt.step()
            opt.zero_grad()
        if global_step >= max_steps:
            break
    """
    assert acl307.findings(source) == []


def test_counter_in_a_while_loop(acl307):
    source = """
    step = 0
    while step < max_steps:
        (model(next(it)).loss / K).backward()
        step += 1
        if step % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == []


def test_enumerate_over_an_iterator(acl307):
    source = """
    batches = iter(dl)
    for i, batch in enumerate(batches):
        (model(batch).loss / K).backward()
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == []


def test_accumulate_over_a_prepared_loader(acl307):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == []


def test_nanogpt_micro_step_loop(acl307):
    source = """
    while True:
        for micro_step in range(gradient_accumulation_steps):
            loss = model(X, Y) / gradient_accumulation_steps
            X, Y = get_batch("train")
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    """
    assert acl307.findings(source) == []


def test_tail_stepped_after_the_loop(acl307):
    source = """
    for epoch in range(epochs):
        for i, (x, y) in enumerate(dl):
            (crit(model(x), y) / N).backward()
            if (i + 1) % N == 0:
                opt.step()
                opt.zero_grad()
        if len(dl) % N:
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == []


def test_with_acl312_on_one_gate_the_fixes_compose():
    """Both fixes on `step % K == 0` give `(step + 1) % K == 0 or step + 1 == len(dl)`."""
    source = textwrap.dedent(
        """
        for step, batch in enumerate(dl):
            (model(batch).loss / K).backward()
            if step % K == 0:
                opt.step()
                opt.zero_grad()
        """
    )
    codes = ["ACL307", "ACL312"]
    assert {d.code for d in analyze_source(source, "snippet.py", codes)} == set(codes)
    outcome = fix_text(source, lambda text: analyze_source(text, "snippet.py", codes), True)
    assert outcome.error is None
    assert outcome.diagnostics == []
    assert outcome.text == source.replace(
        "if step % K == 0:", "if (step + 1) % K == 0 or step + 1 == len(dl):"
    )


def test_gate_before_the_backward_is_reported_without_fix(acl307, at):
    """A last-batch clause at the top of the loop would step before the last backward."""
    source = """
    for i, (x, y) in enumerate(dl):
        if i % K == 0:
            opt.step()
            opt.zero_grad()
        (crit(model(x), y) / K).backward()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "i % K"))]
    assert acl307.fixed(source, unsafe=True) == textwrap.dedent(source)


def test_trainer_loop_calling_a_training_step_method(acl307, at):
    source = """
    class Trainer:
        def training_step(self, batch):
            loss = self.model(batch).loss / self.args.gradient_accumulation_steps
            loss.backward()

        def train(self):
            for step, batch in enumerate(self.train_dataloader):
                self.training_step(batch)
                if (step + 1) % self.args.gradient_accumulation_steps == 0:
                    self.optimizer.step()
                    self.optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(step + 1) %"))]
    fixed = acl307.fixed(source, unsafe=True)
    assert "== 0 or step + 1 == len(self.train_dataloader):" in fixed


def _message(acl307, source: str) -> str:
    (diagnostic,) = acl307.diagnostics(source)
    return diagnostic.message


def test_message_counts_what_each_gate_spelling_leaves(acl307):
    """After its last update a gate leaves `(len + c) % K` micro-batches, c = first - 1 +
    offset - remainder: `len % K` for `(i + 1) % K == 0` and `i % K == K - 1`, `(len - 1) % K`
    for `i % K == 0`; a gate before the backward leaves one more."""
    cases = {
        "(i + 1) % K == 0": "the last `len(dl) % K` micro-batches",
        "i % K == K - 1": "the last `len(dl) % K` micro-batches",
        "i % K == 0": "the last `(len(dl) - 1) % K` micro-batches",
        "i % 4 == 3": "the last `len(dl) % 4` micro-batches",
    }
    for gate, left in cases.items():
        source = RAW.replace("(i + 1) % N == 0", gate).replace("/ N", "/ K")
        assert left in _message(acl307, source), gate
    one_based = RAW.replace("enumerate(dl)", "enumerate(dl, start=1)").replace(
        "(i + 1) % N == 0", "(i + 1) % 4 == 0"
    )
    assert "the last `(len(dl) + 1) % 4` micro-batches" in _message(acl307, one_based)
    before = """
    for epoch in range(epochs):
        for i, (x, y) in enumerate(dl):
            if i % K == 0:
                opt.step()
                opt.zero_grad()
            (crit(model(x), y) / K).backward()
    """
    message = _message(acl307, before)
    assert "the last `(len(dl) - 1) % K + 1` micro-batches of each epoch (at least one)" in message


def test_message_of_a_single_pass_says_the_tail_is_lost(acl307, at):
    source = """
    def train(model, optimizer, train_loader, accum_steps):
        for step, batch in enumerate(train_loader):
            (model(**batch).loss / accum_steps).backward()
            if (step + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(step + 1) %"))]
    assert "the only pass over the loader, so they are lost" in _message(acl307, source)


def test_message_of_a_zero_grad_in_the_epoch_loop_says_it_discards_the_tail(acl307, at):
    """A zero_grad at the start (or the end) of each epoch throws the tail's gradients away:
    they do not leak into the next epoch's first window."""
    for start in (True, False):
        lines = RAW.strip("\n").splitlines()
        zero = "    opt.zero_grad()"
        lines.insert(1, zero) if start else lines.append(zero)
        source = "\n".join(lines) + "\n"
        assert acl307.findings(source) == [("ACL307", *at(source, "(i + 1) % N"))]
        message = _message(acl307, source)
        assert "(`opt.zero_grad()` in the epoch loop discards them)" in message, start
    assert "they leak into the next epoch's first window" in _message(acl307, RAW)


ITERABLE = """
import torch
from torch.utils.data import DataLoader, IterableDataset


class PackedShards(IterableDataset):
    def __init__(self, paths, block_size):
        self.paths = paths
        self.block_size = block_size

    def __iter__(self):
        for path in self.paths:
            yield from torch.load(path).split(self.block_size)


def main(args, model, optimizer):
    train_dataset = PackedShards(args.shards, args.block_size)
    train_dataloader = DataLoader(train_dataset, batch_size=args.batch_size, num_workers=4)
    iter_num = 0
    for it, batch in enumerate(train_dataloader):
        loss = model(batch).loss / args.gradient_accumulation_steps
        loss.backward()
        if (it + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
        if iter_num > args.max_iters:
            break
"""


def test_loaders_without_a_length(acl307):
    """An epoch tail needs a loader that ends after `len(loader)` batches; `len()` raises on
    these, so a last-batch clause could not even be written (issue 22)."""
    assert acl307.findings(ITERABLE) == []
    assert acl307.findings(ITERABLE.replace("iter_num > args.max_iters", "loss.isnan()")) == []
    streaming = """
    from datasets import load_dataset
    from torch.utils.data import DataLoader

    def train(args, model, optimizer, collate):
        raw = load_dataset("HuggingFaceFW/fineweb", split="train", streaming=True)
        train_dataset = raw.shuffle(seed=args.seed, buffer_size=10_000).map(tokenize)
        train_dataloader = DataLoader(train_dataset, batch_size=8, collate_fn=collate)
        for epoch in range(args.num_epochs):
            for step, batch in enumerate(train_dataloader):
                (model(**batch).loss / args.grad_accum).backward()
                if (step + 1) % args.grad_accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
    """
    assert acl307.findings(streaming) == []
    generator = """
    import numpy as np

    def batches(path, batch_size, seq_len):
        data = np.memmap(path, dtype=np.uint16, mode="r")
        while True:
            yield sample(data, batch_size, seq_len)

    def train(model, opt, cfg):
        for epoch in range(cfg.epochs):
            for i, (x, y) in enumerate(batches(cfg.train_bin, cfg.batch_size, cfg.seq_len)):
                (model(x, y) / cfg.grad_accum_steps).backward()
                if (i + 1) % cfg.grad_accum_steps == 0:
                    opt.step()
                    opt.zero_grad()
    """
    assert acl307.findings(generator) == []
    prepared = """
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    def main(args, model, optimizer, stream_dataset):
        accelerator = Accelerator()
        train_loader = DataLoader(stream_dataset.to_iterable_dataset(num_shards=64), batch_size=8)
        model, optimizer, train_dl = accelerator.prepare(model, optimizer, train_loader)
        for epoch in range(args.epochs):
            for step, batch in enumerate(train_dl):
                accelerator.backward(model(**batch).loss / args.gradient_accumulation_steps)
                if (step + 1) % args.gradient_accumulation_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
    """
    assert acl307.findings(prepared) == []
    sharded = """
    import torch
    import webdataset as wds
    from datasets import load_dataset
    from datasets.distributed import split_dataset_by_node

    def train(args, rank, world_size, model, optimizer):
        stream = load_dataset("allenai/c4", "en", split="train", streaming=True)
        shard = split_dataset_by_node(stream, rank=rank, world_size=world_size)
        train_loader = torch.utils.data.DataLoader(shard, batch_size=8)
        if args.webdataset:
            train_loader = wds.WebLoader(wds.WebDataset(args.urls).decode("pil"), batch_size=None)
        for epoch in range(args.epochs):
            for i, batch in enumerate(train_loader):
                (model(batch).loss / args.accum_steps).backward()
                if (i + 1) % args.accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
    """
    assert acl307.findings(sharded) == []


def test_a_loader_with_a_length_on_every_binding_drops_its_tail(acl307, at):
    """A loader is lengthless when any of its bindings may be; with none of them, it is not."""
    source = """
    import torch
    from datasets import load_dataset

    def train(args, model, optimizer):
        dataset = load_dataset("allenai/c4", "en", split="train[:1%]", streaming=False)
        train_loader = torch.utils.data.DataLoader(dataset, batch_size=8)
        if args.tiny:
            train_loader = torch.utils.data.DataLoader(dataset.select(range(64)), batch_size=8)
        for epoch in range(args.epochs):
            for i, batch in enumerate(train_loader):
                (model(batch).loss / args.accum_steps).backward()
                if (i + 1) % args.accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(i + 1) %"))]


def test_a_map_style_loader_still_drops_its_tail(acl307, at):
    source = """
    from torch.utils.data import DataLoader, Dataset

    class Shards(Dataset):
        def __init__(self, blocks):
            self.blocks = blocks

        def __len__(self):
            return len(self.blocks)

        def __getitem__(self, i):
            return self.blocks[i]

    def main(args, model, optimizer):
        train_dataloader = DataLoader(Shards(args.blocks), batch_size=args.batch_size)
        for epoch in range(args.epochs):
            for it, batch in enumerate(train_dataloader):
                (model(batch).loss / args.gradient_accumulation_steps).backward()
                if (it + 1) % args.gradient_accumulation_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(it + 1) %"))]
    assert "or it + 1 == len(train_dataloader):" in acl307.fixed(source, unsafe=True)


def test_one_pass_ended_by_a_step_budget(acl307):
    """No epoch loop and a step budget: the windows have no epoch boundary to straddle."""
    source = """
    def train(args, model, optimizer, train_dataloader):
        completed_steps = 0
        for step, batch in enumerate(train_dataloader):
            loss = model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            if step % args.gradient_accumulation_steps == args.gradient_accumulation_steps - 1:
                optimizer.step()
                optimizer.zero_grad()
                completed_steps += 1
            if completed_steps >= args.max_train_steps:
                break
    """
    assert acl307.findings(source) == []


def test_a_step_budget_inside_an_epoch_loop_still_drops_each_epoch_tail(acl307, at):
    source = """
    def train(args, model, optimizer, train_dataloader):
        completed_steps = 0
        for epoch in range(args.num_train_epochs):
            for step, batch in enumerate(train_dataloader):
                loss = model(**batch).loss / args.gradient_accumulation_steps
                loss.backward()
                if (step + 1) % args.gradient_accumulation_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
                    completed_steps += 1
                if completed_steps >= args.max_train_steps:
                    break
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(step + 1) %"))]


# lit-llama's finetune/full.py: a budget of several epochs' worth over one pass of a sized loader.
EPOCH_BUDGET = """
import lightning as L
from torch.utils.data import DataLoader

devices = 4
batch_size = 128 // devices
micro_batch_size = 4
gradient_accumulation_iters = batch_size // micro_batch_size
epoch_size = 50000  # train dataset size
num_epochs = 5
max_iters = num_epochs * (epoch_size // micro_batch_size) // devices


def train(fabric: L.Fabric, model, optimizer, train_data) -> None:
    step_count = 0
    loader = fabric.setup_dataloaders(DataLoader(train_data, batch_size=micro_batch_size))
    for iter_num, (input_ids, targets) in enumerate(loader):
        if iter_num >= max_iters:
            break
        is_accumulating = (iter_num + 1) % gradient_accumulation_iters != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            loss = loss_fn(model(input_ids), targets)
            fabric.backward(loss / gradient_accumulation_iters)
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()
            step_count += 1
"""


def test_a_budget_sized_from_epochs_does_not_end_the_pass(acl307, at):
    """`num_epochs * (epoch_size // micro_batch_size)` is more than one pass: the loader ends
    first and its last `len % K` micro-batches are lost (issue 22's exemption was too wide)."""
    source = EPOCH_BUDGET
    assert acl307.findings(source) == [("ACL307", *at(source, "not is_accumulating"))]
    assert "the only pass over the loader, so they are lost" in _message(acl307, source)
    # lit-llama's lora.py: the same budget with the epochs written as literals
    samples = source.replace(
        "num_epochs * (epoch_size // micro_batch_size) // devices", "50000 * 3 // micro_batch_size"
    )
    assert acl307.findings(samples) == [("ACL307", *at(samples, "not is_accumulating"))]


def test_a_budget_sized_from_the_loader_length_does_not_end_the_pass(acl307, at):
    source = """
    import math

    def train(args, model, optimizer, train_dataloader):
        updates_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
        args.max_train_steps = args.num_train_epochs * updates_per_epoch
        completed_steps = 0
        for step, batch in enumerate(train_dataloader):
            loss = model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
                completed_steps += 1
            if completed_steps >= args.max_train_steps:
                break
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(step + 1) %"))]
    one_pass = """
    def train(model, opt, train_loader, accum_steps):
        max_steps = len(train_loader) // accum_steps
        for i, (x, y) in enumerate(train_loader):
            (model(x, y) / accum_steps).backward()
            if (i + 1) % accum_steps == 0:
                opt.step()
                opt.zero_grad()
            if i // accum_steps >= max_steps:
                break
    """
    assert acl307.findings(one_pass) == [("ACL307", *at(one_pass, "(i + 1) %"))]


def test_a_break_that_is_no_budget_does_not_end_the_pass(acl307, at):
    source = """
    def train(model, opt, train_loader, accum_steps):
        for i, (x, y) in enumerate(train_loader):
            loss = model(x, y) / accum_steps
            if not loss.isfinite():
                break
            loss.backward()
            if (i + 1) % accum_steps == 0:
                opt.step()
                opt.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(i + 1) %"))]
    in_the_gate = """
    def train(model, opt, train_loader, accum_steps):
        for i, (x, y) in enumerate(train_loader):
            loss = model(x, y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                opt.step()
                opt.zero_grad()
                if i % 100 == 0 and not loss.isfinite():
                    break
    """
    assert acl307.findings(in_the_gate) == [("ACL307", *at(in_the_gate, "(i + 1) %"))]


def test_a_plain_step_budget_over_one_pass(acl307):
    """A budget the code does not size from the data (a step-based run, lit-llama's pretrain
    `max_iters = 600000`) can come before the loader's end: no epoch tail to report."""
    pretrain = EPOCH_BUDGET.replace(
        "num_epochs * (epoch_size // micro_batch_size) // devices", "600000"
    )
    assert acl307.findings(pretrain) == []
    knob = """
    import time

    def train(cfg, model, optimizer, train_loader):
        start = time.time()
        for it, batch in enumerate(train_loader):
            (model(batch).loss / cfg.accum_steps).backward()
            if (it + 1) % cfg.accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if it + 1 >= cfg.max_steps or time.time() - start > cfg.time_limit:
                break
    """
    assert acl307.findings(knob) == []


DEEPSPEED = """
from accelerate import Accelerator


def train(args, ds_config, model, optimizer, train_dataloader, lr_scheduler):
    accelerator = Accelerator()
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    grad_accum = (
        ds_config["gradient_accumulation_steps"] if accelerator.state.deepspeed_plugin else 1
    )
    for epoch in range(args.num_train_epochs):
        for step, batch in enumerate(train_dataloader):
            loss = model(**batch).loss
            accelerator.backward(loss)
            if step % grad_accum == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
"""


def test_a_gate_whose_k_exceeds_one_only_under_deepspeed(acl307):
    """DeepSpeed's engine accumulates and steps itself (the prepared `step()` does nothing),
    and without it K is 1: the gate makes no window (issue 22)."""
    codes = ["ACL307", "ACL312", "ACL305", "ACL304"]
    assert analyze_source(textwrap.dedent(DEEPSPEED), "snippet.py", codes) == []
    inline = """
    def train(args, model, optimizer, train_dataloader):
        for epoch in range(args.epochs):
            for step, batch in enumerate(train_dataloader):
                (model(**batch).loss).backward()
                if (step + 1) % (args.gradient_accumulation_steps if args.deepspeed else 1) == 0:
                    optimizer.step()
                    optimizer.zero_grad()
    """
    assert acl307.findings(inline) == []


def test_a_k_above_one_without_deepspeed_is_a_window(acl307, at):
    source = DEEPSPEED.replace(
        'ds_config["gradient_accumulation_steps"] if accelerator.state.deepspeed_plugin else 1',
        "1 if accelerator.state.deepspeed_plugin else args.gradient_accumulation_steps",
    )
    assert acl307.findings(source) == [("ACL307", *at(source, "step % grad_accum"))]


def test_a_counter_restarted_for_each_epoch_counts_like_an_index(acl307, at):
    """`micro_step = 0` in the epoch loop counts the pass's micro-batches: the tail drops."""
    source = """
    for epoch in range(args.epochs):
        micro_step = 0
        for batch in tqdm(train_loader):
            (model(**batch).loss / args.grad_accum).backward()
            micro_step += 1
            if micro_step % args.grad_accum == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "micro_step %"))]
    assert "the last `len(train_loader) % args.grad_accum` micro-batches" in _message(
        acl307, source
    )
    fixed = acl307.fixed(source, unsafe=True)
    assert "if micro_step % args.grad_accum == 0 or micro_step == len(train_loader):" in fixed
    after = source.replace("            micro_step += 1\n", "").replace(
        "                optimizer.zero_grad()\n",
        "                optimizer.zero_grad()\n            micro_step += 1\n",
    )
    assert "the last `(len(train_loader) - 1) % args.grad_accum` micro-batches" in _message(
        acl307, after
    )
    assert "or micro_step + 1 == len(train_loader):" in acl307.fixed(after, unsafe=True)


def test_a_counter_set_once_before_all_epochs(acl307):
    """Set once, the counter runs across epochs: windows span the epoch boundary on purpose."""
    source = """
    micro_step = 0
    for epoch in range(args.epochs):
        for batch in train_loader:
            (model(**batch).loss / args.grad_accum).backward()
            micro_step += 1
            if micro_step % args.grad_accum == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl307.findings(source) == []


CONVNEXT = """
import torch


class NativeScaler:
    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler()

    def __call__(self, loss, optimizer, parameters=None, update_grad=True):
        self._scaler.scale(loss).backward()
        if update_grad:
            self._scaler.step(optimizer)
            self._scaler.update()


def train_one_epoch(model, criterion, data_loader, optimizer, loss_scaler, metric_logger, args):
    update_freq = args.update_freq
    optimizer.zero_grad()
    for data_iter_step, (x, y) in enumerate(metric_logger.log_every(data_loader, 20, "train")):
        loss = criterion(model(x), y)
        if args.use_amp:
            loss /= update_freq
            loss_scaler(loss, optimizer, parameters=model.parameters(),
                        update_grad=(data_iter_step + 1) % update_freq == 0)
            if (data_iter_step + 1) % update_freq == 0:
                optimizer.zero_grad()
        else:
            loss /= update_freq
            loss.backward()
            if (data_iter_step + 1) % update_freq == 0:
                optimizer.step()
                optimizer.zero_grad()


def main(args, model, criterion, data_loader, optimizer, metric_logger):
    loss_scaler = NativeScaler()
    for epoch in range(args.epochs):
        train_one_epoch(model, criterion, data_loader, optimizer, loss_scaler, metric_logger, args)
"""


def test_the_deit_family_engine_drops_its_tail(acl307, at):
    """ConvNeXt-V2/DeiT engines: `enumerate(metric_logger.log_every(data_loader, ...))` keeps
    the loader's length; the loss scaler's `update_grad=` and the fp32 branch's `if` gate alike,
    so neither flushes the other's tail; the zero_grad before the loop of the per-epoch function
    throws the tail away."""
    assert acl307.findings(CONVNEXT) == [("ACL307", *at(CONVNEXT, "(data_iter_step + 1) %", 2))]
    message = _message(acl307, CONVNEXT)
    assert "the last `len(data_loader) % update_freq` micro-batches" in message
    assert "(`optimizer.zero_grad()` outside the loop, run once an epoch, discards them)" in message


def test_micro_batches_past_the_last_full_window_skipped_on_purpose(acl307):
    """ConvNeXt: `step = data_iter_step // update_freq; if step >= steps_per_epoch: continue`
    runs only full windows (as `drop_last` does): no tail is computed, none is dropped."""
    skipping = CONVNEXT.replace(
        "        loss = criterion(model(x), y)\n",
        "        step = data_iter_step // update_freq\n"
        "        if step >= args.steps_per_epoch:\n"
        "            continue\n"
        "        loss = criterion(model(x), y)\n",
        1,
    )
    assert acl307.findings(skipping) == []
    inline = skipping.replace("        step = data_iter_step // update_freq\n", "").replace(
        "if step >= args.steps_per_epoch",
        "if data_iter_step // update_freq >= args.steps_per_epoch",
    )
    assert acl307.findings(inline) == []
