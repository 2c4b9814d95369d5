"""`--show-loops` facts of the distributed topic: DDP models and samplers a loop uses."""

from __future__ import annotations

import textwrap

from linter.analysis import describe_loops

SOURCE = """
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

model = Net()
if distributed:
    model = DDP(model)
sampler = DistributedSampler(ds)
loader = DataLoader(ds, sampler=sampler)
for epoch in range(3):
    sampler.set_epoch(epoch)
    for i, (x, y) in enumerate(loader):
        with model.no_sync() if (i + 1) % 4 else nullcontext():
            (crit(model(x), y) / 4).backward()
        if (i + 1) % 4 == 0:
            opt.step(); opt.zero_grad()
"""


def test_show_loops_lists_ddp_models_and_samplers():
    (loop,) = describe_loops(textwrap.dedent(SOURCE), "train.py")["loops"]
    assert loop["distributed"] == {
        "ddp_models": [
            {"name": "model", "line": 7, "forward_line": 14, "wrapped_on_every_path": False}
        ],
        "sync_control": True,
        "samplers": [
            {
                "name": "sampler",
                "line": 8,
                "loaders": ["loader"],
                "epoch_loops": [{"line": 10, "set_epoch": True}],
            }
        ],
    }
