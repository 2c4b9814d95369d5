"""ACL303 per-microstep-clipping: clip/unscale outside the sync or step condition."""

from __future__ import annotations

import textwrap

ACCELERATE = """
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)  # keep me
        opt.step(); opt.zero_grad()
"""


def test_accelerate_clip_is_flagged_and_fixed(acl303, at):
    assert acl303.findings(ACCELERATE) == [("ACL303", *at(ACCELERATE, "accelerator.clip_grad"))]
    assert acl303.fixed(ACCELERATE) == textwrap.dedent(ACCELERATE).replace(
        "        accelerator.clip_grad_norm_",
        "        if accelerator.sync_gradients:\n            accelerator.clip_grad_norm_",
    )


def test_raw_amp_unscale_and_clip_share_one_if(acl303, at):
    source = """
    import torch

    scaler = torch.amp.GradScaler("cuda")
    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y) / K).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % K == 0 or i + 1 == len(dl):
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    """
    # one misplaced block, one finding (spanning both calls) and one fix
    (found,) = acl303.diagnostics(source)
    assert (found.start.line, found.start.column) == at(source, "scaler.unscale_(opt)")
    assert found.end.line == at(source, "torch.nn.utils.clip_grad_norm_")[0]
    assert found.message.startswith("`unscale_` and `clip_grad_norm_` run on every micro-step")
    expected = (
        "    if (i + 1) % K == 0 or i + 1 == len(dl):\n"
        "        scaler.unscale_(opt)\n"
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    )
    assert expected in acl303.fixed(source)


def test_helper_function_with_module_alias(acl303, at):
    source = """
    import torch.nn.utils as U

    def train_one_epoch(model, loader, opt, scaler, accum):
        for i, (x, y) in enumerate(loader):
            scaler.scale(crit(model(x), y) / accum).backward()
            U.clip_grad_value_(model.parameters(), 0.5)
            if (i + 1) % accum == 0:
                scaler.step(opt)
                scaler.update()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "U.clip_grad_value_"))]
    assert "        if (i + 1) % accum == 0:\n            U.clip_grad_value_(" in acl303.fixed(
        source
    )


def test_while_loop_with_counter_and_early_gate(acl303, at):
    source = """
    from torch.nn.utils import clip_grad_norm_ as clip

    micro = 0
    while True:
        (crit(model(next(it))) / K).backward()
        micro += 1
        clip(model.parameters(), 1.0)
        if micro >= K:
            opt.step(); opt.zero_grad()
            micro = 0
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "clip(model"))]
    assert "    if micro >= K:\n        clip(model.parameters(), 1.0)\n" in acl303.fixed(source)


def test_trainer_method_with_self_accelerator(acl303, at):
    source = """
    class Trainer:
        def train(self):
            for batch in self.loader:
                with self.accelerator.accumulate(self.model):
                    self.accelerator.backward(self.model(**batch).loss)
                    self.accelerator.clip_grad_norm_(self.model.parameters(), 1.0)
                    self.optimizer.step()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "self.accelerator.clip"))]
    assert "if self.accelerator.sync_gradients:\n" in acl303.fixed(source)


def test_logged_norm_is_reported_without_fix(acl303, at):
    source = """
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            log({"grad_norm": grad_norm})
    """
    (diagnostic,) = acl303.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "accelerator.clip")
    assert diagnostic.fix is None


def test_nanogpt_style_clip_inside_the_micro_step_loop(acl303, at):
    source = """
    while True:
        for micro_step in range(gradient_accumulation_steps):
            scaler.scale(model(X, Y)[1] / gradient_accumulation_steps).backward()
            scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "scaler.unscale_"))]


SWIN_STYLE = """
import torch

for idx, (x, y) in enumerate(dl):
    out = model(x)
    if cfg.ACCUM > 1:
        loss = crit(out, y) / cfg.ACCUM
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.CLIP)
        if (idx + 1) % cfg.ACCUM == 0:
            opt.step()
            opt.zero_grad()
    else:
        loss = crit(out, y)
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.CLIP)
        opt.step()
    log(norm)
"""


def test_clip_in_the_accumulating_branch_only(acl303, at):
    # the `else` branch steps every batch: its clip is right; the K branch clips partial sums
    (diagnostic,) = acl303.diagnostics(SWIN_STYLE)
    assert (diagnostic.start.line, diagnostic.start.column) == at(SWIN_STYLE, "torch.nn.utils")
    assert diagnostic.fix is None  # `norm` is read after the branch


def test_legacy_apex_loop_clips_every_micro_step(acl303, at):
    source = """
    import torch
    from apex import amp

    for step, batch in enumerate(loader):
        loss = model(**batch)[0]
        if args.accum > 1:
            loss = loss / args.accum
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (step + 1) % args.accum == 0:
            optimizer.step()
            model.zero_grad()
    """
    assert acl303.findings(source) == [
        ("ACL303", *at(source, "torch.nn.utils.clip_grad_norm_(amp")),
        ("ACL303", *at(source, "torch.nn.utils.clip_grad_norm_(model")),
    ]
    expected = (
        "        if (step + 1) % args.accum == 0:\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    )
    assert expected in acl303.fixed(source)


def test_step_gate_through_a_named_flag(acl303, at):
    # litgpt style: the window test is bound to a name, the step runs under `not` of it
    source = """
    import torch

    for it, batch in enumerate(loader):
        is_accumulating = (it + 1) % accum_iters != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            fabric.backward(chunked_loss(model(batch)) / accum_iters)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils"))]
    assert "    if not is_accumulating:\n        torch.nn.utils" in acl303.fixed(source)
    guarded = source.replace(
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
        "        if not is_accumulating:\n",
        "        if not is_accumulating:\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n",
    )
    assert acl303.findings(guarded) == []
    fabric_clip = source.replace(
        "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
        "fabric.clip_gradients(model, optimizer, max_norm=max_norm)",
    )
    assert acl303.findings(fabric_clip) == [("ACL303", *at(fabric_clip, "fabric.clip_gradients"))]


# --- must not flag ---------------------------------------------------------------------------


def test_clip_under_sync_gradients(acl303):
    source = ACCELERATE.replace(
        "        accelerator.clip_grad_norm_",
        "        if accelerator.sync_gradients:\n            accelerator.clip_grad_norm_",
    )
    assert acl303.findings(source) == []


def test_clip_after_early_continue_on_sync_gradients(acl303):
    source = """
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            if not accelerator.sync_gradients:
                continue
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    """
    assert acl303.findings(source) == []


def test_clip_under_the_step_condition(acl303):
    source = """
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / K).backward()
        if (i + 1) % K != 0:
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
    """
    assert acl303.findings(source) == []


def test_loop_without_accumulation(acl303):
    source = """
    for x, y in dl:
        crit(model(x), y).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    """
    assert acl303.findings(source) == []


def test_engine_configured_with_one_accumulation_step(acl303):
    source = ACCELERATE.replace("gradient_accumulation_steps=4", "gradient_accumulation_steps=1")
    assert acl303.findings(source) == []


def test_clip_gated_inside_a_conditional_expression(acl303):
    for gated in (
        "norm = accelerator.clip_grad_norm_(model.parameters(), 1.0) "
        "if accelerator.sync_gradients else None",
        "accelerator.sync_gradients and accelerator.clip_grad_norm_(model.parameters(), 1.0)",
        "not accelerator.sync_gradients or accelerator.clip_grad_norm_(model.parameters(), 1.0)",
    ):
        source = ACCELERATE.replace(
            "accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)", gated
        )
        assert acl303.findings(source) == [], gated
    manual = """
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / K).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0) if (i + 1) % K == 0 else None
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl303.findings(manual) == []


def test_clip_in_the_micro_step_arm_of_a_conditional_expression(acl303, at):
    for wrong in (
        "accelerator.clip_grad_norm_(model.parameters(), 1.0) "
        "if not accelerator.sync_gradients else None",
        "None if accelerator.sync_gradients "
        "else accelerator.clip_grad_norm_(model.parameters(), 1.0)",
        "accelerator.sync_gradients or accelerator.clip_grad_norm_(model.parameters(), 1.0)",
    ):
        source = ACCELERATE.replace(
            "accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)", wrong
        )
        assert acl303.findings(source) == [("ACL303", *at(source, "accelerator.clip_grad"))]


def test_clip_under_a_name_bound_to_sync_gradients(acl303, at):
    source = ACCELERATE.replace(
        "        accelerator.clip_grad_norm_",
        "        sync = accelerator.sync_gradients\n"
        "        if sync:\n"
        "            accelerator.clip_grad_norm_",
    )
    assert acl303.findings(source) == []
    inverted = source.replace("if sync:", "if not sync:")
    assert acl303.findings(inverted) == [("ACL303", *at(inverted, "accelerator.clip_grad"))]


def test_clip_in_a_step_function_gated_by_its_caller(acl303, at):
    source = """
    class Trainer:
        def train_step(self, x, y):
            (crit(self.model(x), y) / self.accum).backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)

        def optimizer_step(self):
            self.opt.step()
            self.opt.zero_grad()

        def fit(self, dl):
            for i, (x, y) in enumerate(dl):
                self.train_step(x, y)
                if (i + 1) % self.accum == 0:
                    self.optimizer_step()
    """
    diagnostics = acl303.diagnostics(source)
    assert [(d.code, d.start.line, d.start.column) for d in diagnostics] == [
        ("ACL303", *at(source, "torch.nn.utils"))
    ]
    assert diagnostics[0].fix is None  # the caller's `i` is not visible in train_step
    moved = source.replace(
        "            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)\n", ""
    ).replace(
        "            self.opt.step()\n",
        "            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)\n"
        "            self.opt.step()\n",
    )
    assert acl303.findings(moved) == []


def test_lightning_training_step_clips_every_batch(acl303, at):
    source = """
    import lightning as L

    class Module(L.LightningModule):
        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            self.manual_backward(crit(self.net(batch[0]), batch[1]) / self.hparams.accum)
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
            if (batch_idx + 1) % self.hparams.accum == 0:
                opt.step()
                opt.zero_grad()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils"))]
    assert (
        "        if (batch_idx + 1) % self.hparams.accum == 0:\n"
        "            torch.nn.utils.clip_grad_norm_"
    ) in acl303.fixed(source)


def test_clip_under_a_logging_cadence(acl303, at):
    # `% logging_steps` is not the window: the clip still runs on micro-steps that do not sync
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for step, batch in enumerate(dl):
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            if step % args.logging_steps == 0:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step(); opt.zero_grad()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "accelerator.clip_grad"))]
    expected = (
        "        if step % args.logging_steps == 0:\n"
        "            if accelerator.sync_gradients:\n"
        "                accelerator.clip_grad_norm_"
    )
    assert expected in acl303.fixed(source)
    window = source.replace("step % args.logging_steps", "(step + 1) % args.grad_accum")
    assert acl303.findings(window) == []
    for both in (
        "step % args.logging_steps == 0 and accelerator.sync_gradients",
        "accelerator.sync_gradients and step % args.logging_steps == 0",
    ):
        combined = source.replace("step % args.logging_steps == 0", both)
        assert both in combined
        assert acl303.findings(combined) == []


def test_manual_loop_clip_under_a_logging_cadence(acl303, at):
    source = """
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / accum).backward()
        if i % log_every == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % accum == 0:
            opt.step(); opt.zero_grad()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils.clip"))]
    aliased = source.replace("i % log_every", "(i + 1) % args.accum_steps")
    assert acl303.findings(aliased) == []


def test_clip_under_the_window_spelled_through_another_object(acl303):
    source = """
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / self.update_freq).backward()
        if (i + 1) % cfg.update_freq == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % self.update_freq == 0:
            opt.step(); opt.zero_grad()
    """
    assert acl303.findings(source) == []


def test_clip_beside_a_gated_call_of_a_step_function(acl303, at):
    source = """
    def train(cfg):
        def update():
            opt.step()
            opt.zero_grad()

        for i, (x, y) in enumerate(dl):
            (crit(model(x), y) / cfg.accum).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if (i + 1) % cfg.accum == 0:
                update()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils.clip"))]
    expected = (
        "        if (i + 1) % cfg.accum == 0:\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    )
    assert expected in acl303.fixed(source)
    every_batch = source.replace(
        "if (i + 1) % cfg.accum == 0:\n                update()", "update()"
    )
    assert "if (i + 1)" not in every_batch
    assert acl303.findings(every_batch) == []


def test_clip_before_the_counter_increment_moves_into_the_step_branch(acl303, at):
    """Wrapping the clip in `if step % K == 0:` before `step += 1` would clip on the first
    micro-step of each window instead of the last: the fix moves it before the step instead
    (found by the generated-loop properties, tests/generated/)."""
    source = """
    step = 0
    for x, y in dl:
        (crit(model(x), y) / K).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        step += 1
        if step % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils.clip"))]
    assert acl303.fixed(source) == textwrap.dedent(
        """
    step = 0
    for x, y in dl:
        (crit(model(x), y) / K).backward()
        step += 1
        if step % K == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    """
    )


def test_clip_of_divided_gradients_moves_after_the_division(acl303):
    """When the step branch divides the gradients, the clip must see the averaged ones: moved
    before the step (after the division), not wrapped where it stands."""
    source = """
    for i, (x, y) in enumerate(dl):
        crit(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % K == 0 or i + 1 == len(dl):
            for p in model.parameters():
                p.grad.div_(K)
            opt.step()
            opt.zero_grad()
    """
    assert acl303.fixed(source) == textwrap.dedent(
        """
    for i, (x, y) in enumerate(dl):
        crit(model(x), y).backward()
        if (i + 1) % K == 0 or i + 1 == len(dl):
            for p in model.parameters():
                p.grad.div_(K)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    """
    )


def test_clip_inside_a_micro_step_loop_moves_before_the_step_after_it(acl303, at):
    source = """
    for step in range(steps):
        for micro_step in range(K):
            x, y = next(batches)
            (crit(model(x), y) / K).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils.clip"))]
    assert acl303.fixed(source) == textwrap.dedent(
        """
    for step in range(steps):
        for micro_step in range(K):
            x, y = next(batches)
            (crit(model(x), y) / K).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    """
    )


# Both gates end as the one ACL303's fix must move the clip into.
CLIP_IN_THE_FIXED_GATE = """
for i, (x, y) in enumerate(dl):
    (crit(model(x), y) / K).backward()
    if (i + 1) % K == 0 or i + 1 == len(dl):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
"""


def _fixed_together(source: str, codes: list[str]) -> str:
    """All fixes of `codes` applied (unsafe ones too): none fails, nothing is left to report."""
    from linter.analysis import analyze_source
    from linter.fixer import fix_text

    analyse = lambda text: analyze_source(text, "snippet.py", codes)  # noqa: E731
    outcome = fix_text(textwrap.dedent(source), analyse, unsafe=True)
    assert outcome.error is None and analyse(outcome.text) == []
    return outcome.text


def test_with_acl307_the_clip_moves_into_the_gate_that_gains_the_last_batch_clause():
    """A copy of a gate with no last-batch clause would skip the clip on the tail window once
    ACL307's fix adds `or i + 1 == len(dl)` to the gate: the clip moves into the branch instead
    (found by the generated-loop properties, tests/generated/)."""
    source = """
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / K).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert _fixed_together(source, ["ACL303", "ACL307"]) == CLIP_IN_THE_FIXED_GATE


def test_with_acl312_the_clip_moves_into_the_gate_whose_test_is_shifted():
    """A copy of the off-by-one test `i % K == 0` would clip on the wrong micro-steps once
    ACL312's fix shifts the gate to `(i + 1) % K == 0` (found by tests/generated/)."""
    source = """
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / K).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if i % K == 0 or i + 1 == len(dl):
            opt.step()
            opt.zero_grad()
    """
    assert _fixed_together(source, ["ACL303", "ACL312"]) == CLIP_IN_THE_FIXED_GATE


# compound statements: an edit takes exactly the flagged statements' lines ---------------------


def _fixes(acl303, source):
    return [d.fix for d in acl303.diagnostics(source)]


def test_clips_in_both_branches_of_an_if_gate_the_whole_if(acl303, at):
    """open_flamingo's train_utils: gating the lines from the first clip to the second would
    nest `else:` under the new `if`, and with `use_fsdp` false nothing would clip again."""
    source = """
    import torch

    for num_steps, batch in enumerate(train_loader):
        loss = model(batch.cuda()).loss / gradient_accumulation_steps
        loss.backward()
        # clip gradient norm
        if use_fsdp:
            model.clip_grad_norm_(1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (num_steps + 1) % gradient_accumulation_steps == 0 or last_batch:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "model.clip_grad_norm_"))]
    gate = "(num_steps + 1) % gradient_accumulation_steps == 0 or last_batch"
    assert acl303.fixed(source) == textwrap.dedent(source).replace(
        "    if use_fsdp:\n"
        "        model.clip_grad_norm_(1.0)\n"
        "    else:\n"
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
        f"    if {gate}:\n"
        "        if use_fsdp:\n"
        "            model.clip_grad_norm_(1.0)\n"
        "        else:\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
    )


def test_clips_in_every_branch_of_an_elif_chain_gate_the_whole_chain(acl303):
    source = """
    import torch

    for step, batch in enumerate(loader):
        (model(**batch).loss / args.accum).backward()
        if args.clip_mode == "norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        elif args.clip_mode == "value":
            torch.nn.utils.clip_grad_value_(model.parameters(), args.max_value)
        else:
            model.clip_grad_norm_(args.max_norm)
        if (step + 1) % args.accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    fixed = acl303.fixed(source)
    assert fixed == textwrap.dedent(source).replace(
        '    if args.clip_mode == "norm":\n',
        '    if (step + 1) % args.accum == 0:\n        if args.clip_mode == "norm":\n',
    ).replace(
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)\n"
        '    elif args.clip_mode == "value":\n'
        "        torch.nn.utils.clip_grad_value_(model.parameters(), args.max_value)\n"
        "    else:\n"
        "        model.clip_grad_norm_(args.max_norm)\n",
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)\n"
        '        elif args.clip_mode == "value":\n'
        "            torch.nn.utils.clip_grad_value_(model.parameters(), args.max_value)\n"
        "        else:\n"
        "            model.clip_grad_norm_(args.max_norm)\n",
    )


def test_clip_in_one_branch_is_gated_inside_that_branch(acl303, at):
    """The other branch logs: the clip alone is gated where it stands, `else:` is untouched."""
    source = """
    import torch

    for step, batch in enumerate(loader):
        (model(**batch).loss / args.accum).backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        else:
            logger.debug("gradient clipping disabled")
        if (step + 1) % args.accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils.clip_grad"))]
    assert acl303.fixed(source) == textwrap.dedent(source).replace(
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)\n",
        "        if (step + 1) % args.accum == 0:\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)\n",
    )


def test_clip_with_an_impure_branch_test_is_gated_per_branch(acl303):
    """`use_fsdp()` is a call: evaluating it only on step micro-steps could change what it
    does, so each clip is gated inside its own branch, never across `else:`."""
    source = """
    import torch

    for step, batch in enumerate(loader):
        (model(**batch).loss / accum).backward()
        if is_fsdp(model):
            model.clip_grad_norm_(1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (step + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl303.fixed(source) == textwrap.dedent(source).replace(
        "        model.clip_grad_norm_(1.0)\n",
        "        if (step + 1) % accum == 0:\n            model.clip_grad_norm_(1.0)\n",
    ).replace(
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
        "        if (step + 1) % accum == 0:\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
    )


def test_clips_in_try_and_except_are_gated_separately(acl303, at):
    """Same frames, adjacent statements, but `except` lies between: two edits, no nesting."""
    source = """
    import torch

    for step, batch in enumerate(loader):
        (model(**batch).loss / accum).backward()
        try:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
        except RuntimeError:
            torch.nn.utils.clip_grad_value_(model.parameters(), 1.0)
        if (step + 1) % accum == 0 or step + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl303.findings(source) == [
        ("ACL303", *at(source, "torch.nn.utils.clip_grad_norm_")),
        ("ACL303", *at(source, "torch.nn.utils.clip_grad_value_")),
    ]
    gate = "        if (step + 1) % accum == 0 or step + 1 == len(loader):\n    "
    assert acl303.fixed(source) == textwrap.dedent(source).replace(
        "        torch.nn.utils.clip_grad_norm_(", f"{gate}        torch.nn.utils.clip_grad_norm_("
    ).replace(
        "        torch.nn.utils.clip_grad_value_(",
        f"{gate}        torch.nn.utils.clip_grad_value_(",
    )


def test_clip_in_a_try_body_does_not_move_out_of_it(acl303, at):
    """`step += 1` after the clip means it must move into the step branch, but out of the
    `try:` it would no longer be under the handler: no fix."""
    source = """
    import torch

    step = 0
    for x, y in dl:
        (crit(model(x), y) / K).backward()
        try:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
            clipped += 1
        except RuntimeError:
            skipped += 1
        step += 1
        if step % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils.clip"))]
    assert _fixes(acl303, source) == [None]


def test_clip_under_its_own_condition_before_the_counter_increment_has_no_fix(acl303, at):
    """It cannot move into the step branch (its own `if` stays around it) and a copy of
    `step % K == 0` above `step += 1` would clip one micro-step early."""
    source = """
    import torch

    step = 0
    for x, y in dl:
        (crit(model(x), y) / K).backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        step += 1
        if step % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils.clip"))]
    assert _fixes(acl303, source) == [None]


def test_clip_in_a_with_block_is_gated_inside_it(acl303):
    source = """
    import torch

    for step, batch in enumerate(loader):
        (model(**batch).loss / accum).backward()
        with timer("clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (step + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl303.fixed(source) == textwrap.dedent(source).replace(
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
        "        if (step + 1) % accum == 0:\n"
        "            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
    )


def test_clip_sharing_a_line_with_another_statement_has_no_fix(acl303, at):
    source = """
    import torch

    for step, batch in enumerate(loader):
        loss = model(**batch).loss / accum
        loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (step + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils.clip"))]
    assert _fixes(acl303, source) == [None]
    assert acl303.fixed(source) == textwrap.dedent(source)


def test_clip_with_a_trailing_comment_keeps_it(acl303):
    source = """
    import torch

    for step, batch in enumerate(loader):
        (model(**batch).loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # avoid exploding gradients
        if (step + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    clip = "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # avoid exploding gradients"
    # moved into the step branch (ACL307 adds a last-batch clause to it), comment and all
    assert acl303.fixed(source) == textwrap.dedent(source).replace(f"    {clip}\n", "").replace(
        "        optimizer.step()\n", f"        {clip}\n        optimizer.step()\n"
    )


def test_clip_at_the_end_of_a_branch_and_one_after_it_are_gated_apart(acl303):
    """Adjacent statements in different blocks: one `if` over both would take the dedent."""
    source = """
    import torch

    for step, batch in enumerate(loader):
        (model(**batch).loss / accum).backward()
        if scaler is not None:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (step + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    clip = "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"
    assert acl303.fixed(source) == textwrap.dedent(source).replace(
        "        scaler.unscale_(optimizer)\n",
        "        if (step + 1) % accum == 0:\n            scaler.unscale_(optimizer)\n",
    ).replace(f"    {clip}\n", "").replace(
        "        optimizer.step()\n", f"        {clip}\n        optimizer.step()\n"
    )


def test_clip_in_a_nested_training_function(acl303):
    source = """
    import torch

    def main(args):
        def train_epoch(loader):
            for step, batch in enumerate(loader):
                (model(**batch).loss / args.accum).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if (step + 1) % args.accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()

        train_epoch(train_loader)
    """
    clip = "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"
    assert acl303.fixed(source) == textwrap.dedent(source).replace(
        f"            {clip}\n", ""
    ).replace(
        "                optimizer.step()\n",
        f"                {clip}\n                optimizer.step()\n",
    )


def test_clip_with_a_multiline_string_argument_is_not_reindented(acl303, at):
    """Indenting the lines of a triple-quoted string would change the string: no fix."""
    source = '''
    import torch

    for step, batch in enumerate(loader):
        (model(**batch).loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=lookup("""
    fast
    """))
        if (step + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
    '''
    assert acl303.findings(source) == [("ACL303", *at(source, "torch.nn.utils.clip"))]
    assert _fixes(acl303, source) == [None]
