"""The training-loop model: setup facts, step gates and K, loss dataflow, and `describe_loops`."""

from __future__ import annotations

import textwrap

import libcst
import pytest

from linter.analysis import ParseFailure, analyze_source, describe_loops
from linter.model import Model
from linter.model.cst_util import code


def build(source: str) -> Model:
    return Model(libcst.parse_module(textwrap.dedent(source)))


def test_setup_resolves_aliases_kwargs_and_prepare_unpacking():
    model = build(
        """
        import torch
        import torch.optim as optim
        from accelerate import Accelerator as A, GradientAccumulationPlugin
        from torch.cuda.amp import GradScaler as GS
        from transformers import get_scheduler

        plugin = GradientAccumulationPlugin(num_steps=args.accum)
        acc = A(mixed_precision="bf16", gradient_accumulation_plugin=plugin)
        other = A(**accelerator_kwargs)
        off = GS(enabled=False)
        maybe = torch.amp.GradScaler("cuda", enabled=args.fp16)
        on = torch.cpu.amp.GradScaler()
        opt = optim.AdamW(net.parameters())
        sched = get_scheduler("linear", optimizer=opt)
        net, opt, sched = acc.prepare(net, opt, sched)
        head = acc.prepare(head)
        """
    )
    setup = model.setup
    assert setup.engines["acc"].mixed_precision == "bf16"
    assert code(setup.engines["acc"].accum) == "args.accum"
    assert setup.engines["other"].mixed_precision is None
    assert {n: s.enabled for n, s in setup.scalers.items()} == {
        "off": False,
        "maybe": None,
        "on": True,
    }
    assert {p.original: p.name for p in setup.prepared.values()} == {
        "net": "net",
        "opt": "opt",
        "sched": "sched",
        "head": "head",
    }
    assert "opt" in setup.optimizers and "sched" in setup.schedulers


def _gate(condition: str, before: str = "") -> tuple[str, str] | None:
    source = f"""
    for i, batch in enumerate(dl):
        {before}
        loss = crit(model(batch))
        loss.backward()
        if {condition}:
            opt.step()
    """
    (loop,) = build(source).loops
    gate = loop.gate
    return None if gate is None else (gate.kind, code(gate.k) if gate.k is not None else None)


@pytest.mark.parametrize(
    "condition, expected",
    [
        ("(i + 1) % K == 0", ("modulo", "K")),
        ("i % args.grad_accum == args.grad_accum - 1", ("modulo", "args.grad_accum")),
        ("step % self.accum == 0", ("modulo", "self.accum")),
        ("not (i + 1) % K", ("modulo", "K")),
        ("(i + 1) % K == 0 or i + 1 == len(dl)", ("modulo", "K")),
        ("accelerator.sync_gradients", ("sync", None)),
        ("i % 1 == 0", None),
        ("i % log_every != 0", None),
    ],
)
def test_step_gate_spellings(condition, expected):
    assert _gate(condition) == expected


@pytest.mark.parametrize(
    "before, condition",
    [
        ("is_update = (i + 1) % K == 0", "is_update"),
        ("is_accumulating = (i + 1) % K != 0", "not is_accumulating"),
    ],
)
def test_step_gate_through_a_named_condition(before, condition):
    assert _gate(condition, before) == ("modulo", "K")


def test_counter_gate_with_reset():
    source = """
    micro = 0
    while True:
        (crit(model(next(it))) / K).backward()
        micro += 1
        if micro == K:
            opt.step()
            micro = 0
    """
    (loop,) = build(source).loops
    assert (loop.gate.kind, code(loop.gate.k)) == ("counter", "K")


def test_counter_never_reset_is_progress_not_a_window():
    source = """
    global_step = 0
    for epoch in range(epochs):
        for x, y in dl:
            crit(model(x), y).backward()
            if global_step >= warmup_steps:
                opt.step()
        global_step += 1
    """
    assert build(source).loops[0].gate is None


def test_last_step_marker_gate():
    source = """
    last = -1
    for i, batch in enumerate(dl):
        ni = i + nb * epoch
        crit(model(batch)).backward()
        if ni - last >= accumulate:
            opt.step()
            last = ni
    """
    (loop,) = build(source).loops
    assert (loop.gate.kind, code(loop.gate.k)) == ("counter", "accumulate")
    plain = build(source.replace("            last = ni\n", ""))
    assert plain.loops[0].gate is None  # without the marker it is not a window


def test_gate_of_the_branch_a_statement_is_in():
    source = """
    for i, (x, y) in enumerate(dl):
        if accum > 1:
            crit(model(x), y).backward()
            clip(model.parameters(), 1.0)
            if (i + 1) % accum == 0:
                opt.step()
        else:
            crit(model(x), y).backward()
            clip(model.parameters(), 1.0)
            opt.step()
    """
    model = build(source)
    (loop,) = model.loops
    first, second = loop.backwards
    assert code(model.gate_for(loop, first.stmt).k) == "accum"
    assert model.gate_for(loop, second.stmt) is None
    # sharing the `else` branch with a step does not put a statement on the update step
    assert not model.on_update_step(loop, second.stmt)


def test_micro_step_loop_owns_no_step_so_the_outer_loop_is_the_training_loop():
    source = """
    while True:
        for micro in range(accum):
            scaler.scale(model(x) / accum).backward()
        scaler.step(opt)
        scaler.update()
    """
    model = build(source)
    (loop,) = model.loops
    assert isinstance(loop.node, libcst.While)
    assert (loop.gate.kind, code(loop.gate.k)) == ("micro-loop", "accum")
    on_update = {s.kind: model.on_update_step(loop, s.stmt) for s in loop.sites}
    assert on_update == {"backward": False, "scaler_step": True, "scaler_update": True}


@pytest.mark.parametrize(
    "lines, state",
    [
        (["loss = crit(model(x), y)"], "undivided"),
        (["out = model(**batch)", "loss = out.loss"], "undivided"),
        (["logits, loss = model(X, Y)"], "undivided"),
        (["loss = crit(model(x), y)", "loss /= K"], "divided"),
        (["loss = crit(model(x), y) * (1.0 / K)"], "divided"),
        (["inv = 1 / K", "loss = crit(model(x), y) * inv"], "divided"),
        (["loss = crit(model(x), y).div(K)"], "divided"),
        (["loss = compute_loss(model, x)"], "undivided"),
        (["loss = compute_loss(model, x, args.grad_accum)"], "unknown"),
        (["loss = crit(model(x), y)", "loss *= world_size"], "undivided"),
        (["loss = crit(model(x), y) * loss_weight"], "undivided"),
        (["loss = crit(model(x), y) * loss_scale"], "unknown"),
        (["loss = sum(crit(model(x), y) for x in xs)"], "undivided"),
        (["loss = sum(crit(model(x), y) / K for x in xs)"], "divided"),
        (["out = model(x)", "loss = sum(v for k, v in out.items() if 'loss' in k)"], "undivided"),
        (["out = model(x)", "loss = sum([v / K for v in out.values()])"], "divided"),
        (["v = crit(model(x), y) / K", "loss = sum(v for v in unseen)"], "unknown"),
        (["loss = torch.stack([crit(model(x), y)]).mean()"], "undivided"),
        (["loss = torch.stack([crit(model(x), y) for x in xs]).mean()"], "undivided"),
        (["loss = torch.div(crit(model(x), y), K)"], "divided"),
        (["loss_dict = model(x)", "loss = sum(loss_dict.values())"], "undivided"),
        (
            ["out = model(x)", "loss = out['loss'] if isinstance(out, dict) else out[0]"],
            "undivided",
        ),
        (["loss = crit(model(x), y)", "loss = loss / K if K > 1 else loss"], "divided"),
        (["loss_dict = model(x)", "loss = sum(loss_dict.values()) / K"], "divided"),
        (["loss = crit(model(x), y)", "loss = loss + aux / K"], "divided"),
        (
            [
                "parts = {'a': crit(model(x), y), 'b': crit(model(x), z)}",
                "loss = sum(parts.values())",
            ],
            "undivided",
        ),
        (
            ["parts = [crit(model(x), y) / K, crit(model(x), z) / K]", "loss = sum(parts)"],
            "divided",
        ),
        (["parts = {**extra, 'a': crit(model(x), y)}", "loss = sum(parts.values())"], "unknown"),
    ],
)
def test_loss_dataflow(lines, state):
    body = "\n".join(f"    {line}" for line in lines)
    header = "from lib import compute_loss\nmodel = Net()\n"
    source = f"{header}for x, y in dl:\n{body}\n    loss.backward()\n"
    model = build(source)
    (loop,) = model.loops
    assert model.flow(loop.backwards[0]).state == state


def test_loss_from_a_helper_returning_a_tuple():
    source = """
    def compute(model, x):
        out = model(x)
        return out.loss / ACCUM, out.logits

    for x in dl:
        loss, logits = compute(model, x)
        loss.backward()
    """
    model = build(source)
    assert model.flow(model.loops[0].backwards[0]).state == "divided"


def test_loss_parameter_is_what_the_callers_pass():
    source = """
    def backward(loss):
        loss.backward()

    for x, y in dl:
        backward(crit(model(x), y))
        backward(aux / K)
    """
    model = build(source)
    assert model.flow(model.loops[0].backwards[0]).state == "divided"
    one_caller = build(source.replace("        backward(aux / K)\n", ""))
    assert one_caller.flow(one_caller.loops[0].backwards[0]).state == "undivided"
    uncalled = build("def train(loss):\n    for x in dl:\n        loss.backward()\n")
    assert uncalled.flow(uncalled.loops[0].backwards[0]).state == "unknown"


def test_describe_loops_reports_k_branch_and_dataflow():
    source = textwrap.dedent(
        """
        import torch

        scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)
        for i, (x, y) in enumerate(dl):
            loss = crit(model(x), y)
            loss = loss / args.accum
            scaler.scale(loss).backward()
            if (i + 1) % args.accum == 0:
                scaler.step(opt)
                scaler.update()
        """
    )
    (loop,) = describe_loops(source, "train.py")["loops"]
    assert (loop["function"], loop["line"], loop["kind"]) == ("<module>", 5, "for")
    assert loop["scalers"] == [{"name": "scaler", "enabled": "at runtime", "line": 4}]
    assert loop["accumulation"]["k"] == "args.accum"
    assert loop["accumulation"]["line"] == 9
    assert loop["step_branch"] == {
        "kind": "modulo",
        "condition": "(i + 1) % args.accum == 0",
        "line": 9,
    }
    assert [s["kind"] for s in loop["update_step_only"]] == ["scaler_step", "scaler_update"]
    assert [s["kind"] for s in loop["every_micro_step"]] == ["backward"]
    (backward,) = loop["backwards"]
    assert [(s["code"], s["line"]) for s in backward["dataflow"]] == [
        ("loss = crit(model(x), y)", 6),
        ("loss = loss / args.accum", 7),
        ("scaler.scale(loss).backward()", 8),
    ]
    assert backward["loss"] == "divided"


def test_syntax_error_is_a_parse_failure():
    with pytest.raises(ParseFailure) as raised:
        analyze_source("for x in dl:\n    loss.backward(\n", "bad.py", ["ACL101"])
    assert raised.value.line >= 2


def test_file_without_training_loop_has_no_loops():
    source = "import torch\n\ndef f(loss):\n    loss.backward()\n"
    assert describe_loops(source, "f.py") == {"file": "f.py", "loops": []}


def test_argument_sites_of_a_methods_self_is_empty_not_a_crash():
    """A method's `self` is never passed as an argument; asking for it crashed the model
    (`ValueError: 'self' is not in list`, found on a public GPT trainer whose loop calls
    `self.get_batch(...)`)."""
    model = build(
        """
        class Trainer:
            def get_batch(self, batch_size, split="train"):
                return self.data.get_batch(batch_size, split)

            def start(self):
                for step in range(10):
                    x = self.get_batch(8)
        """
    )
    (method,) = [s for s in model.scopes if s.name == "get_batch"]
    assert model.argument_sites(method, "self") == []
    assert [code(e) for e, _ in model.argument_sites(method, "batch_size")] == ["8"]


def test_describe_checkpoints_says_whether_the_saved_dict_is_fully_visible():
    """`fully_visible` is about what the linter can read, not about what the dict holds: a literal
    dict without the scaler is fully visible (and ACL503 reports the missing scaler), one grown
    from `**extra` is not."""
    source = textwrap.dedent(
        """
        import torch

        scaler = torch.amp.GradScaler("cuda")
        for images, labels in train_loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = criterion(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "last.pt")
        torch.save({"model": model.state_dict(), **extra_state}, "extra.pt")
        """
    )
    assert describe_loops(source, "train.py")["checkpoints"] == [
        {"kind": "torch.save", "line": 12, "keys": ["model", "optimizer"], "fully_visible": True},
        {"kind": "torch.save", "line": 13, "keys": ["model"], "fully_visible": False},
    ]
    found = analyze_source(source, "train.py", ["ACL503"])
    assert [(d.code, d.start.line, d.start.column) for d in found] == [("ACL503", 12, 0)]
