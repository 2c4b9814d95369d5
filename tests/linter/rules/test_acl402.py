"""ACL402 world-size-loss-division: a loss divided by W although DDP already averages."""

from __future__ import annotations

import textwrap

import libcst
import pytest

from linter.analysis import analyze_source
from linter.fixer import fix_text

BASE = """
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net, device_ids=[rank])
world_size = dist.get_world_size()
for x, y in dl:
    loss = crit(model(x), y)
    DIVIDE
    loss.backward()
    opt.step(); opt.zero_grad()
"""


@pytest.mark.parametrize(
    "line",
    [
        "loss = loss / dist.get_world_size()",
        "loss = loss / torch.distributed.get_world_size()",
        "loss /= world_size",
        'loss = loss / int(os.environ["WORLD_SIZE"])',
        "loss = loss / args.world_size",
        "loss = loss / ws",
    ],
)
def test_world_size_spellings_are_flagged_and_the_line_removed(acl402, at, line):
    source = BASE.replace("DIVIDE", line).replace(
        "world_size = dist.get_world_size()", "world_size = ws = dist.get_world_size()"
    )
    source = source.replace("import os\n", "import os\nimport torch\n")
    reported = line if "/=" in line else line.removeprefix("loss = ")
    assert acl402.findings(source) == [("ACL402", *at(source, reported))]
    assert acl402.fixed(source) == textwrap.dedent(source).replace(f"    {line}\n", "")


def test_division_inside_the_forward_line_and_inline_backward(acl402, at):
    source = """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(net)
    for x, y in dl:
        loss = crit(model(x), y) / dist.get_world_size()
        loss.backward()
        (crit(model(x), y) / dist.get_world_size()).backward()
        opt.step()
    """
    assert acl402.findings(source) == [
        ("ACL402", *at(source, "crit(model(x), y) / dist")),
        ("ACL402", *at(source, "crit(model(x), y) / dist", 1)),
    ]
    fixed = acl402.fixed(source)
    assert "    loss = crit(model(x), y)\n    loss.backward()\n" in fixed
    assert "    crit(model(x), y).backward()\n" in fixed


def test_accelerate_num_processes(acl402, at):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        loss = model(**batch).loss / accelerator.num_processes
        accelerator.backward(loss)
        opt.step(); opt.zero_grad()
    """
    assert acl402.findings(source) == [("ACL402", *at(source, "model(**batch).loss /"))]
    assert "\n    loss = model(**batch).loss\n" in acl402.fixed(source)


def test_ddp_model_passed_to_a_train_function(acl402, at):
    source = """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train_one_epoch(model, loader, opt):
        for x, y in loader:
            loss = crit(model(x), y)
            loss = loss / dist.get_world_size()
            loss.backward()
            opt.step()

    def main():
        train_one_epoch(DDP(net), loader, opt)
        model = DDP(net)
        train_one_epoch(model, loader, opt)
    """
    assert acl402.findings(source) == [("ACL402", *at(source, "loss / dist"))]


def test_a_divided_value_read_elsewhere_gets_no_fix(acl402):
    source = BASE.replace("DIVIDE", "loss = loss / world_size").replace(
        "    opt.step()", "    log(loss.item())\n    opt.step()"
    )
    (diagnostic,) = acl402.diagnostics(source)
    assert diagnostic.fix is None
    assert "also read elsewhere" in diagnostic.notes[0]
    assert acl402.fixed(source) == textwrap.dedent(source)


@pytest.mark.parametrize(
    "line",
    [
        "log(loss.detach() / world_size)",
        "reduced = loss.detach().clone(); dist.all_reduce(reduced); reduced /= world_size",
        "loss = loss * world_size / n_tokens",
        "loss = loss / n_tokens",
    ],
)
def test_logging_copies_and_global_normalisation_are_not_flagged(acl402, line):
    assert acl402.findings(BASE.replace("DIVIDE", line)) == []


def test_manual_gradient_averaging_without_ddp_is_not_flagged(acl402):
    source = """
    import torch.distributed as dist

    for x, y in dl:
        loss = crit(model(x), y) / dist.get_world_size()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
    """
    assert acl402.findings(source) == []


def test_a_registered_comm_hook_is_not_flagged(acl402):
    source = BASE.replace("DIVIDE", "loss = loss / world_size").replace(
        "world_size = dist", "model.register_comm_hook(None, sum_hook)\nworld_size = dist"
    )
    assert acl402.findings(source) == []


def _fix_together(source: str, codes: list[str]) -> str:
    analyse = lambda text: analyze_source(text, "snippet.py", codes)  # noqa: E731
    outcome = fix_text(textwrap.dedent(source), analyse, False)
    assert outcome.error is None
    libcst.parse_module(outcome.text)
    assert fix_text(outcome.text, analyse, False).text == outcome.text
    return outcome.text


ACCUMULATING = """
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)
ws = dist.get_world_size()
for i, (x, y) in enumerate(dl):
    with nullcontext() if (i + 1) % K == 0 else model.no_sync():
        loss = crit(model(x), y) / DIVISOR
        loss.backward()
    if (i + 1) % K == 0:
        opt.step(); opt.zero_grad()
"""


def test_world_size_times_k_becomes_k_with_acl301():
    codes = ["ACL301", "ACL402"]
    source = ACCUMULATING.replace("DIVISOR", "(ws * K)")
    found = analyze_source(textwrap.dedent(source), "s.py", codes)
    assert [d.code for d in found] == ["ACL402"]
    fixed = _fix_together(source, codes)
    assert fixed == textwrap.dedent(source).replace("/ (ws * K)", "/ K")
    assert analyze_source(fixed, "s.py", codes) == []


def test_world_size_alone_becomes_k_with_acl301():
    codes = ["ACL301", "ACL402"]
    source = ACCUMULATING.replace("crit(model(x), y) / DIVISOR", "crit(model(x), y)").replace(
        "        loss.backward()", "        loss = loss / ws\n        loss.backward()"
    )
    fixed = _fix_together(source, codes)
    expected = (
        "        loss = crit(model(x), y)\n        loss = loss / K\n        loss.backward()\n"
    )
    assert expected in fixed
    assert "ws\n" not in fixed.split("ws = dist.get_world_size()")[1]
    assert analyze_source(fixed, "s.py", codes) == []
