"""ACL104 clip-scaled-grads: torch's clip functions on gradients still multiplied by the scale."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source
from linter.fixer import fix_text

RAW = """
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    opt.zero_grad()
    scaler.scale(crit(model(x), y)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # keep me
    scaler.step(opt)
    scaler.update()
"""


def test_raw_clip_is_flagged_and_unscaled_first(acl104, at):
    assert acl104.findings(RAW) == [("ACL104", *at(RAW, "torch.nn.utils.clip_grad_norm_"))]
    assert acl104.fixed(RAW) == textwrap.dedent(RAW).replace(
        "    torch.nn.utils", "    scaler.unscale_(opt)\n    torch.nn.utils"
    )


def test_helper_function_with_an_aliased_clip(acl104, at):
    source = """
    from torch.nn.utils import clip_grad_norm_ as clip

    def train_one_epoch(model, loader, optimizer, scaler, max_norm):
        for x, y in loader:
            scaler.scale(crit(model(x), y)).backward()
            norm = clip(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "clip(model"))]
    expected = (
        "        scaler.unscale_(optimizer)\n        norm = clip(model.parameters(), max_norm)\n"
    )
    assert expected in acl104.fixed(source)


def test_trainer_method_with_an_amp_switch(acl104, at):
    source = """
    import torch

    class Trainer:
        def __init__(self, use_amp):
            self.use_amp = use_amp
            if use_amp:
                self.scaler = torch.amp.GradScaler("cuda")

        def run_batch(self, x, y):
            loss = self.crit(self.model(x), y)
            if self.use_amp:
                self.scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
                self.optimizer.step()

        def run_epoch(self, loader):
            for x, y in loader:
                self.run_batch(x, y)
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "torch.nn.utils.clip_grad_norm_"))]
    expected = (
        "            self.scaler.unscale_(self.optimizer)\n"
        "            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)\n"
        "            self.scaler.step(self.optimizer)\n"
    )
    assert expected in acl104.fixed(source)


def test_while_loop_with_counter_and_module_alias(acl104, at):
    source = """
    import torch.nn.utils as U

    micro = 0
    while micro < total:
        scaler.scale(crit(model(next(it)))).backward()
        U.clip_grad_value_(model.parameters(), 0.5)
        scaler.step(opt); scaler.update(); opt.zero_grad()
        micro += 1
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "U.clip_grad_value_"))]
    assert "    scaler.unscale_(opt)\n    U.clip_grad_value_(" in acl104.fixed(source)


def test_unscale_only_in_a_logging_branch_does_not_count(acl104, at):
    source = """
    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y)).backward()
        if i % 100 == 0:
            scaler.unscale_(opt)
            log_grad_norm(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "torch.nn.utils.clip"))]


def test_second_backward_of_a_gan_needs_its_own_unscale(acl104, at):
    source = """
    for real in dl:
        scaler.scale(d_loss(disc, gen, real)).backward()
        scaler.unscale_(opt_d)
        torch.nn.utils.clip_grad_norm_(disc.parameters(), 1.0)
        scaler.step(opt_d)
        scaler.scale(g_loss(disc, gen)).backward()
        torch.nn.utils.clip_grad_norm_(gen.parameters(), 1.0)
        scaler.step(opt_g)
        scaler.update()
    """
    assert acl104.findings(source) == [
        ("ACL104", *at(source, "torch.nn.utils.clip_grad_norm_(gen"))
    ]
    assert "    scaler.unscale_(opt_g)\n    torch.nn.utils.clip_grad_norm_(gen" in acl104.fixed(
        source
    )


def test_scaler_wrapper_clipping_before_unscale(acl104, at):
    source = """
    import torch

    class LossScaler:
        def __init__(self):
            self._scaler = torch.amp.GradScaler("cuda")

        def __call__(self, loss, optimizer, parameters, clip_grad):
            self._scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "torch.nn.utils.clip"))]
    assert "        self._scaler.unscale_(optimizer)\n        torch.nn.utils" in acl104.fixed(
        source
    )


def test_no_following_scaler_step_is_reported_without_fix(acl104, at):
    source = """
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer_step()
    """
    (diagnostic,) = acl104.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "torch.nn")
    assert diagnostic.fix is None


# --- Accelerate and the guard engine -------------------------------------------------------


def test_accelerate_fp16_torch_clip_becomes_the_engine_clip(acl104, at):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        opt.zero_grad()
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "torch.nn.utils.clip"))]
    assert acl104.fixed(source) == textwrap.dedent(source).replace(
        "torch.nn.utils.clip_grad_norm_", "accelerator.clip_grad_norm_"
    )


def test_accelerate_unknown_precision_in_a_trainer(acl104, at):
    source = """
    from torch import nn
    from accelerate import Accelerator

    class Trainer:
        def __init__(self, args):
            self.accelerator = Accelerator(mixed_precision=args.mixed_precision)

        def train(self):
            for batch in self.loader:
                self.accelerator.backward(self.model(**batch).loss)
                nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "nn.utils.clip"))]
    assert "            self.accelerator.clip_grad_norm_(self.model" in acl104.fixed(source)


def test_accelerate_clip_value_gets_an_unscale_before_it(acl104, at):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
        opt.step()
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "torch.nn.utils.clip"))]
    assert "    accelerator.unscale_gradients()\n    torch.nn.utils.clip_grad_value_(" in (
        acl104.fixed(source)
    )


def test_accelerate_bf16_with_an_fsdp_plugin(acl104, at):
    source = """
    import torch
    from accelerate import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin()
    accelerator = Accelerator(mixed_precision="bf16", fsdp_plugin=plugin)
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    """
    (diagnostic,) = acl104.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "torch.nn.utils.clip")
    assert "per-shard" in diagnostic.message


def test_guard_engine_fp16(acl104, at):
    source = """
    import torch
    import guard

    engine = guard.Engine(mixed_precision="fp16")
    model, opt = engine.prepare(model, opt)
    for x, y in dl:
        engine.backward(crit(model(x), y))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "torch.nn.utils.clip"))]
    assert "    engine.clip_grad_norm_(model.parameters(), 1.0)\n" in acl104.fixed(source)


def test_engine_clip_with_torch_only_arguments_has_no_fix(acl104, at):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
        opt.step()
    """
    (diagnostic,) = acl104.diagnostics(source)
    assert diagnostic.fix is None


# --- must not flag ---------------------------------------------------------------------------


def test_unscale_before_clip_is_clean(acl104):
    source = """
    import torch

    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    """
    assert acl104.findings(source) == []


def test_unscale_inside_the_clip_branch_or_the_amp_branch_is_clean(acl104):
    source = """
    for x, y in dl:
        loss = crit(model(x), y)
        if use_amp:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if max_norm:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_value_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
    """
    assert acl104.findings(source) == []


def test_clip_in_the_fp32_branch_is_clean(acl104):
    source = """
    for x, y in dl:
        loss = crit(model(x), y)
        if use_amp:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    """
    assert acl104.findings(source) == []


def test_unscale_gradients_before_a_torch_clip_is_clean(acl104):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        accelerator.unscale_gradients()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    """
    assert acl104.findings(source) == []


def test_engine_clip_methods_are_clean(acl104):
    source = """
    import guard
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    engine = guard.Engine(mixed_precision="fp16")
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    for x, y in dl:
        engine.backward(crit(model(x), y))
        engine.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    """
    assert acl104.findings(source) == []


def test_no_scaler_or_a_disabled_one_is_clean(acl104):
    source = """
    import torch

    scaler = torch.amp.GradScaler("cuda", enabled=False)
    for x, y in dl:
        crit(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    """
    assert acl104.findings(source) == []


def test_accelerate_pinned_to_bf16_or_fp32_is_clean(acl104):
    source = """
    import torch
    import guard
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    engine = guard.Engine(gradient_accumulation_steps=1)
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    for x, y in dl:
        engine.backward(crit(model(x), y))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    """
    assert acl104.findings(source) == []


def test_timm_style_wrapper_is_clean(acl104):
    source = """
    import torch

    class NativeScaler:
        def __init__(self):
            self._scaler = torch.amp.GradScaler("cuda")

        def __call__(self, loss, optimizer, clip_grad=None, parameters=None):
            self._scaler.scale(loss).backward()
            if clip_grad is not None:
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()
    """
    assert acl104.findings(source) == []


def test_clip_after_the_scaler_step_is_clean(acl104):
    source = """
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    """
    assert acl104.findings(source) == []


# --- composed with ACL303 ------------------------------------------------------------------


def _fix_both(source: str) -> str:
    source = textwrap.dedent(source)
    analyse = lambda text: analyze_source(text, "snippet.py", ["ACL104", "ACL303"])  # noqa: E731
    outcome = fix_text(source, analyse, unsafe=False)
    assert outcome.error is None
    assert analyse(outcome.text) == []
    assert fix_text(outcome.text, analyse, unsafe=False).text == outcome.text
    return outcome.text


def test_with_acl303_the_unscale_goes_inside_the_manual_step_gate():
    source = """
    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y) / K).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % K == 0 or i + 1 == len(dl):
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    """
    assert _fix_both(source) == textwrap.dedent("""
    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y) / K).backward()
        if (i + 1) % K == 0 or i + 1 == len(dl):
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % K == 0 or i + 1 == len(dl):
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    """)


def test_with_acl303_the_engine_unscale_goes_inside_the_sync_gate():
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
    """
    assert _fix_both(source) == textwrap.dedent(source).replace(
        "        torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)\n",
        "        if accelerator.sync_gradients:\n"
        "            accelerator.unscale_gradients()\n"
        "            torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)\n",
    )


def test_with_acl303_the_engine_clip_is_rewritten_inside_the_sync_gate():
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    """
    assert _fix_both(source) == textwrap.dedent(source).replace(
        "        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
        "        if accelerator.sync_gradients:\n"
        "            grad_norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)\n",
    )


def test_two_engine_clips_get_one_unscale(acl104, at):
    """A second unscale before `update()` raises: only the first clip of a path is fixed, and
    the next round finds the later one already unscaled."""
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    """
    assert acl104.findings(source) == [
        ("ACL104", *at(source, "torch.nn.utils.clip_grad_value_")),
        ("ACL104", *at(source, "torch.nn.utils.clip_grad_norm_")),
    ]
    assert acl104.fixed(source) == textwrap.dedent(source).replace(
        "    torch.nn.utils.clip_grad_value_",
        "    accelerator.unscale_gradients()\n    torch.nn.utils.clip_grad_value_",
    )


def test_torch_clip_after_the_engine_clip_is_clean(acl104):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
        opt.step()
    """
    assert acl104.findings(source) == []


# --- scaled backwards in a function of the module -----------------------------------------


def test_backward_helper_then_clip_in_the_loop(acl104, at):
    source = """
    def backward(loss, scaler):
        scaler.scale(loss).backward()

    def train(model, dl, opt, amp_scaler):
        for x, y in dl:
            backward(crit(model(x), y), amp_scaler)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            amp_scaler.step(opt)
            amp_scaler.update()
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "torch.nn.utils.clip"))]
    assert "        amp_scaler.unscale_(opt)\n        torch.nn.utils.clip" in acl104.fixed(source)


def test_clip_in_the_branch_opposite_to_the_scaler_step_is_clean(acl104):
    """The loss went through a helper that scales it only when there is a scaler; the loop's
    `else` branch (no scaler) clips fp32 gradients."""
    source = """
    def backward(loss, scaler):
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()

    def train_one_epoch(model, dl, opt, scaler, max_norm):
        for x, y in dl:
            backward(crit(model(x), y), scaler)
            if scaler is not None:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                scaler.step(opt)
                scaler.update()
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                opt.step()
    """
    assert acl104.findings(source) == []


def test_helper_that_unscales_itself_is_clean(acl104):
    source = """
    def backward_and_unscale(loss, scaler, opt):
        scaler.scale(loss).backward()
        scaler.unscale_(opt)

    for x, y in dl:
        backward_and_unscale(crit(model(x), y), scaler, opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    """
    assert acl104.findings(source) == []


def test_unscale_under_the_same_test_as_the_scaled_backward_is_clean(acl104):
    source = """
    for x, y in dl:
        loss = crit(model(x), y)
        if amp:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if amp:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if amp:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
    """
    assert acl104.findings(source) == []


def test_trainer_whose_step_method_scales_under_the_amp_flag_is_clean(acl104):
    """The per-batch method scales only `if self.use_amp:`, and the loop unscales under the same
    test before it clips."""
    source = """
    class Trainer:
        def training_step(self, batch):
            loss = self.model(**batch).loss
            if self.use_amp:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()

        def train(self, loader):
            for step, batch in enumerate(loader):
                self.training_step(batch)
                if (step + 1) % self.accum == 0:
                    if self.use_amp:
                        self.scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                    if self.use_amp:
                        self.scaler.step(self.optimizer)
                        self.scaler.update()
                    else:
                        self.optimizer.step()
    """
    assert acl104.findings(source) == []


def test_unscale_under_another_spelling_of_the_amp_test_is_clean(acl104):
    source = """
    for x, y in dl:
        loss = crit(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if args.fp16:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
    """
    assert acl104.findings(source) == []


def test_clip_in_a_method_the_loop_calls_is_reported_at_the_call(acl104, at):
    source = """
    import torch

    class Trainer:
        def clip_gradients(self):
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)

        def fit(self, loader):
            for batch in loader:
                self.scaler.scale(self.model(**batch).loss).backward()
                self.clip_gradients()
                self.scaler.step(self.optimizer)
                self.scaler.update()
    """
    assert acl104.findings(source) == [("ACL104", *at(source, "self.clip_gradients()"))]
    expected = (
        "            self.scaler.unscale_(self.optimizer)\n            self.clip_gradients()\n"
    )
    assert expected in acl104.fixed(source)


def test_clip_helper_that_unscales_first_is_clean(acl104):
    source = """
    import torch

    def unscale_and_clip(scaler, opt, model):
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        unscale_and_clip(scaler, opt, model)
        scaler.step(opt)
        scaler.update()
    """
    assert acl104.findings(source) == []


def test_optimizer_wrapper_split_into_backward_and_step_methods_is_clean(acl104):
    """An AMP optimizer wrapper whose `backward` scales and whose `step` unscales, clips, steps
    and updates: each method is correct on its own."""
    source = """
    import torch

    class AmpOptimWrapper:
        def __init__(self, optimizer, max_norm):
            self.optimizer = optimizer
            self.max_norm = max_norm
            self.loss_scaler = torch.amp.GradScaler("cuda")

        def backward(self, loss):
            self.loss_scaler.scale(loss).backward()

        def step(self):
            self.loss_scaler.unscale_(self.optimizer)
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.max_norm)
            self.loss_scaler.step(self.optimizer)
            self.loss_scaler.update()

    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), 1.0)
    for x, y in dl:
        wrapper.backward(crit(model(x), y))
        wrapper.step()
    """
    assert acl104.findings(source) == []


def test_trainer_attribute_holds_the_modules_one_engine(acl104, at):
    """`self.accelerator` / `self.engine` handed to a trainer is the module's one construction:
    its precision decides (found by the generated-loop properties, tests/generated/)."""
    template = """
    import torch
    {imports}

    class Trainer:
        def __init__(self, model, optimizer, loader, {name}):
            self.model, self.optimizer, self.loader = model, optimizer, loader
            self.{name} = {name}

        def fit(self):
            for x, y in self.loader:
                with self.{name}.accumulate(self.model):
                    self.{name}.backward(crit(self.model(x), y))
                    if self.{name}.sync_gradients:
                        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.05)
                    self.optimizer.step()
                    self.optimizer.zero_grad()

    def main():
        {name} = {build}
        model, optimizer, loader = {name}.prepare(Net(), opt, dl)
        Trainer(model, optimizer, loader, {name}).fit()
    """
    pinned = template.format(
        imports="from accelerate import Accelerator",
        name="accelerator",
        build='Accelerator(cpu=True, mixed_precision="no", gradient_accumulation_steps=2)',
    )
    assert acl104.findings(pinned) == []
    fp16 = template.format(
        imports="import guard",
        name="engine",
        build='guard.Engine(mixed_precision="fp16", gradient_accumulation_steps=2)',
    )
    assert acl104.findings(fp16) == [("ACL104", *at(fp16, "torch.nn.utils.clip"))]
    assert "self.engine.clip_grad_norm_(self.model.parameters(), 0.05)" in acl104.fixed(fp16)


# FSDP2: torch's clip over DTensor parameters all-reduces the norm -----------------------------
ACCELERATE_FSDP = """
import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin

plugin = FullyShardedDataParallelPlugin(fsdp_version=VERSION)
accelerator = Accelerator(mixed_precision="bf16", fsdp_plugin=plugin)
for batch in dl:
    accelerator.backward(model(**batch).loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
"""


def test_accelerate_fsdp2_plugin_in_bf16_is_not_flagged(acl104, at):
    assert acl104.findings(ACCELERATE_FSDP.replace("VERSION", "2")) == []
    inline = ACCELERATE_FSDP.replace("VERSION", "2").replace(
        "fsdp_plugin=plugin", "fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)"
    )
    assert acl104.findings(inline) == []
    for fsdp1 in ("1", "version"):  # FSDP1, or a version the linter cannot read
        source = ACCELERATE_FSDP.replace("VERSION", fsdp1)
        (diagnostic,) = acl104.diagnostics(source)
        assert (diagnostic.start.line, diagnostic.start.column) == at(source, "torch.nn.utils")
        assert "per-shard" in diagnostic.message


GUARD_FSDP2 = """
import torch
import guard

engine = guard.Engine(mixed_precision="bf16", fsdp_plugin=PLUGIN)
for x, y in loader:
    engine.backward(crit(model(x), y))
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
"""


def test_guard_engine_fsdp2_in_bf16_is_not_flagged(acl104, at):
    for plugin in ("True", "guard.FSDP2Plugin()", '"fsdp2"'):
        assert acl104.findings(GUARD_FSDP2.replace("PLUGIN", plugin)) == [], plugin
    fp16 = GUARD_FSDP2.replace("PLUGIN", "True").replace('"bf16"', '"fp16"')
    assert acl104.findings(fp16) == [("ACL104", *at(fp16, "torch.nn.utils"))]  # still scaled
    (diagnostic,) = acl104.diagnostics(fp16)
    assert "loss scale" in diagnostic.message and "per-shard" not in diagnostic.message


def test_raw_fully_shard_loop_clipping_dtensors_is_not_flagged(acl104):
    source = """
    import torch
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)
    for x, y in dl:
        crit(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); opt.zero_grad()
    """
    assert acl104.findings(source) == []
