"""ACL101 raw-backward: positives in several loop styles, fixes, and every "must not flag" item."""

from __future__ import annotations

import textwrap

ACCELERATE = """
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        loss.backward()
        opt.step(); opt.zero_grad()
"""


def test_accelerate_loop_is_flagged_and_fixed(acl101, at):
    assert acl101.findings(ACCELERATE) == [("ACL101", *at(ACCELERATE, "loss.backward()"))]
    assert acl101.fixed(ACCELERATE) == textwrap.dedent(ACCELERATE).replace(
        "loss.backward()", "accelerator.backward(loss)"
    )


def test_message_states_the_files_k_and_precision(acl101):
    (diagnostic,) = acl101.diagnostics(ACCELERATE)
    assert "4 accumulation steps are summed, not averaged (4 times too large)" in (
        diagnostic.message
    )
    assert "the fp16 loss is never scaled" in diagnostic.message
    divided = ACCELERATE.replace('mixed_precision="fp16"', 'mixed_precision="bf16"').replace(
        "loss.backward()", "(loss / 4).backward()"
    )
    (diagnostic,) = acl101.diagnostics(divided)
    assert "division by 4 is done by hand" in diagnostic.message
    assert "fp16" not in diagnostic.message and "summed" not in diagnostic.message
    unknown = ACCELERATE.replace('mixed_precision="fp16", gradient_accumulation_steps=4', "")
    (diagnostic,) = acl101.diagnostics(unknown)
    assert diagnostic.message.endswith("under fp16 the loss would not be scaled")


def test_a_pinned_precision_without_accumulation_is_hurt_only_by_a_launch_config(acl101, at):
    """fp8/bf16/fp32 pinned and no K (or K divided by hand): `accelerator.backward` is
    `loss.backward()` there, except under a DeepSpeed or Megatron-LM launch: a latent warning."""
    for precision in ("fp8", "bf16", "no"):
        source = ACCELERATE.replace(
            'mixed_precision="fp16", gradient_accumulation_steps=4',
            f'mixed_precision="{precision}"',
        )
        (diagnostic,) = acl101.diagnostics(source)
        assert (diagnostic.start.line, diagnostic.start.column) == at(source, "loss.backward()")
        assert diagnostic.severity == "warning"
        assert diagnostic.configuration.affects_default is False
        assert "DeepSpeed" in diagnostic.configuration.condition
        assert diagnostic.message.endswith("but a DeepSpeed engine's backward is skipped")
    divided = ACCELERATE.replace('mixed_precision="fp16"', 'mixed_precision="bf16"').replace(
        "loss.backward()", "(loss / 4).backward()"
    )
    (diagnostic,) = acl101.diagnostics(divided)
    assert diagnostic.severity == "warning" and diagnostic.configuration.latent
    (diagnostic,) = acl101.diagnostics(ACCELERATE)  # fp16 and K = 4: the default run is hurt
    assert diagnostic.severity is None  # the rule's own: an error
    assert diagnostic.configuration is None


def test_wrapper_built_from_the_prepared_model(acl101, at):
    # med-seg-diff style: the diffusion wrapper runs the prepared model in its forward
    source = """
    from accelerate import Accelerator

    def main():
        accelerator = Accelerator(gradient_accumulation_steps=args.accum)
        model, optimizer, dl = accelerator.prepare(model, optimizer, dl)
        diffusion = MedSegDiff(model, timesteps=1000).to(accelerator.device)
        for img, mask in dl:
            with accelerator.accumulate(model):
                loss = diffusion(mask, img)
                loss.backward()
                optimizer.step()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "loss.backward()"))]
    assert "accelerator.backward(loss)" in acl101.fixed(source)
    unprepared = source.replace("MedSegDiff(model,", "MedSegDiff(Unet(),")
    assert acl101.findings(unprepared) == []


def test_raw_amp_loop_scales_the_loss(acl101, at):
    source = """
    import torch

    scaler = torch.amp.GradScaler("cuda")
    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = crit(model(x), y)
        loss.backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "loss.backward()"))]
    assert "    scaler.scale(loss).backward()\n" in acl101.fixed(source)


def test_helper_function_with_scaler_parameter(acl101, at):
    source = """
    from torch.cuda.amp import GradScaler

    def train_one_epoch(model, loader, opt, scaler, accum):
        for i, (x, y) in enumerate(loader):
            loss = crit(model(x), y) / accum
            loss.backward()
            if (i + 1) % accum == 0:
                scaler.unscale_(opt)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()

    def main():
        scaler = GradScaler(enabled=args.fp16)
        train_one_epoch(model, loader, opt, scaler, args.accum)
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "loss.backward()"))]
    assert "scaler.scale(loss).backward()" in acl101.fixed(source)


def test_while_loop_with_manual_counter(acl101, at):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    model, opt = accelerator.prepare(model, opt)
    step = 0
    while step < max_steps:
        out = model(next(it))
        out.loss.backward(retain_graph=True)
        step += 1
        if step % 8 == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "out.loss.backward"))]
    assert "accelerator.backward(out.loss, retain_graph=True)" in acl101.fixed(source)


def test_trainer_method_uses_self_accelerator(acl101, at):
    source = """
    from accelerate import Accelerator

    class Trainer:
        def __init__(self, args, model, opt):
            self.accelerator = Accelerator(gradient_accumulation_steps=args.accum)
            self.model, self.opt = self.accelerator.prepare(model, opt)

        def train(self, dl):
            for batch in dl:
                with self.accelerator.accumulate(self.model):
                    loss = self.model(**batch).loss
                    (loss / args.accum).backward()
                    self.opt.step()
                    self.opt.zero_grad()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "(loss / args"))]
    # The engine divides by the same K: the manual division goes with the same edit (no ACL302).
    assert "                self.accelerator.backward(loss)\n" in acl101.fixed(source)


def test_manual_division_by_other_value_is_kept(acl101):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(model)
    for batch in dl:
        (model(batch).loss / n_tokens).backward()
        opt.step()
    """
    assert "accelerator.backward(model(batch).loss / n_tokens)" in acl101.fixed(source)


def test_import_aliases(acl101, at):
    source = """
    from accelerate import Accelerator as A

    acc = A(mixed_precision="bf16")
    net, optim = acc.prepare(net, optim)
    for x in loader:
        net(x).sum().backward()
        optim.step()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "net(x).sum().backward()"))]
    assert "    acc.backward(net(x).sum())\n" in acl101.fixed(source)


def test_autograd_backward_function(acl101, at):
    source = """
    import torch
    from torch.cuda.amp import GradScaler as GS

    scaler = GS()
    for x in loader:
        torch.autograd.backward(model(x).mean())
        scaler.step(opt)
        scaler.update()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "torch.autograd.backward"))]
    assert "torch.autograd.backward(scaler.scale(model(x).mean()))" in acl101.fixed(source)


def test_conditional_scaler_counts_as_enabled(acl101, at):
    source = """
    import torch

    scaler = torch.cuda.amp.GradScaler(enabled=args.fp16)
    for x in loader:
        model(x).mean().backward()
        scaler.step(opt)
        scaler.update()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "model(x).mean().backward()"))]


# --- must not flag ------------------------------------------------------------------------


def test_plain_fp32_loop_without_engine_or_scaler(acl101):
    source = """
    import torch

    for x, y in dl:
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    """
    assert acl101.findings(source) == []


def test_scaler_with_literal_enabled_false(acl101):
    source = """
    import torch

    scaler = torch.amp.GradScaler("cuda", enabled=False)
    for x, y in dl:
        loss = crit(model(x), y)
        loss.backward()
        scaler.step(opt)
        scaler.update()
    """
    assert acl101.findings(source) == []


def test_scaled_backward(acl101):
    source = """
    import torch

    scaler = torch.cuda.amp.GradScaler()
    for x, y in dl:
        loss = crit(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    """
    assert acl101.findings(source) == []


def test_apex_scale_loss_backward(acl101):
    source = """
    import torch
    from apex import amp

    scaler = torch.cuda.amp.GradScaler()
    for x, y in dl:
        loss = crit(model(x), y)
        if use_apex:
            with amp.scale_loss(loss, opt) as scaled_loss:
                scaled_loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    """
    assert acl101.findings(source) == []


def test_engine_backward_calls(acl101):
    source = """
    import deepspeed
    import guard
    from accelerate import Accelerator

    accelerator = Accelerator()
    engine = guard.Engine(mixed_precision="bf16")
    model_engine, optimizer, _, _ = deepspeed.initialize(model=net, config=cfg)
    model, opt = accelerator.prepare(model, opt)
    for batch in dl:
        accelerator.backward(model(batch).loss)
        engine.backward(model(batch).loss)
        model_engine.backward(model_engine(batch).loss)
        opt.step()
    """
    assert acl101.findings(source) == []


def test_loss_of_a_model_that_was_never_prepared(acl101):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    model, opt = accelerator.prepare(model, opt)
    probe = torch.nn.Linear(16, 2)
    for batch in dl:
        with torch.no_grad():
            features = model(batch).hidden
        probe_loss = probe_crit(probe(features), batch["y"])
        probe_loss.backward()
        probe_opt.step()
    """
    assert acl101.findings(source) == []


def test_gradient_penalty_with_autograd_grad(acl101):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    critic, opt = accelerator.prepare(critic, opt)
    for real in dl:
        score = critic(real)
        grads = torch.autograd.grad(score.sum(), real, create_graph=True)[0]
        loss = score.mean() + 10 * grads.norm()
        accelerator.backward(loss)
        opt.step()
    """
    assert acl101.findings(source) == []


def test_file_without_training_loop(acl101):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()

    def step(loss):
        loss.backward()
    """
    assert acl101.findings(source) == []


def test_accelerator_used_without_prepare(acl101):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = Net().to(accelerator.device)
    for x in dl:
        model(x).sum().backward()
        opt.step()
    """
    assert acl101.findings(source) == []


def test_step_method_called_from_the_training_loop(acl101, at):
    source = """
    from accelerate import Accelerator

    class Trainer:
        def __init__(self, model, opt):
            self.accelerator = Accelerator(gradient_accumulation_steps=4)
            self.model, self.opt = self.accelerator.prepare(model, opt)

        def training_step(self, batch):
            loss = self.model(**batch).loss
            loss.backward()
            self.opt.step()
            return loss

        def fit(self, dl):
            for batch in dl:
                with self.accelerator.accumulate(self.model):
                    self.training_step(batch)
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "loss.backward()"))]
    assert "        self.accelerator.backward(loss)\n" in acl101.fixed(source)


def test_fp32_branch_beside_a_scaled_branch(acl101):
    source = """
    import torch

    scaler = torch.cuda.amp.GradScaler(enabled=args.fp16)
    for x, y in dl:
        loss = crit(model(x), y)
        if args.fp16:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
    """
    assert acl101.findings(source) == []


def test_fp32_branch_beside_a_scaler_helper(acl101):
    # the amp branch backpropagates inside the helper: no scaled backward is visible there
    source = """
    from timm.utils import NativeScaler

    loss_scaler = NativeScaler()
    for x, y in dl:
        loss = crit(model(x), y)
        if args.amp:
            loss_scaler(loss, optimizer)
            loss_scaler.step(optimizer)
        else:
            loss.backward()
            optimizer.step()
    """
    assert acl101.findings(source) == []
    unguarded = source.replace(
        "        else:\n            loss.backward()\n            optimizer.step()",
        "        loss.backward()",
    )
    assert len(acl101.findings(unguarded)) == 1


def test_named_division_by_the_engine_k_goes_with_the_fix(acl101):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=args.accum)
    model, opt = accelerator.prepare(model, opt)
    for batch in dl:
        with accelerator.accumulate(model):
            loss = model(**batch).loss / args.accum
            loss.backward()
            opt.step()
        for batch in other:
            loss = model(**batch).loss
            loss /= accelerator.gradient_accumulation_steps
            loss.backward()
            opt.step()
    """
    fixed = acl101.fixed(source)
    assert "        loss = model(**batch).loss\n        accelerator.backward(loss)\n" in fixed
    assert "loss /=" not in fixed
    assert fixed.count("accelerator.backward(loss)") == 2


# --- "prepared" is judged where the model comes from --------------------------------------

TWO_FUNCTIONS = """
import copy
from accelerate import Accelerator

def train_plain(net, dl):
    net = net.to("cpu")
    for x, y in dl:
        crit(net(x), y).backward()
        opt.step()

def train_accelerate(model, dl):
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, dl = accelerator.prepare(model, dl)
    for x, y in dl:
        with accelerator.accumulate(model):
            accelerator.backward(crit(model(x), y))
            opt.step()

def compare(make):
    init = make()
    train_plain(copy.deepcopy(init), dl)
    train_accelerate(copy.deepcopy(init), dl)
"""


def test_function_whose_callers_pass_an_unprepared_model(acl101, at):
    assert acl101.findings(TWO_FUNCTIONS) == []
    passed_prepared = TWO_FUNCTIONS.replace(
        "    train_plain(copy.deepcopy(init), dl)\n",
        "    accelerator = Accelerator()\n"
        "    train_plain(accelerator.prepare(copy.deepcopy(init)), dl)\n",
    )
    assert acl101.findings(passed_prepared) == [("ACL101", *at(passed_prepared, "crit(net"))]
    uncalled = TWO_FUNCTIONS.replace("    train_plain(copy.deepcopy(init), dl)\n", "")
    assert acl101.findings(uncalled) == [("ACL101", *at(uncalled, "crit(net"))]


def test_reference_copy_taken_before_prepare(acl101, at):
    source = """
    import copy
    from accelerate import Accelerator

    def side_by_side(make, dl):
        accelerator = Accelerator(mixed_precision="fp16")
        model = make()
        ref = copy.deepcopy(model).to(accelerator.device)
        model, opt, dl = accelerator.prepare(model, opt, dl)
        for x, y in dl:
            accelerator.backward(crit(model(x), y))
            crit(ref(x), y).backward()
            opt.step()
            ref_opt.step()
    """
    assert acl101.findings(source) == []
    copied_after = source.replace(
        "        ref = copy.deepcopy(model).to(accelerator.device)\n", ""
    ).replace(
        "        for x, y in dl:\n",
        "        ref = copy.deepcopy(model).to(accelerator.device)\n        for x, y in dl:\n",
    )
    assert acl101.findings(copied_after) == [("ACL101", *at(copied_after, "crit(ref"))]


def test_closure_reads_the_model_of_its_own_function(acl101, at):
    source = """
    from accelerate import Accelerator

    def plain():
        model = Net()
        def run():
            for x, y in dl:
                crit(model(x), y).backward()
                opt.step()
        return run

    def with_engine():
        accelerator = Accelerator()
        model = accelerator.prepare(Net())
        def run():
            for x, y in dl:
                accelerator.backward(crit(model(x), y))
                opt.step()
        return run
    """
    assert acl101.findings(source) == []
    raw = source.replace("accelerator.backward(crit(model(x), y))", "crit(model(x), y).backward()")
    assert acl101.findings(raw) == [("ACL101", *at(raw, "crit(model(x), y).backward", 1))]


def test_global_model_prepared_in_another_function(acl101, at):
    source = """
    from accelerate import Accelerator

    model = Net()

    def setup():
        global model
        accelerator = Accelerator()
        model = accelerator.prepare(model)

    def train():
        for x, y in dl:
            crit(model(x), y).backward()
            opt.step()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "crit(model"))]
    assert acl101.findings(source.replace("        global model\n", "")) == []


def test_model_built_from_a_config_parameter(acl101):
    # `cfg` comes from callers the linter cannot see; a constructor argument counts only when
    # it is visibly prepared
    source = """
    from accelerate import Accelerator

    def train(cfg, dl):
        model = build_model(cfg).to(cfg.device)
        for x, y in dl:
            crit(model(x), y).backward()
            opt.step()

    def main(model, dl):
        accelerator = Accelerator()
        model, dl = accelerator.prepare(model, dl)
    """
    assert acl101.findings(source) == []


def test_negated_loss_is_traced_to_its_model(acl101, at):
    # `-logsigmoid(...)` keeps the loss's origin: an unprepared side model is not the engine's
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    model, opt, dl = accelerator.prepare(model, opt, dl)
    head = torch.nn.Linear(8, 1)
    for batch in dl:
        score = head(batch["emb"]).squeeze(-1)
        head_loss = -F.logsigmoid(score).mean()
        head_loss.backward()
        head_opt.step()
    """
    assert acl101.findings(source) == []
    prepared = source.replace('head(batch["emb"])', 'model(batch["emb"])')
    assert acl101.findings(prepared) == [("ACL101", *at(prepared, "head_loss.backward()"))]


def test_scaler_stepped_through_a_closure(acl101, at):
    source = """
    import torch

    def train(cfg):
        scaler = torch.amp.GradScaler("cuda")

        def update():
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()

        for x, y in dl:
            loss = crit(model(x), y)
            loss.backward()
            update()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "loss.backward()"))]
    assert "scaler.scale(loss).backward()" in acl101.fixed(source)
    # a helper given its own scaler: the loop's code cannot name it, so it is not judged here
    handed = source.replace("def update():", "def update(scaler):").replace(
        "update()\n", "update(other_scaler)\n"
    )
    assert "def update(scaler)" in handed and "update(other_scaler)" in handed
    assert acl101.findings(handed) == []
    disabled = source.replace('GradScaler("cuda")', 'GradScaler("cuda", enabled=False)')
    assert acl101.findings(disabled) == []


def test_autograd_backward_of_a_named_list_has_no_fix(acl101, at):
    # `accelerator.backward(losses)` would divide a list: reported, but nothing is rewritten
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for x, y in dl:
        out = model(x)
        losses = [crit(out, y), aux_crit(out, y)]
        torch.autograd.backward(losses)
        opt.step()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "torch.autograd.backward"))]
    assert acl101.fixed(source) == textwrap.dedent(source)


def test_scaler_stepped_through_a_method_of_the_same_class(acl101, at):
    source = """
    import torch

    class Trainer:
        def __init__(self):
            self.scaler = torch.amp.GradScaler("cuda")

        def _optimizer_step(self):
            self.scaler.step(self.opt)
            self.scaler.update()

        def fit(self, dl):
            for x, y in dl:
                loss = crit(self.model(x), y)
                loss.backward()
                self._optimizer_step()
    """
    assert acl101.findings(source) == [("ACL101", *at(source, "loss.backward()"))]
    assert "self.scaler.scale(loss).backward()" in acl101.fixed(source)


BESIDE_THE_ENGINE = """
import torch
from torch import nn
from accelerate import Accelerator


def make():
    student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return student, torch.optim.SGD(student.parameters(), lr=0.1), torch.randn(16, 8)


def plain_run():
    student, optimizer, x = make()
    for _ in range(2):
        optimizer.zero_grad()
        student(x).square().mean().backward()
        optimizer.step()


def prepared_run(precision):
    from guard.engine import Engine

    engine = Engine(precision)
    student, optimizer, x = make()
    student, optimizer = engine.prepare(student, optimizer)
    return engine, student, optimizer, x


def helper_of_the_prepared_run(model, opt, dl):
    for batch in dl:
        compute_loss(model, batch).backward()
        opt.step(); opt.zero_grad()


def main(model, opt, dl):
    accelerator = Accelerator(mixed_precision="fp16")
    model, opt, dl = accelerator.prepare(model, opt, dl)
    helper_of_the_prepared_run(model, opt, dl)
"""


def test_unknown_loss_out_of_reach_of_every_prepare_is_not_flagged(acl101, at):
    """A loss of unknown origin is the engine's only where a prepared object can reach it: in
    `plain_run` (beside the function that prepares) it is not; in a helper that the preparing
    `main` calls, it is."""
    assert acl101.findings(BESIDE_THE_ENGINE) == [
        ("ACL101", *at(BESIDE_THE_ENGINE, "compute_loss(model, batch).backward()"))
    ]


SIDE_MODEL_PARAMETER = """
from accelerate import Accelerator


def train(model, side, dl, side_dl):
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model, dl = accelerator.prepare(model, dl)
    side_opt = torch.optim.SGD(side.parameters(), lr=0.1)
    for feats, target in side_dl:
        side_loss = mse(side(feats), target)
        side_loss.backward()
        side_opt.step()
    for batch in dl:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            loss.backward()
"""


def test_a_parameter_the_preparing_function_leaves_alone_is_not_prepared(acl101, at):
    """`train` prepares what it trains through the engine; `side`, handed in and never given to
    `prepare`, is a plain model even though no caller of `train` is visible."""
    assert acl101.findings(SIDE_MODEL_PARAMETER) == [
        ("ACL101", *at(SIDE_MODEL_PARAMETER, "loss.backward()", nth=1))
    ]


SCALED_ELSEWHERE = """
import torch

scaler = torch.amp.GradScaler("cuda")
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y) / 4
    scaled = scaler.scale(loss)
    scaled.backward()
    (scaler.scale(loss) if use_amp else loss).backward()
    if (i + 1) % 4 == 0:
        scaler.step(opt)
        scaler.update()
"""


def test_a_loss_scaled_through_a_name_or_in_one_arm_is_not_flagged(acl101):
    assert acl101.findings(SCALED_ELSEWHERE) == []


def test_the_fixed_loss_stays_scaled_after_another_rule_divides_it(acl101):
    """ACL301's fix turns `scaled.backward()` into `scaled = scaled / 4` + backward: still the
    scaled loss, so ACL101 must not wrap it in a second `scaler.scale`."""
    source = SCALED_ELSEWHERE.replace(
        "    scaled.backward()", "    scaled /= 4\n    scaled.backward()"
    )
    assert acl101.findings(source) == []
