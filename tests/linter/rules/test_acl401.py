"""ACL401 ddp-missing-no-sync: DDP all-reduces on every micro-step of a manual window."""

from __future__ import annotations

import textwrap

import libcst

from linter.analysis import analyze_source
from linter.fixer import fix_text

HEADER = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net, device_ids=[rank])
"""

PLAIN = (
    HEADER
    + """for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y) / N
    loss.backward()
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
"""
)

PLAIN_FIXED = """
from contextlib import nullcontext
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net, device_ids=[rank])
for i, (x, y) in enumerate(dl):
    with nullcontext() if (i + 1) % N == 0 else model.no_sync():
        loss = crit(model(x), y) / N
        loss.backward()
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
"""


def test_plain_loop_is_flagged_at_the_forward_and_fixed_unsafely(acl401, at):
    assert acl401.findings(PLAIN) == [("ACL401", *at(PLAIN, "model(x)"))]
    (diagnostic,) = acl401.diagnostics(PLAIN)
    assert diagnostic.fix.applicability == "unsafe"
    assert acl401.fixed(PLAIN) == textwrap.dedent(PLAIN)  # safe mode leaves it alone
    assert acl401.fixed(PLAIN, unsafe=True) == PLAIN_FIXED


def test_existing_nullcontext_import_and_stdlib_placement(acl401):
    imports = "import os\nfrom contextlib import nullcontext as nc\nimport torch\n"
    source = PLAIN.replace("import torch\n", imports)
    fixed = acl401.fixed(source, unsafe=True)
    assert "    with nc() if (i + 1) % N == 0 else model.no_sync():\n" in fixed
    assert fixed.count("import") == 4
    source = PLAIN.replace("import torch\n", "import os\nimport torch\n")
    fixed = acl401.fixed(source, unsafe=True)
    assert fixed.startswith("\nimport os\nfrom contextlib import nullcontext\nimport torch\n")


def test_torch_path_alias_and_trainer_class(acl401, at):
    source = """
    import torch

    class Trainer:
        def __init__(self, net, rank):
            self.model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank])

        def train(self, dl):
            for step, batch in enumerate(dl):
                out = self.model(batch["x"])
                loss = self.crit(out, batch["y"]) / self.accum
                loss.backward()
                if (step + 1) % self.accum == 0:
                    self.opt.step()
                    self.opt.zero_grad()
    """
    assert acl401.findings(source) == [("ACL401", *at(source, "self.model(batch"))]
    expected = (
        "            with nullcontext() if (step + 1) % self.accum == 0 "
        "else self.model.no_sync():\n"
        '                out = self.model(batch["x"])\n'
        '                loss = self.crit(out, batch["y"]) / self.accum\n'
        "                loss.backward()\n"
        "            if (step + 1) % self.accum == 0:\n"
    )
    assert expected in acl401.fixed(source, unsafe=True)


def test_model_wrapped_by_a_helper_and_passed_to_the_train_function(acl401, at):
    source = """
    from torch.nn.parallel import DistributedDataParallel as NativeDDP

    def wrap(m, rank):
        return NativeDDP(m, device_ids=[rank])

    def train(model, loader, opt, accum):
        for i, (x, y) in enumerate(loader):
            scaler.scale(crit(model(x), y) / accum).backward()
            if (i + 1) % accum == 0 or i + 1 == len(loader):
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()

    def main():
        model = wrap(net, rank)
        train(model, loader, opt, 4)
    """
    assert acl401.findings(source) == [("ACL401", *at(source, "model(x)"))]
    fixed = acl401.fixed(source, unsafe=True)
    expected = (
        "        with nullcontext() if (i + 1) % accum == 0 or i + 1 == len(loader) "
        "else model.no_sync():\n"
        "            scaler.scale(crit(model(x), y) / accum).backward()\n"
    )
    assert expected in fixed


def test_while_loop_with_a_counter_is_reported_without_a_fix(acl401, at):
    source = (
        HEADER
        + """micro = 0
while True:
    x, y = next(it)
    loss = crit(model(x), y) / K
    loss.backward()
    micro += 1
    if micro == K:
        opt.step(); opt.zero_grad()
        micro = 0
"""
    )
    assert acl401.findings(source) == [("ACL401", *at(source, "model(x)"))]
    (diagnostic,) = acl401.diagnostics(source)
    assert diagnostic.fix is None
    assert "counter that changes in between" in diagnostic.notes[0]


def test_micro_step_loop_gets_a_last_micro_step_condition(acl401, at):
    source = (
        HEADER
        + """while True:
    for micro_step in range(grad_accum):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / grad_accum
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
"""
    )
    assert acl401.findings(source) == [("ACL401", *at(source, "model(X, Y)"))]
    expected = (
        "    for micro_step in range(grad_accum):\n"
        "        with nullcontext() if micro_step == grad_accum - 1 else model.no_sync():\n"
        "            with ctx:\n"
        "                logits, loss = model(X, Y)\n"
        "                loss = loss / grad_accum\n"
        "            scaler.scale(loss).backward()\n"
        "    scaler.step(optimizer)\n"
    )
    assert expected in acl401.fixed(source, unsafe=True)


def test_no_sync_around_the_backward_only_is_flagged_at_the_context(acl401, at):
    source = (
        HEADER
        + """for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y) / N
    with model.no_sync():  # skip the all-reduce
        loss.backward()
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
"""
    )
    assert acl401.findings(source) == [("ACL401", *at(source, "model.no_sync()"))]
    expected = (
        "    with nullcontext() if (i + 1) % N == 0 else model.no_sync():  # skip the all-reduce\n"
        "        loss = crit(model(x), y) / N\n"
        "        loss.backward()\n"
        "    if (i + 1) % N == 0:\n"
    )
    assert expected in acl401.fixed(source, unsafe=True)


def test_accelerator_no_sync_around_the_backward_only(acl401, at):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for i, batch in enumerate(dl):
        loss = model(**batch).loss / K
        with accelerator.no_sync(model):
            accelerator.backward(loss)
        if (i + 1) % K == 0:
            opt.step(); opt.zero_grad()
    """
    assert acl401.findings(source) == [("ACL401", *at(source, "accelerator.no_sync(model)"))]
    assert "    with nullcontext() if (i + 1) % K == 0 else accelerator.no_sync(model):\n" + (
        "        loss = model(**batch).loss / K\n"
    ) in acl401.fixed(source, unsafe=True)


def test_forward_inside_the_no_sync_block_is_not_flagged(acl401):
    for context in (
        "model.no_sync()",
        "nullcontext() if (i + 1) % N == 0 else model.no_sync()",
    ):
        source = (
            HEADER
            + f"""for i, (x, y) in enumerate(dl):
    with {context}:
        loss = crit(model(x), y) / N
        loss.backward()
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
"""
        )
        assert acl401.findings(source) == []


def test_conditional_no_sync_with_forward_in_a_nested_helper(acl401):
    source = (
        HEADER
        + """for i, (x, y) in enumerate(dl):
    need_update = (i + 1) % N == 0

    def _forward():
        return crit(model(x), y) / N

    if not need_update:
        with model.no_sync():
            loss = _forward()
            loss.backward()
    else:
        loss = _forward()
        loss.backward()
        opt.step(); opt.zero_grad()
"""
    )
    assert acl401.findings(source) == []


def test_exit_stack_and_sync_toggle_count_as_no_sync(acl401):
    stack = (
        HEADER
        + """import contextlib
for i, (x, y) in enumerate(dl):
    with contextlib.ExitStack() as stack:
        if (i + 1) % N != 0:
            stack.enter_context(model.no_sync())
        loss = crit(model(x), y) / N
        loss.backward()
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
"""
    )
    toggle = (
        HEADER
        + """for micro_step in range(K):
    model.require_backward_grad_sync = micro_step == K - 1
    loss = crit(model(x), y) / K
    loss.backward()
opt.step()
"""
    )
    assert acl401.findings(stack) == []
    assert acl401.findings(toggle) == []


def test_accumulate_fsdp_deepspeed_and_sync_each_batch_are_not_flagged(acl401):
    accumulate = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model = torch.nn.parallel.DistributedDataParallel(net)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step(); opt.zero_grad()
    """
    fsdp = PLAIN.replace(
        "from torch.nn.parallel import DistributedDataParallel as DDP",
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP",
    ).replace("DDP(net", "FSDP(net")
    apex = PLAIN.replace("from torch.nn.parallel", "from apex.parallel")
    each_batch = PLAIN + "plugin = GradientAccumulationPlugin(num_steps=N, sync_each_batch=True)\n"
    deepspeed = """
    import deepspeed

    model_engine, opt, _, _ = deepspeed.initialize(model=net, config=cfg)
    for i, (x, y) in enumerate(dl):
        loss = crit(model_engine(x), y)
        model_engine.backward(loss)
        if (i + 1) % N == 0:
            model_engine.step()
    """
    for source in (accumulate, fsdp, apex, each_batch, deepspeed):
        assert acl401.findings(source) == []


def test_loops_without_accumulation_are_not_flagged(acl401):
    every_step = (
        HEADER
        + """for x, y in dl:
    crit(model(x), y).backward()
    opt.step(); opt.zero_grad()
"""
    )
    assert acl401.findings(every_step) == []
    assert acl401.findings(PLAIN.replace("% N", "% 1")) == []


def test_two_ddp_models_are_reported_without_a_fix(acl401, at):
    source = PLAIN.replace(
        "model = DDP(net, device_ids=[rank])",
        "model = DDP(net, device_ids=[rank])\nhead = DDP(h, device_ids=[rank])",
    ).replace("crit(model(x), y)", "crit(head(model(x)), y)")
    (diagnostic,) = acl401.diagnostics(source)
    assert diagnostic.fix is None and "several DDP models" in diagnostic.notes[0]


def _both(source: str, codes: list[str]) -> str:
    analyse = lambda text: analyze_source(text, "snippet.py", codes)  # noqa: E731
    outcome = fix_text(textwrap.dedent(source), analyse, True)
    assert outcome.error is None
    libcst.parse_module(outcome.text)
    assert fix_text(outcome.text, analyse, True).text == outcome.text
    return outcome.text


def test_composes_with_acl301_in_one_fix_pass():
    source = (
        HEADER
        + """for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y)
    loss.backward()
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
"""
    )
    codes = ["ACL301", "ACL401"]
    assert {d.code for d in analyze_source(textwrap.dedent(source), "s.py", codes)} == set(codes)
    fixed = _both(source, codes)
    assert fixed.endswith(
        "for i, (x, y) in enumerate(dl):\n"
        "    with nullcontext() if (i + 1) % N == 0 else model.no_sync():\n"
        "        loss = crit(model(x), y)\n"
        "        loss = loss / N\n"
        "        loss.backward()\n"
        "    if (i + 1) % N == 0:\n"
        "        opt.step(); opt.zero_grad()\n"
    )
    assert analyze_source(fixed, "s.py", codes) == []


def test_model_wrapped_only_on_distributed_runs_keeps_single_process_runs_working(acl401):
    source = """
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = Net()
    if distributed:
        model = DDP(model, device_ids=[rank])
    for i, (x, y) in enumerate(dl):
        loss = crit(model(x), y) / N
        loss.backward()
        if (i + 1) % N == 0:
            opt.step(); opt.zero_grad()
    """
    expected = (
        "    with nullcontext() if (i + 1) % N == 0 "
        'else getattr(model, "no_sync", nullcontext)():\n'
        "        loss = crit(model(x), y) / N\n"
    )
    assert expected in acl401.fixed(source, unsafe=True)
    inline = source.replace(
        "if distributed:\n        model = DDP(model, device_ids=[rank])",
        "model = DDP(model) if distributed else model",
    )
    assert 'getattr(model, "no_sync", nullcontext)()' in acl401.fixed(inline, unsafe=True)


def test_per_batch_function(acl401, at):
    gated_inside = """
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train_step(model, batch, step):
        loss = crit(model(batch["x"]), batch["y"]) / K
        loss.backward()
        if (step + 1) % K == 0:
            opt.step(); opt.zero_grad()

    def main():
        model = DDP(net)
        for step, batch in enumerate(dl):
            train_step(model, batch, step)
    """
    assert acl401.findings(gated_inside) == [("ACL401", *at(gated_inside, "model(batch"))]
    assert "    with nullcontext() if (step + 1) % K == 0 else model.no_sync():\n" in (
        acl401.fixed(gated_inside, unsafe=True)
    )
    gated_by_caller = """
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train_step(model, batch):
        loss = crit(model(batch["x"]), batch["y"]) / K
        loss.backward()

    def main():
        model = DDP(net)
        for step, batch in enumerate(dl):
            train_step(model, batch)
            if (step + 1) % K == 0:
                opt.step(); opt.zero_grad()
    """
    (diagnostic,) = acl401.diagnostics(gated_by_caller)
    assert diagnostic.fix is None and "calls this function every micro-step" in diagnostic.notes[0]


def test_teacher_forward_without_gradients_is_not_the_one_reported(acl401, at):
    source = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    teacher = DDP(teacher_net)
    student = DDP(student_net)
    for i, (x, y) in enumerate(dl):
        with torch.no_grad():
            soft = teacher(x)
        loss = distill(student(x), soft, y) / N
        loss.backward()
        if (i + 1) % N == 0:
            opt.step(); opt.zero_grad()
    """
    assert acl401.findings(source) == [("ACL401", *at(source, "student(x)"))]
    frozen = source.replace("student = DDP(student_net)", "student = student_net")
    assert acl401.findings(frozen) == []


def test_per_batch_function_whose_caller_controls_the_sync(acl401):
    source = """
    import functools
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Trainer:
        def training_step(self, model, batch):
            loss = model(**batch).loss / self.accum
            loss.backward()

        def train(self):
            model = DDP(self.net)
            for step, batch in enumerate(self.dl):
                last = (step + 1) % self.accum == 0
                sync_context = functools.partial(self.accelerator.no_sync, model=model)
                with contextlib.nullcontext() if last else sync_context():
                    self.training_step(model, batch)
                if last:
                    self.opt.step()
    """
    assert acl401.findings(source) == []


def test_model_handed_to_helpers_that_do_not_run_it(acl401, at):
    source = (
        HEADER
        + """from utils import unwrap_ddp, compute_loss
for i, (x, y) in enumerate(dl):
    raw = unwrap_ddp(model)
    loss = compute_loss(model, x, y) / N
    loss.backward()
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
"""
    )
    assert acl401.findings(source) == [("ACL401", *at(source, "compute_loss(model"))]


def test_forward_that_runs_only_on_the_update_step(acl401):
    source = (
        HEADER
        + """for i, (x, y) in enumerate(dl):
    loss = crit(disc(x), y) / N
    loss.backward()
    if (i + 1) % N != 0:
        continue
    (crit(model(x), y)).backward()
    opt.step(); opt.zero_grad()
"""
    )
    assert acl401.findings(source) == []


HELD_IN_A_NAME = """
from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

class Runner:
    def __init__(self, net, rank, k):
        self.ddp = DDP(net, device_ids=[rank])
        self.amp = torch.amp.GradScaler("cuda")
        self.k = k

    def epoch(self, batches):
        for n, (src, tgt) in enumerate(batches):
            final = (n + 1) % self.k == 0
            BEFORE
            loss = self.loss_fn(self.ddp(src), tgt)
            AFTER
            with sync_ctx:
                self.amp.scale(loss / self.k).backward()
            if final:
                self.amp.step(self.opt)
                self.amp.update()
"""


def test_no_sync_held_in_a_name_around_the_backward_only(acl401, at):
    binding = "sync_ctx = nullcontext() if final else self.ddp.no_sync()"
    after = HELD_IN_A_NAME.replace("            BEFORE\n", "").replace("AFTER", binding)
    assert acl401.findings(after) == [("ACL401", *at(after, "sync_ctx:"))]
    (diagnostic,) = acl401.diagnostics(after)
    assert diagnostic.message.startswith(
        "`with sync_ctx:` (`sync_ctx` may be `self.ddp.no_sync()`, line 17) holds the backward"
    )
    assert diagnostic.fix is None
    assert diagnostic.notes == (
        "no fix: bind `sync_ctx` first, then move the forward into `with sync_ctx:`",
    )
    before = HELD_IN_A_NAME.replace("BEFORE", binding).replace("            AFTER\n", "")
    assert acl401.findings(before) == [("ACL401", *at(before, "sync_ctx:"))]
    expected = (
        "            with sync_ctx:\n"
        "                loss = self.loss_fn(self.ddp(src), tgt)\n"
        "                self.amp.scale(loss / self.k).backward()\n"
        "            if final:\n"
    )
    assert expected in acl401.fixed(before, unsafe=True)
    plain = after.replace("nullcontext() if final else self.ddp.no_sync()", "self.ddp.no_sync()")
    assert acl401.findings(plain) == [("ACL401", *at(plain, "sync_ctx:"))]
    (diagnostic,) = acl401.diagnostics(plain)
    assert diagnostic.fix is None


def test_no_sync_held_in_a_name_around_the_forward_is_not_flagged(acl401):
    binding = "sync_ctx = nullcontext() if final else self.ddp.no_sync()"
    source = HELD_IN_A_NAME.replace("BEFORE", binding).replace("            AFTER\n", "")
    source = source.replace(
        "            loss = self.loss_fn(self.ddp(src), tgt)\n            with sync_ctx:\n",
        "            with sync_ctx:\n                loss = self.loss_fn(self.ddp(src), tgt)\n",
    )
    assert "with sync_ctx:\n                loss" in source
    assert acl401.findings(source) == []


def test_forward_through_module_is_acl405s_finding_not_acl401s(acl401, acl405, at):
    source = (
        HEADER
        + """from contextlib import nullcontext
for i, (x, lens, y) in enumerate(dl):
    update = (i + 1) % N == 0
    FORWARD_OUT
    with (nullcontext() if update else model.no_sync()):
        FORWARD_IN
        (crit(out, y) / N).backward()
    if update:
        opt.step(); opt.zero_grad()
"""
    )
    forward = "out = model.module(x, lens)"
    inside = source.replace("    FORWARD_OUT\n", "").replace("FORWARD_IN", forward)
    outside = source.replace("FORWARD_OUT", forward).replace("        FORWARD_IN\n", "")
    for bypassed in (inside, outside):
        assert acl401.findings(bypassed) == []
        assert acl405.findings(bypassed) == [("ACL405", *at(bypassed, "model.module("))]
    # once ACL405's fix calls the wrapper, a forward left outside `no_sync` is ACL401's again
    fixed = outside.replace("model.module(x, lens)", "model(x, lens)")
    assert acl401.findings(fixed) == [("ACL401", *at(fixed, "model.no_sync()"))]


def test_no_sync_chosen_in_if_branches_and_a_criterion_handed_the_model(acl401, at):
    source = (
        HEADER
        + """from contextlib import nullcontext
for i, batch in enumerate(dl):
    if (i + 1) % N != 0:
        quiet = model.no_sync()
    else:
        quiet = nullcontext()
    FORWARD_OUT
    with quiet:
        FORWARD_IN
        scaler.scale(loss).backward()
    if (i + 1) % N == 0:
        scaler.step(opt); scaler.update()
"""
    )
    forward = "loss, stats = objective(model, batch)"
    outside = source.replace("FORWARD_OUT", forward).replace("        FORWARD_IN\n", "")
    assert acl401.findings(outside) == [("ACL401", *at(outside, "quiet:"))]
    (diagnostic,) = acl401.diagnostics(outside)
    assert "(`quiet` may be `model.no_sync()`, line 9)" in diagnostic.message
    inside = source.replace("    FORWARD_OUT\n", "").replace("FORWARD_IN", forward)
    assert acl401.findings(inside) == []


# FSDP2 (`fully_shard`) --------------------------------------------------------------------------
FSDP2 = """
import torch
from torch.distributed.fsdp import fully_shard

model = Net()
for block in model.layers:
    fully_shard(block)
fully_shard(model)
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y) / N
    loss.backward()
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
"""


def test_fsdp2_accumulation_without_the_sync_switch_is_an_info_hint(acl401, at):
    (diagnostic,) = acl401.diagnostics(FSDP2)
    assert (diagnostic.code, diagnostic.severity, diagnostic.fix) == ("ACL401", "info", None)
    assert (diagnostic.start.line, diagnostic.start.column) == at(FSDP2, "model(x)")
    assert diagnostic.message == (
        "FSDP2 model `model` (sharded on line 8) reduce-scatters its gradients on every "
        "micro-step, but the optimizer steps only every `N` micro-steps: call "
        "`model.set_requires_gradient_sync(False)` before the other micro-steps' backward and "
        "`True` before the last one's (that keeps their unsharded gradients in memory until then)"
    )


def test_fsdp2_spellings_bound_or_aliased_are_hinted(acl401, at):
    bound = FSDP2.replace("fully_shard(model)\n", "model = fully_shard(model)\n")
    aliased = FSDP2.replace(
        "from torch.distributed.fsdp import fully_shard", "import torch.distributed.fsdp as fsdp"
    ).replace("fully_shard(", "fsdp.fully_shard(")
    composable = FSDP2.replace("torch.distributed.fsdp", "torch.distributed._composable.fsdp")
    for source in (bound, aliased, composable):
        assert acl401.findings(source) == [("ACL401", *at(source, "model(x)"))], source


def test_fsdp2_with_the_sync_switch_or_without_accumulation_is_not_flagged(acl401):
    switched = FSDP2.replace(
        "    loss = crit(",
        "    model.set_requires_gradient_sync((i + 1) % N == 0)\n    loss = crit(",
    )
    helper = FSDP2.replace(
        "for i, (x, y) in enumerate(dl):\n",
        "def sync(m, on):\n    m.set_requires_gradient_sync(on)\n\n"
        "for i, (x, y) in enumerate(dl):\n    sync(model, (i + 1) % N == 0)\n",
    )
    every_step = FSDP2.replace(
        "    if (i + 1) % N == 0:\n        opt.step()", "    if True:\n        opt.step()"
    )
    only_blocks = FSDP2.replace("fully_shard(model)\n", "")  # `model` itself was never sharded
    not_torch = FSDP2.replace("from torch.distributed.fsdp import", "from mylib import")
    for source in (switched, helper, every_step, only_blocks, not_torch):
        assert acl401.findings(source) == [], source


# Sync switches the loop reaches through a helper or a framework (issue 22) ------------------
EDM_HELPER = """
import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


@contextlib.contextmanager
def ddp_sync(module, sync):
    assert isinstance(module, torch.nn.Module)
    if sync or not isinstance(module, DDP):
        yield
    else:
        with module.no_sync():
            yield

"""

EDM_LOOP = """
def training_loop(net, loss_fn, optimizer, dataset_iterator, batch_gpu, num_accumulation_rounds):
    ddp = DDP(net, device_ids=[device], broadcast_buffers=False)
    while True:
        optimizer.zero_grad(set_to_none=True)
        for round_idx in range(num_accumulation_rounds):
            with ddp_sync(ddp, (round_idx == num_accumulation_rounds - 1)):
                images, labels = next(dataset_iterator)
                loss = loss_fn(net=ddp, images=images, labels=labels)
                loss.sum().mul(1 / (batch_gpu * num_accumulation_rounds)).backward()
        optimizer.step()
"""


def test_context_manager_of_the_module_that_enters_no_sync_counts_as_no_sync(acl401):
    """NVlabs EDM / StyleGAN: `ddp_sync(module, sync)` enters `module.no_sync()` unless `sync`."""
    keyword = EDM_LOOP.replace("ddp_sync(ddp, (", "ddp_sync(module=ddp, sync=(")
    imported_decorator = (
        (EDM_HELPER + EDM_LOOP)
        .replace("import contextlib\n", "from contextlib import contextmanager\n")
        .replace("@contextlib.contextmanager", "@contextmanager")
    )
    unconditional = (EDM_HELPER + EDM_LOOP).replace(
        "    if sync or not isinstance(module, DDP):\n        yield\n    else:\n"
        "        with module.no_sync():\n            yield\n",
        "    with module.no_sync():\n        yield\n",
    )
    for source in (EDM_HELPER + EDM_LOOP, EDM_HELPER + keyword, imported_decorator):
        assert acl401.findings(source) == [], source
    assert acl401.findings(unconditional) == []


def test_context_manager_class_with_enter_that_enters_no_sync(acl401):
    source = """
    import torch
    from torch.nn.parallel import DistributedDataParallel


    class GradSync:
        def __init__(self, module, sync):
            self.module = module
            self.sync = sync
            self._inner = None

        def __enter__(self):
            if not self.sync:
                self._inner = self.module.no_sync()
                self._inner.__enter__()

        def __exit__(self, *exc):
            if self._inner is not None:
                self._inner.__exit__(*exc)


    def train(net, loader, optimizer, accum_steps):
        model = DistributedDataParallel(net)
        for step, (x, y) in enumerate(loader):
            with GradSync(model, sync=(step + 1) % accum_steps == 0):
                loss = torch.nn.functional.cross_entropy(model(x), y) / accum_steps
                loss.backward()
            if (step + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl401.findings(source) == []


def test_helper_context_manager_that_does_not_enter_no_sync_is_still_flagged(acl401, at):
    timer = (EDM_HELPER + EDM_LOOP).replace(
        "        with module.no_sync():\n            yield\n", "        yield\n"
    )
    assert acl401.findings(timer) == [("ACL401", *at(timer, "loss_fn(net=ddp"))]


def test_helper_context_manager_around_the_backward_only_is_too_late(acl401, at):
    late = EDM_HELPER + EDM_LOOP.replace(
        """            with ddp_sync(ddp, (round_idx == num_accumulation_rounds - 1)):
                images, labels = next(dataset_iterator)
                loss = loss_fn(net=ddp, images=images, labels=labels)
""",
        """            images, labels = next(dataset_iterator)
            loss = loss_fn(net=ddp, images=images, labels=labels)
            with ddp_sync(ddp, (round_idx == num_accumulation_rounds - 1)):
""",
    )
    (diagnostic,) = acl401.diagnostics(late)
    assert (diagnostic.start.line, diagnostic.start.column) == at(late, "ddp_sync(ddp, (")
    assert "holds the backward but not `ddp`'s forward" in diagnostic.message


MISC_LOOP = """
import torch
from torch_utils import misc
from torch_utils import training_stats


def training_loop(net, loss_fn, optimizer, dataset_iterator, batch_gpu, num_accumulation_rounds):
    ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[device])
    while True:
        optimizer.zero_grad(set_to_none=True)
        for round_idx in range(num_accumulation_rounds):
            with misc.ddp_sync(ddp, (round_idx == num_accumulation_rounds - 1)):
                images, labels = next(dataset_iterator)
                loss = loss_fn(net=ddp, images=images, labels=labels)
                training_stats.report("Loss/loss", loss)
                loss.sum().mul(1 / (batch_gpu * num_accumulation_rounds)).backward()
        optimizer.step()
"""


def test_imported_context_manager_handed_the_model_is_not_flagged(acl401):
    """A helper of another project module cannot be read: one handed the DDP model around the
    forward and the backward may well enter `no_sync`, so the loop is not flagged."""
    from_import = (
        MISC_LOOP.replace("from torch_utils import misc\n", "")
        .replace(
            "from torch_utils import training_stats\n",
            "from torch_utils import training_stats\nfrom torch_utils.misc import ddp_sync\n",
        )
        .replace("misc.ddp_sync(", "ddp_sync(")
    )
    for source in (MISC_LOOP, from_import):
        assert acl401.findings(source) == [], source


def test_imported_context_manager_not_handed_the_model_or_not_around_the_forward(acl401, at):
    profiled = MISC_LOOP.replace("misc.ddp_sync(ddp, (", "misc.record_section('round', (")
    assert acl401.findings(profiled) == [("ACL401", *at(profiled, "loss_fn(net=ddp"))]
    torch_context = MISC_LOOP.replace(
        "misc.ddp_sync(ddp, (round_idx == num_accumulation_rounds - 1))",
        "torch.autograd.graph.save_on_cpu(ddp)",
    )
    assert acl401.findings(torch_context) == [("ACL401", *at(torch_context, "loss_fn(net=ddp"))]
    backward_only = MISC_LOOP.replace(
        """            with misc.ddp_sync(ddp, (round_idx == num_accumulation_rounds - 1)):
                images, labels = next(dataset_iterator)
                loss = loss_fn(net=ddp, images=images, labels=labels)
""",
        """            images, labels = next(dataset_iterator)
            loss = loss_fn(net=ddp, images=images, labels=labels)
            with misc.ddp_sync(ddp, (round_idx == num_accumulation_rounds - 1)):
""",
    )
    assert acl401.findings(backward_only) == [("ACL401", *at(backward_only, "loss_fn(net=ddp"))]


LITGPT = """
import lightning as L
import torch
from lightning.fabric.strategies import FSDPStrategy, ModelParallelStrategy


def parallelize_fn(model, device_mesh, activation_checkpointing=True):
    from torch.distributed._composable.fsdp.fully_shard import fully_shard

    dp_mesh = device_mesh["data_parallel"]
    for m in reversed(list(model.modules())):
        if isinstance(m, Block):
            fully_shard(m, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def fit(fabric, state, train_dataloader, train):
    model = state["model"]
    optimizer = state["optimizer"]
    for iter_num, batch in enumerate(train_dataloader):
        is_accumulating = (iter_num + 1) % train.gradient_accumulation_iters(devices) != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            logits = model(batch["input_ids"])
            loss = chunked_cross_entropy(logits, batch["labels"])
            fabric.backward(loss / train.gradient_accumulation_iters(devices))
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()


def main(fabric, train, config):
    model = GPT(config)
    model = fabric.setup(model)
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=3e-4))
    fit(fabric, {"model": model, "optimizer": optimizer}, train_dataloader, train)


if __name__ == "__main__":
    strategy = ModelParallelStrategy(parallelize_fn=parallelize_fn)
    fabric = L.Fabric(devices=4, strategy=strategy, precision="bf16-true")
    fabric.launch(main, train, config)
"""


def test_lightning_fabric_no_backward_sync_counts_as_no_sync(acl401):
    """litgpt / lit-llama: `fabric.no_backward_sync(model, enabled=is_accumulating)`; the
    `model` that `parallelize_fn` shards is that function's parameter, not `fit`'s `model`."""
    positional = LITGPT.replace("enabled=is_accumulating", "is_accumulating")
    ddp = LITGPT.replace("ModelParallelStrategy(parallelize_fn=parallelize_fn)", '"ddp"')
    lit_llama = """
    import lightning as L

    fabric = L.Fabric(accelerator="cuda", devices=2, strategy="ddp", precision="bf16-mixed")
    model = fabric.setup(model)
    for iter_num in range(max_iters):
        input_ids, targets = get_batch(fabric, train_data)
        is_accumulating = (iter_num + 1) % gradient_accumulation_iters != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            logits = model(input_ids)
            loss = loss_fn(logits, targets)
            fabric.backward(loss / gradient_accumulation_iters)
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()
    """
    for source in (LITGPT, positional, ddp, lit_llama):
        assert acl401.findings(source) == [], source


def test_parameter_of_another_function_is_not_the_training_loops_model(acl401, at):
    # the loop has no sync switch at all: still, `parallelize_fn`'s `model` is not `fit`'s
    without_switch = LITGPT.replace(
        "        with fabric.no_backward_sync(model, enabled=is_accumulating):\n"
        '            logits = model(batch["input_ids"])\n'
        '            loss = chunked_cross_entropy(logits, batch["labels"])\n'
        "            fabric.backward(",
        '        logits = model(batch["input_ids"])\n'
        '        loss = chunked_cross_entropy(logits, batch["labels"])\n'
        "        fabric.backward(",
    )
    assert "no_backward_sync" not in without_switch
    assert acl401.findings(without_switch) == []
    setup_helper = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP


    def setup(model, rank):
        model = model.to(rank)
        model = DDP(model, device_ids=[rank])
        return model


    def train_epoch(model, loader, optimizer, accum_steps):
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y) / accum_steps
            loss.backward()
            if (step + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl401.findings(setup_helper) == []
    # the same helper, when this module hands its result to the loop, is the loop's model
    called = setup_helper + (
        "\n    def main(net, rank, loader, optimizer):\n"
        "        model = setup(net, rank)\n"
        "        train_epoch(model, loader, optimizer, 4)\n"
    )
    assert acl401.findings(called) == [("ACL401", *at(called, "model(x)"))]


def test_fsdp2_sharded_by_a_helper_the_loop_calls_is_hinted(acl401, at):
    source = """
    import torch
    from torch.distributed.fsdp import fully_shard


    def shard(model, mesh):
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)


    def train(model, mesh, loader, optimizer, grad_accum_steps):
        shard(model, mesh)
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y) / grad_accum_steps
            loss.backward()
            if (step + 1) % grad_accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl401.findings(source) == [("ACL401", *at(source, "model(x)"))]
    elsewhere = source.replace("        shard(model, mesh)\n", "")
    assert acl401.findings(elsewhere) == []


def test_fabric_no_backward_sync_around_the_backward_only_is_left_to_the_strategy(acl401):
    """Fabric's switch is DDP's `no_sync` (read in the forward) or FSDP's (read in the
    backward) depending on the strategy: a block around the backward only is not reported."""
    source = """
    import lightning as L

    fabric = L.Fabric(devices=8, strategy="fsdp")
    model = fabric.setup(model)
    for iter_num, (x, y) in enumerate(loader):
        is_accumulating = (iter_num + 1) % grad_accum != 0
        loss = loss_fn(model(x), y)
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            fabric.backward(loss / grad_accum)
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl401.findings(source) == []


def test_accelerator_no_sync_around_the_forward_by_feature_style(acl401):
    """accelerate's by_feature examples: `no_sync` on the non-final micro-steps, with the
    forward inside, and a plain micro-step that syncs."""
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            if (step + 1) % gradient_accumulation_steps != 0:
                with accelerator.no_sync(model):
                    outputs = model(**batch)
                    loss = outputs.loss / gradient_accumulation_steps
                    accelerator.backward(loss)
            else:
                outputs = model(**batch)
                loss = outputs.loss / gradient_accumulation_steps
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
    """
    assert acl401.findings(source) == []


TRAINER_HELPER = """
import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, net, rank, accum_steps):
        self.model = DDP(net.to(rank), device_ids=[rank])
        self.accum_steps = accum_steps

    @contextlib.contextmanager
    def maybe_no_sync(self, model, sync):
        if sync:
            yield
        else:
            with model.no_sync():
                yield

    def train_epoch(self, loader, optimizer):
        for step, (x, y) in enumerate(loader):
            sync = (step + 1) % self.accum_steps == 0
            with self.maybe_no_sync(self.model, sync):
                loss = torch.nn.functional.cross_entropy(self.model(x), y) / self.accum_steps
                loss.backward()
            if sync:
                optimizer.step()
                optimizer.zero_grad()
"""


def test_context_manager_method_of_the_trainer_that_enters_no_sync(acl401, at):
    assert acl401.findings(TRAINER_HELPER) == []
    never = TRAINER_HELPER.replace("with model.no_sync():", "if model.training:")
    assert acl401.findings(never) == [("ACL401", *at(never, "self.model(x)"))]


RETURNED_CONTEXT = """
from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def sync_context(model, sync):
    return nullcontext() if sync else model.no_sync()


def train(net, loader, optimizer, accum_steps):
    model = DDP(net)
    for step, (x, y) in enumerate(loader):
        sync = (step + 1) % accum_steps == 0
        with sync_context(model, sync):
            loss = torch.nn.functional.cross_entropy(model(x), y) / accum_steps
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_function_of_the_module_that_returns_no_sync_counts_as_no_sync(acl401, at):
    assert acl401.findings(RETURNED_CONTEXT) == []
    never = RETURNED_CONTEXT.replace(
        "return nullcontext() if sync else model.no_sync()", "return nullcontext()"
    )
    assert acl401.findings(never) == [("ACL401", *at(never, "model(x)"))]


def test_returned_no_sync_around_the_optimizer_step_is_acl405s(acl405, at):
    """An unconditional `no_sync` returned by a helper, around the step too: ACL405 sees it."""
    source = RETURNED_CONTEXT.replace(
        "return nullcontext() if sync else model.no_sync()", "return model.no_sync()"
    ).replace(
        "            loss.backward()\n        if sync:\n            optimizer.step()",
        "            loss.backward()\n            optimizer.step()",
    )
    assert "            optimizer.step()\n            optimizer.zero_grad()" in source
    assert acl405.findings(source) == [("ACL405", *at(source, "sync_context(model, sync)", 1))]


LAZY_GAN = """
import torch
from torch import nn

generator = nn.parallel.DistributedDataParallel(Generator(size).to(device), device_ids=[rank])
discriminator = nn.parallel.DistributedDataParallel(Discriminator(size).cuda(), device_ids=[rank])
g_optim = torch.optim.Adam(generator.parameters(), lr=args.lr, betas=(0, 0.99))
d_optim = torch.optim.Adam(discriminator.parameters(), lr=args.lr, betas=(0, 0.99))
for i in range(args.start_iter, args.iter):
    real_img = next(loader).to(device)
    fake_img, _ = generator(mixing_noise(args.batch, args.latent, args.mixing, device))
    d_loss = d_logistic_loss(discriminator(real_img), discriminator(fake_img))
    discriminator.zero_grad()
    d_loss.backward()
    d_optim.step()
    if i % args.d_reg_every == 0:
        real_img.requires_grad = True
        real_pred = discriminator(real_img)
        discriminator.zero_grad()
        (args.r1 / 2 * d_r1_loss(real_pred, real_img) * args.d_reg_every).backward()
        d_optim.step()
    fake_img, _ = generator(mixing_noise(args.batch, args.latent, args.mixing, device))
    g_loss = g_nonsaturating_loss(discriminator(fake_img))
    generator.zero_grad()
    g_loss.backward()
    g_optim.step()
    if i % args.g_reg_every == 0:
        fake_img, latents = generator(noise, return_latents=True)
        path_loss, mean_path_length, _ = g_path_regularize(fake_img, latents, mean_path_length)
        generator.zero_grad()
        (args.path_regularize * args.g_reg_every * path_loss).backward()
        g_optim.step()
"""


def test_lazy_regularisation_blocks_are_not_accumulation_windows(acl401):
    # StyleGAN2: both networks step (and all-reduce) every iteration; a `no_sync` would break
    assert acl401.findings(LAZY_GAN) == []


def test_generator_accumulated_into_its_lazy_step_is_flagged(acl401, at):
    # G steps only in the gated block and is not zeroed there: a real window of g_reg_every
    source = (
        LAZY_GAN.replace(
            "    generator.zero_grad()\n    g_loss.backward()\n    g_optim.step()\n",
            "    g_loss.backward()\n",
        )
        .replace("        generator.zero_grad()\n", "")
        .replace(
            "        g_optim.step()\n", "        g_optim.step()\n        generator.zero_grad()\n"
        )
    )
    assert acl401.findings(source) == [
        ("ACL401", *at(source, "generator(mixing_noise(args.batch, args.latent"))
    ]


def test_another_engines_own_switch_around_the_backward_is_not_too_late(acl401, at):
    """ColossalAI's `booster.no_sync(model, optimizer)` under a ZeRO plugin is the optimizer's
    switch, read in the backward hooks: a block around the backward only may be right. The
    same block with DDP's own `model.no_sync()` still changes nothing."""
    source = """
    from contextlib import nullcontext

    from colossalai.booster import Booster

    booster = Booster(plugin=plugin)
    model, optimizer, _, dataloader, _ = booster.boost(model, optimizer, dataloader=dataloader)
    for step, x in enumerate(dataloader):
        loss = model(x.cuda()).pow(2).mean()
        last = (step + 1) % accumulation_steps == 0
        ctx = nullcontext() if last else booster.no_sync(model, optimizer)
        with ctx:
            booster.backward(loss=loss / accumulation_steps, optimizer=optimizer)
        if last:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl401.findings(source) == []
    ddp = """
    import torch
    from contextlib import nullcontext

    model = torch.nn.parallel.DistributedDataParallel(net)
    for step, x in enumerate(dataloader):
        loss = model(x.cuda()).pow(2).mean()
        last = (step + 1) % accumulation_steps == 0
        ctx = nullcontext() if last else model.no_sync()
        with ctx:
            (loss / accumulation_steps).backward()
        if last:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl401.findings(ddp) == [("ACL401", *at(ddp, "ctx:"))]


PREPARED = """
import torch
from accelerate import Accelerator

accelerator = Accelerator()
model, opt, dl = accelerator.prepare(model, opt, dl)
for step, (x, y) in enumerate(dl):
    loss = crit(model(x), y) / K
    accelerator.backward(loss)
    if (step + 1) % K == 0 or step + 1 == len(dl):
        opt.step()
        opt.zero_grad()
"""


def test_a_prepared_model_under_a_manual_gate_is_a_latent_warning(acl401, at):
    """Catalogue: a prepared model is DDP under a multi-process launch; a loop that gates the
    step on K itself, with neither accumulate() nor no_sync(), all-reduces every micro-step."""
    (found,) = acl401.diagnostics(PREPARED)
    assert (found.code, found.start.line, found.start.column) == (
        "ACL401",
        *at(PREPARED, "model(x)"),
    )
    assert found.severity == "warning" and found.fix is None
    assert found.configuration.affects_default is False
    assert "multi-process launch" in found.configuration.condition
    assert "`accelerator.no_sync(model)`" in found.message


def test_a_prepared_model_with_its_sync_handled_is_not_flagged(acl401):
    no_sync = PREPARED.replace(
        "    loss = crit(model(x), y) / K\n    accelerator.backward(loss)\n",
        "    sync = (step + 1) % K == 0 or step + 1 == len(dl)\n"
        "    with nullcontext() if sync else accelerator.no_sync(model):\n"
        "        loss = crit(model(x), y) / K\n        accelerator.backward(loss)\n",
    )
    accumulated = PREPARED.replace(
        "    loss = crit(model(x), y) / K\n    accelerator.backward(loss)\n"
        "    if (step + 1) % K == 0 or step + 1 == len(dl):\n        opt.step()\n",
        "    with accelerator.accumulate(model):\n"
        "        loss = crit(model(x), y)\n"
        "        accelerator.backward(loss)\n"
        "        opt.step()\n",
    )
    each_batch = PREPARED.replace(
        "Accelerator()",
        "Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=K, "
        "sync_each_batch=True))",
    )
    every_step = PREPARED.replace(
        "    if (step + 1) % K == 0 or step + 1 == len(dl):\n", "    if True:\n"
    )
    deepspeed = PREPARED.replace("Accelerator()", "Accelerator(deepspeed_plugin=DeepSpeedPlugin())")
    fsdp = PREPARED.replace("Accelerator()", "Accelerator(fsdp_plugin=plugin)")
    for source in (no_sync, accumulated, each_batch, every_step, deepspeed, fsdp):
        assert acl401.findings(source) == [], source


def test_an_fsdp1_model_with_only_its_backward_under_no_sync_is_not_flagged(acl401, at):
    """FSDP reads `no_sync()` in its post-backward hook (LLaMA2-Accessory's Large-DiT): the
    block around the backward alone skips the reduce-scatter; DDP's forward flag needs more."""
    source = """
    import contextlib
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def train(net, loader, n_mb):
        model = FSDP(net)
        opt = torch.optim.AdamW(model.parameters())
        for x, y in loader:
            for i in range(n_mb):
                loss = crit(model(x[i]), y[i]) / n_mb
                with model.no_sync() if i < n_mb - 1 else contextlib.nullcontext():
                    loss.backward()
            opt.step()
            opt.zero_grad()
    """
    assert acl401.findings(source) == []
    helper = source.replace(
        "    def train(", "    def wrap(net):\n        return FSDP(net)\n\n    def train("
    )
    assert acl401.findings(helper.replace("model = FSDP(net)", "model = wrap(net)")) == []
    ddp = source.replace(
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP",
        "from torch.nn.parallel import DistributedDataParallel as DDP",
    ).replace("FSDP(net)", "DDP(net)")
    assert [code for code, *_ in acl401.findings(ddp)] == ["ACL401"]
