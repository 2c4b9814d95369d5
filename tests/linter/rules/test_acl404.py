"""ACL404 sampler-set-epoch-missing: a shuffling DistributedSampler never told the epoch."""

from __future__ import annotations

SCRIPT = """
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sampler = DistributedSampler(train_ds, shuffle=True)
dl = DataLoader(train_ds, batch_size=32, sampler=sampler)
for epoch in range(epochs):
    SET_EPOCH
    for x, y in dl:
        crit(model(x), y).backward()
        opt.step(); opt.zero_grad()
"""


def test_epoch_loop_without_set_epoch_is_flagged_at_the_epoch_loop(acl404, at):
    source = SCRIPT.replace("    SET_EPOCH\n", "")
    assert acl404.findings(source) == [("ACL404", *at(source, "for epoch"))]
    (diagnostic,) = acl404.diagnostics(source)
    assert diagnostic.fix is None
    assert diagnostic.notes == ("call `sampler.set_epoch(epoch)` at the start of each epoch",)


def test_set_epoch_on_the_sampler_or_through_the_loader_is_not_flagged(acl404):
    for call in (
        "sampler.set_epoch(epoch)",
        "dl.sampler.set_epoch(epoch)",
        "dl.batch_sampler.sampler.set_epoch(epoch)",
        "if distributed: dl.sampler.set_epoch(epoch)",
    ):
        assert acl404.findings(SCRIPT.replace("SET_EPOCH", call)) == []


def test_set_epoch_on_another_sampler_does_not_count(acl404, at):
    source = SCRIPT.replace("SET_EPOCH", "val_sampler.set_epoch(epoch)").replace(
        "for epoch", "val_sampler = DistributedSampler(val_ds)\nfor epoch"
    )
    assert acl404.findings(source) == [("ACL404", *at(source, "for epoch"))]


def test_inline_sampler_and_batch_sampler(acl404, at):
    inline = """
    import torch

    loader = torch.utils.data.DataLoader(ds, sampler=torch.utils.data.DistributedSampler(ds))
    for epoch in range(10):
        for x, y in loader:
            crit(model(x), y).backward()
            opt.step()
    """
    batched = """
    import torch

    sampler = torch.utils.data.distributed.DistributedSampler(ds)
    batches = torch.utils.data.BatchSampler(sampler, 8, drop_last=True)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=batches)
    epoch = 0
    while epoch < 10:
        for x, y in loader:
            crit(model(x), y).backward()
            opt.step()
        epoch += 1
    """
    assert acl404.findings(inline) == [("ACL404", *at(inline, "for epoch"))]
    (diagnostic,) = acl404.diagnostics(inline)
    assert "`loader.sampler.set_epoch(epoch)`" in diagnostic.notes[0]
    assert acl404.findings(batched) == [("ACL404", *at(batched, "while epoch"))]


def test_pass_in_a_train_function_of_the_module(acl404, at):
    source = """
    from torch.utils.data import DataLoader, DistributedSampler

    def train_one_epoch(model, loader, opt):
        for x, y in loader:
            crit(model(x), y).backward()
            opt.step(); opt.zero_grad()

    def main():
        sampler = DistributedSampler(ds)
        loader = DataLoader(ds, batch_size=8, sampler=sampler)
        for epoch in range(10):
            train_one_epoch(model, loader, opt)
    """
    assert acl404.findings(source) == [("ACL404", *at(source, "for epoch"))]
    inside = source.replace(
        "    for x, y in loader:", "    loader.sampler.set_epoch(epoch)\n    for x, y in loader:"
    )
    assert acl404.findings(inside) == []


def test_imported_train_one_epoch_is_given_the_loader(acl404, at):
    source = """
    import torch
    from engine import train_one_epoch

    sampler_train = torch.utils.data.DistributedSampler(dataset_train, shuffle=True)
    data_loader_train = torch.utils.data.DataLoader(dataset_train, sampler=sampler_train)
    for epoch in range(args.epochs):
        SET_EPOCH
        train_one_epoch(model, data_loader_train, optimizer, epoch)
    """
    missing = source.replace("        SET_EPOCH\n", "")
    assert acl404.findings(missing) == [("ACL404", *at(missing, "for epoch"))]
    told = source.replace("SET_EPOCH", "data_loader_train.sampler.set_epoch(epoch)")
    assert acl404.findings(told) == []


def test_trainer_class(acl404, at):
    source = """
    from torch.utils.data import DataLoader, DistributedSampler

    class Trainer:
        def __init__(self, ds):
            self.sampler = DistributedSampler(ds)
            self.loader = DataLoader(ds, sampler=self.sampler)

        def fit(self, epochs):
            for epoch in range(epochs):
                for x, y in self.loader:
                    self.crit(self.model(x), y).backward()
                    self.opt.step()
    """
    assert acl404.findings(source) == [("ACL404", *at(source, "for epoch"))]


def test_set_epoch_in_a_helper_called_in_the_epoch_loop(acl404):
    source = SCRIPT.replace("SET_EPOCH", "start_epoch(dl, epoch)") + (
        "\ndef start_epoch(loader, epoch):\n    loader.sampler.set_epoch(epoch)\n"
    )
    assert acl404.findings(source) == []


HEADER_HELPER = """
from torch.utils.data import DataLoader, DistributedSampler

def begin_pass(loader, epoch):
    BODY
    return iter(loader)

sampler = DistributedSampler(ds, shuffle=True)
dl = DataLoader(ds, batch_size=16, sampler=sampler)
for epoch in range(epochs):
    for x, y in begin_pass(dl, epoch):
        crit(model(x), y).backward()
        opt.step(); opt.zero_grad()
"""


def test_helper_called_in_the_inner_loop_header_is_in_the_epoch_loop(acl404, at):
    told = HEADER_HELPER.replace("BODY", "loader.sampler.set_epoch(epoch)")
    assert acl404.findings(told) == []
    untold = HEADER_HELPER.replace("BODY", "print(epoch)")
    assert acl404.findings(untold) == [("ACL404", *at(untold, "for epoch"))]
    other = HEADER_HELPER.replace("BODY", "val_sampler.set_epoch(epoch)").replace(
        "for epoch", "val_sampler = DistributedSampler(val_ds)\nfor epoch"
    )
    assert acl404.findings(other) == [("ACL404", *at(other, "for epoch"))]


def test_must_not_flag_cases(acl404):
    shuffle_off = SCRIPT.replace("shuffle=True", "shuffle=False").replace("    SET_EPOCH\n", "")
    positional_off = SCRIPT.replace("shuffle=True", "None, None, False").replace(
        "    SET_EPOCH\n", ""
    )
    prepared = SCRIPT.replace("    SET_EPOCH\n", "").replace(
        "for epoch", "dl = accelerator.prepare(dl)\nfor epoch"
    )
    single_pass = """
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(ds)
    for x, y in DataLoader(ds, sampler=sampler):
        crit(model(x), y).backward()
        opt.step()
    """
    evaluation_only = """
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    val_loader = DataLoader(ds, sampler=DistributedSampler(ds))
    for epoch in range(3):
        with torch.no_grad():
            for x, y in val_loader:
                metric.update(model(x), y)
    """
    for source in (shuffle_off, positional_off, prepared, single_pass, evaluation_only):
        assert acl404.findings(source) == []
