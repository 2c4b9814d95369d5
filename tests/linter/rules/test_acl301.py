"""ACL301 missing-loss-division: manual accumulation loops that backpropagate undivided losses."""

from __future__ import annotations

import textwrap

import pytest

PLAIN = """
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y)
    loss.backward()
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
"""


def test_plain_loop_is_flagged_and_fixed(acl301, at):
    assert acl301.findings(PLAIN) == [("ACL301", *at(PLAIN, "loss.backward()"))]
    assert acl301.fixed(PLAIN) == textwrap.dedent(PLAIN).replace(
        "    loss.backward()", "    loss = loss / N\n    loss.backward()"
    )


def test_loss_logged_after_the_backward_keeps_its_value(acl301):
    source = PLAIN.replace("    if (i + 1)", "    log(loss.item())\n    if (i + 1)")
    fixed = acl301.fixed(source)
    assert "    (loss / N).backward()\n    log(loss.item())\n" in fixed
    assert "loss = loss / N" not in fixed


def test_raw_amp_scaled_backward(acl301, at):
    source = """
    import torch

    model = AutoModelForCausalLM.from_pretrained(args.model)
    scaler = torch.amp.GradScaler("cuda")
    for step, batch in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        if step % args.gradient_accumulation_steps == args.gradient_accumulation_steps - 1:
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "scaler.scale(loss).backward()"))]
    fixed = acl301.fixed(source)
    assert "    loss = loss / args.gradient_accumulation_steps\n    scaler.scale(loss)" in fixed


def test_helper_function_with_accum_parameter(acl301, at):
    source = """
    import torch.nn.functional as F

    def train_one_epoch(model, loader, opt, scaler, accum):
        for i, (x, y) in enumerate(loader):
            scaler.scale(F.cross_entropy(model(x), y)).backward()
            if (i + 1) % accum == 0 or i + 1 == len(loader):
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "scaler.scale(F"))]
    assert "scaler.scale(F.cross_entropy(model(x), y) / accum).backward()" in acl301.fixed(source)


def test_while_loop_with_counter(acl301, at):
    source = """
    micro = 0
    while True:
        x, y = next(it)
        loss = criterion(model(x), y)
        loss.backward()
        micro += 1
        if micro == args.grad_accum:
            opt.step(); opt.zero_grad()
            micro = 0
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "loss.backward()"))]
    assert "    loss = loss / args.grad_accum\n    loss.backward()" in acl301.fixed(source)


def test_micro_step_loop_of_nanogpt_style(acl301, at):
    source = """
    model = GPT(gptconf)
    model = torch.compile(model)
    while iter_num < max_iters:
        for micro_step in range(gradient_accumulation_steps):
            logits, loss = model(X, Y)
            X, Y = get_batch("train")
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "scaler.scale(loss).backward()"))]


def test_micro_batches_from_chunk(acl301, at):
    source = """
    model = Net()
    for x, y in dl:
        for xs, ys in zip(x.chunk(4), y.chunk(4)):
            crit(model(xs), ys).backward()
        opt.step()
        opt.zero_grad()

    for batch in dl:
        for micro in batch.chunk(n_micro):
            model(micro).loss.backward()
        opt.step()
    """
    assert acl301.findings(source) == [
        ("ACL301", *at(source, "crit(model(xs)")),
        ("ACL301", *at(source, "model(micro)")),
    ]
    fixed = acl301.fixed(source)
    assert "(crit(model(xs), ys) / 4).backward()" in fixed
    assert "(model(micro).loss / n_micro).backward()" in fixed


def test_trainer_method_with_expression_loss(acl301, at):
    source = """
    class Trainer:
        def train(self, loader):
            for step, (x, y) in enumerate(loader):
                self.loss_fn(self.model(x), y).backward()
                if not (step + 1) % self.accum:
                    self.optimizer.step()
                    self.optimizer.zero_grad()
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "self.loss_fn("))]
    assert "(self.loss_fn(self.model(x), y) / self.accum).backward()" in acl301.fixed(source)


def test_loss_from_a_call_the_linter_cannot_see_into_is_reported_without_fix(acl301, at):
    source = """
    from mylib import compute_loss

    for i, batch in enumerate(dl):
        loss = compute_loss(model, batch)
        loss.backward()
        if (i + 1) % N == 0:
            opt.step()
    """
    (diagnostic,) = acl301.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "loss.backward()")
    assert diagnostic.fix is None
    assert "`compute_loss`" in diagnostic.message


def test_imported_loss_object_summed_on_purpose_gets_no_fix(acl301, at):
    # YOLO style: a loss class from the project, a "last step" marker gate, a world-size factor
    source = """
    from utils.loss import ComputeLoss

    def train(model, loader, optimizer, scaler, accumulate):
        compute_loss = ComputeLoss(model)
        last_opt_step = -1
        for i, (imgs, targets) in enumerate(loader):
            ni = i + nb * epoch
            loss, loss_items = compute_loss(model(imgs), targets)
            if RANK != -1:
                loss *= WORLD_SIZE
            scaler.scale(loss).backward()
            if ni - last_opt_step >= accumulate:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                last_opt_step = ni
    """
    (diagnostic,) = acl301.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "scaler.scale(loss)")
    assert diagnostic.fix is None


def test_counter_of_an_outer_loop_gates_a_per_task_loop(acl301, at):
    source = """
    model = Speech2Text(args)
    accum = 0
    while True:
        batch = loader.next()
        accum += 1
        for task in tasks:
            loss, obs = model(batch, task)
            loss.backward()
            if args.accum_steps == 1 or accum >= args.accum_steps:
                optimizer.step()
                optimizer.zero_grad()
                accum = 0
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "loss.backward()"))]
    assert "loss = loss / args.accum_steps\n" in acl301.fixed(source)


def test_one_line_loop_body(acl301, at):
    source = """
    for i, (x, y) in enumerate(dl):
        loss = crit(model(x), y); loss.backward()
        if (i + 1) % 4 == 0: opt.step(); opt.zero_grad()
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "loss.backward()"))]
    assert "    loss = loss / 4\n    loss = crit(model(x), y); loss.backward()" not in (
        acl301.fixed(source)
    )
    assert "loss = crit(model(x), y); (loss / 4).backward()" in acl301.fixed(source)


# --- must not flag --------------------------------------------------------------------------


def _loop(body: str, gate: str = "(i + 1) % N == 0") -> str:
    return f"""
model = Net()
for i, (x, y) in enumerate(dl):
{textwrap.indent(textwrap.dedent(body).strip(), "    ")}
    if {gate}:
        opt.step()
        opt.zero_grad()
"""


def test_gradients_divided_instead_of_the_loss(acl301):
    body = """
    loss = crit(model(x), y)
    loss.backward()
    if (i + 1) % N == 0:
        for p in model.parameters():
            p.grad.div_(N)
    """
    assert acl301.findings(_loop(body)) == []
    body_inplace = """
    crit(model(x), y).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= N
    """
    assert acl301.findings(_loop(body_inplace)) == []


@pytest.mark.parametrize(
    "division",
    [
        "loss /= N",
        "loss = loss / N",
        "loss = loss * (1 / N)",
        "inv_n = 1 / N\n    loss = loss * inv_n",
        "loss = loss.div(N)",
        "loss = torch.div(loss, N)",
    ],
)
def test_loss_divided_before_backward(acl301, division):
    body = f"""
    loss = crit(model(x), y)
    {division}
    loss.backward()
    """
    assert acl301.findings(_loop(body)) == []


def test_scaled_loss_divided_inside_scale(acl301):
    assert acl301.findings(_loop("scaler.scale(crit(model(x), y) / N).backward()")) == []


def test_division_by_another_spelling_of_k(acl301):
    body = "loss = model(x).loss / args.gradient_accumulation_steps\nloss.backward()"
    assert acl301.findings(_loop(body, gate="(i + 1) % accum_steps == 0")) == []


def test_division_by_window_token_count(acl301):
    body = """
    out = model(x)
    loss = F.cross_entropy(out.view(-1, V), y.view(-1), reduction="sum") / tokens_in_window
    loss.backward()
    """
    source = "import torch.nn.functional as F\n" + _loop(body)
    assert acl301.findings(source) == []
    assert len(acl301.findings(source.replace(" / tokens_in_window", ""))) == 1


def test_division_inside_a_visible_helper(acl301):
    source = """
    def compute(model, x, y, accum):
        loss = crit(model(x), y)
        return loss / accum, {"loss": loss.item()}

    for i, (x, y) in enumerate(dl):
        loss, logs = compute(model, x, y, N)
        loss.backward()
        if (i + 1) % N == 0:
            opt.step()
    """
    assert acl301.findings(source) == []


def test_engine_backward_divides(acl301):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = Net()
    for i, batch in enumerate(dl):
        accelerator.backward(model(**batch).loss)
        if (i + 1) % N == 0:
            opt.step()
    """
    assert acl301.findings(source) == []


def test_loop_without_step_gating(acl301):
    source = """
    for x, y in dl:
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    """
    assert acl301.findings(source) == []


def test_helper_handed_the_accumulation_value_may_divide(acl301):
    source = """
    from mylib import compute_loss

    for i, batch in enumerate(dl):
        loss = compute_loss(model, batch, args.grad_accum)
        loss.backward()
        if (i + 1) % args.grad_accum == 0:
            opt.step()
    """
    assert acl301.findings(source) == []
    # handed the namespace that holds K: it may read and divide by it too
    assert acl301.findings(source.replace("args.grad_accum)", "args)")) == []


def test_branch_that_steps_every_batch_is_not_a_window(acl301):
    source = """
    for idx, (x, y) in enumerate(dl):
        if cfg.ACCUM > 1:
            loss = crit(model(x), y) / cfg.ACCUM
            loss.backward()
            if (idx + 1) % cfg.ACCUM == 0:
                opt.step()
        else:
            loss = crit(model(x), y)
            loss.backward()
            opt.step()
    """
    assert acl301.findings(source) == []


def test_apex_scaled_loss_follows_the_loss_it_scales(acl301, at):
    source = """
    from apex import amp

    for i, (x, y) in enumerate(dl):
        loss = crit(model(x), y)
        with amp.scale_loss(loss, opt) as scaled_loss:
            scaled_loss.backward()
        if (i + 1) % K == 0:
            opt.step()
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "scaled_loss.backward()"))]
    divided = source.replace("crit(model(x), y)", "crit(model(x), y) / K")
    assert acl301.findings(divided) == []


def test_fabric_backward_does_not_divide(acl301, at):
    source = """
    import lightning as L

    fabric = L.Fabric(precision="bf16-mixed")
    model, optimizer = fabric.setup(model, optimizer)
    for it, batch in enumerate(loader):
        is_accumulating = (it + 1) % accum != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            loss = model(batch).loss
            fabric.backward(loss)
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "fabric.backward"))]
    assert "        loss = loss / accum\n        fabric.backward(loss)\n" in acl301.fixed(source)
    divided = source.replace("fabric.backward(loss)", "fabric.backward(loss / accum)")
    assert acl301.findings(divided) == []


def test_fp32_branch_beside_an_optimizer_owned_backward(acl301, at):
    # pytorch-pretrained-BERT style: apex FP16_Optimizer.backward in one branch only
    source = """
    model = BertForSequenceClassification.from_pretrained(args.model)
    for step, batch in enumerate(loader):
        loss = model(*batch)
        if args.fp16:
            optimizer.backward(loss)
        else:
            loss.backward()
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "loss.backward()"))]
    divided = source.replace(
        "        loss = model(*batch)\n",
        "        loss = model(*batch)\n"
        "        if args.gradient_accumulation_steps > 1:\n"
        "            loss = loss / args.gradient_accumulation_steps\n",
    )
    assert acl301.findings(divided) == []


def test_backward_of_an_unknown_engine_handed_the_loss(acl301):
    source = """
    import deepspeed_utils

    model = deepspeed_utils.wrap(net, config)
    for i, batch in enumerate(dl):
        loss = model(batch).loss
        model.backward(loss)
        if (i + 1) % N == 0:
            model.step()
    """
    assert acl301.findings(source) == []


def test_gate_modulus_of_one_is_not_accumulation(acl301):
    assert acl301.findings(_loop("crit(model(x), y).backward()", gate="i % 1 == 0")) == []


def test_step_in_a_sibling_loop_is_not_a_window(acl301):
    # A loop that only runs backward, followed by another loop that steps: no accumulation.
    source = """
    model = Net()
    for subset in (True, False):
        for _ in range(6):
            model.zero_grad()
            loss = model(inp).sum()
            loss.backward()
        for _ in range(6):
            loss = model(inp).sum()
            loss.backward()
            opt.step()
    """
    assert acl301.findings(source) == []


def test_zero_grad_inside_the_micro_step_loop_is_not_accumulation(acl301):
    source = """
    model = Net()
    while True:
        for _ in range(4):
            opt.zero_grad()
            model(x).sum().backward()
        opt.step()
    """
    assert acl301.findings(source) == []


def test_step_function_with_counter_called_per_batch(acl301, at):
    source = """
    model = Net()
    state = {"micro": 0}

    def train_step(x, y):
        global micro
        loss = crit(model(x), y)
        loss.backward()
        micro += 1
        if micro % ACCUM == 0:
            opt.step()
            opt.zero_grad()

    for x, y in dl:
        train_step(x, y)
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "loss.backward()"))]


def test_step_function_never_called_in_a_loop_is_not_a_loop(acl301):
    source = """
    model = Net()

    def train_step(x, y, i):
        loss = crit(model(x), y)
        loss.backward()
        if (i + 1) % ACCUM == 0:
            opt.step()
    """
    assert acl301.findings(source) == []


def test_model_normalising_by_window_item_count(acl301):
    body = "loss = model(x, labels=y, num_items_in_batch=n_items).loss\nloss.backward()"
    assert acl301.findings(_loop(body)) == []
    plain = body.replace(", num_items_in_batch=n_items", "")
    assert len(acl301.findings(_loop(plain))) == 1


def test_dict_of_losses_summed(acl301, at):
    source = """
    for i, (x, y) in enumerate(dl):
        out = model(x)
        parts = {"ce": crit(out, y), "aux": aux_crit(out, y)}
        loss = sum(parts.values())
        loss.backward()
        if (i + 1) % N == 0:
            opt.step(); opt.zero_grad()
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "loss.backward()"))]
    divided = source.replace(
        '"aux": aux_crit(out, y)}',
        '"aux": aux_crit(out, y)}\n        parts = {k: v / N for k, v in parts.items()}',
    )
    assert acl301.findings(divided) == []
    each_divided = source.replace("crit(out, y),", "crit(out, y) / N,").replace(
        "aux_crit(out, y)}", "aux_crit(out, y) / N}"
    )
    assert acl301.findings(each_divided) == []


TRAINER_SPLIT = """
class Trainer:
    def train_step(self, x, y):
        loss = crit(self.model(x), y)
        loss.backward()

    def optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad()

    def fit(self, dl):
        accum = self.cfg.accum
        for i, (x, y) in enumerate(dl):
            self.train_step(x, y)
            if (i + 1) % accum == 0:
                self.optimizer_step()
"""


def test_step_gated_in_the_calling_method(acl301, at):
    diagnostics = acl301.diagnostics(TRAINER_SPLIT)
    assert [(d.code, d.start.line, d.start.column) for d in diagnostics] == [
        ("ACL301", *at(TRAINER_SPLIT, "loss.backward()"))
    ]
    assert diagnostics[0].fix is None  # `accum` is a local of `fit`
    on_self = TRAINER_SPLIT.replace("% accum", "% self.accum")
    assert "        loss = loss / self.accum\n        loss.backward()" in acl301.fixed(on_self)
    inline_step = TRAINER_SPLIT.replace("self.optimizer_step()", "self.opt.step()")
    assert acl301.findings(inline_step) == [("ACL301", *at(inline_step, "loss.backward()"))]


def test_caller_that_steps_every_batch_or_calls_only_on_updates(acl301):
    every_batch = TRAINER_SPLIT.replace("            if (i + 1) % accum == 0:\n    ", "")
    assert acl301.findings(every_batch) == []
    only_on_updates = TRAINER_SPLIT.replace(
        "            self.train_step(x, y)\n            if (i + 1) % accum == 0:\n",
        "            if (i + 1) % accum == 0:\n                self.train_step(x, y)\n",
    )
    assert acl301.findings(only_on_updates) == []
    divided = TRAINER_SPLIT.replace("loss.backward()", "(loss / self.cfg.accum).backward()")
    assert acl301.findings(divided) == []


LIGHTNING_MANUAL = """
import lightning as L

class Module(L.LightningModule):
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = crit(self.net(batch[0]), batch[1])
        self.manual_backward(loss)
        if (batch_idx + 1) % self.hparams.accum == 0:
            opt.step()
            opt.zero_grad()
"""


def test_lightning_manual_backward_does_not_divide(acl301, at):
    assert acl301.findings(LIGHTNING_MANUAL) == [
        ("ACL301", *at(LIGHTNING_MANUAL, "self.manual_backward"))
    ]
    fixed = acl301.fixed(LIGHTNING_MANUAL)
    assert "        loss = loss / self.hparams.accum\n        self.manual_backward(loss)" in fixed
    without_lightning = LIGHTNING_MANUAL.replace("import lightning as L\n", "")
    assert acl301.findings(without_lightning) == []  # a method nobody is seen calling


BACKWARD_HELPER = """
from functools import partial

def backward_and_log(loss, meter):
    meter.update(loss.item())
    loss.backward()

def run(dl, meter):
    bwd = partial(backward_and_log, meter=meter)
    for i, (x, y) in enumerate(dl):
        bwd(crit(model(x), y))
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
"""


def test_backward_helper_called_through_partial(acl301, at):
    assert acl301.findings(BACKWARD_HELPER) == [("ACL301", *at(BACKWARD_HELPER, "loss.backward()"))]
    divided = BACKWARD_HELPER.replace("bwd(crit(model(x), y))", "bwd(crit(model(x), y) / K)")
    assert acl301.findings(divided) == []
    positional = BACKWARD_HELPER.replace("(loss, meter)", "(meter, loss)").replace(
        "meter=meter", "meter"
    )
    assert acl301.findings(positional) == [("ACL301", *at(positional, "loss.backward()"))]
    direct = BACKWARD_HELPER.replace(
        "bwd(crit(model(x), y))", "backward_and_log(crit(model(x), y), meter)"
    )
    assert acl301.findings(direct) == [("ACL301", *at(direct, "loss.backward()"))]


def test_backward_helper_never_called_is_not_judged(acl301):
    source = BACKWARD_HELPER.replace("        bwd(crit(model(x), y))\n", "        pass\n")
    assert acl301.findings(source) == []


STEP_HELPER = """
def train(cfg):
    def update():
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    for i, (x, y) in enumerate(dl):
        loss = crit(model(x), y)
        scaler.scale(loss).backward()
        if not (i + 1) % cfg.accum:
            update()
"""


def test_step_through_a_local_helper_under_the_gate(acl301, at):
    assert acl301.findings(STEP_HELPER) == [("ACL301", *at(STEP_HELPER, "scaler.scale(loss)"))]
    assert acl301.fixed(STEP_HELPER) == textwrap.dedent(STEP_HELPER).replace(
        "        scaler.scale(loss)", "        loss = loss / cfg.accum\n        scaler.scale(loss)"
    )


def test_step_helper_called_every_batch(acl301):
    source = STEP_HELPER.replace(
        "        if not (i + 1) % cfg.accum:\n            update()", "        update()"
    )
    assert acl301.findings(source) == []
    divided = STEP_HELPER.replace("crit(model(x), y)", "crit(model(x), y) / cfg.accum")
    assert acl301.findings(divided) == []
    grads_divided = STEP_HELPER.replace(
        "    def update():\n",
        "    def update():\n"
        "        for p in model.parameters():\n"
        "            p.grad /= cfg.accum\n",
    )
    assert "p.grad /= cfg.accum" in grads_divided
    assert acl301.findings(grads_divided) == []


def test_autograd_backward_of_a_list_divides_each_loss(acl301, at):
    # `1 - cos` is as undivided as `cos`; the fix divides each element, so the logged losses keep
    # their value
    source = """
    import torch.nn.functional as F

    for i, (x, d, n) in enumerate(dl):
        pred_d, pred_n = model(x)
        l1 = F.l1_loss(pred_d, d)
        l2 = 1 - F.cosine_similarity(pred_n, n).mean()
        torch.autograd.backward([l1, l2 + l1])
        if i % accum == accum - 1:
            opt.step()
            opt.zero_grad()
        print(l1.item(), l2.item())
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "torch.autograd.backward"))]
    assert acl301.fixed(source) == textwrap.dedent(source).replace(
        "backward([l1, l2 + l1])", "backward([l1 / accum, (l2 + l1) / accum])"
    )
    divided = source.replace("1 - F.cosine", "1 / accum - F.cosine")
    assert acl301.findings(divided) == []


def test_autograd_backward_of_a_named_list_has_no_fix(acl301, at):
    # `losses / accum` would raise on a list: reported, but nothing is rewritten
    source = """
    import torch
    import torch.nn.functional as F

    for i, (x, y) in enumerate(dl):
        out = model(x)
        losses = [F.l1_loss(out, y), F.mse_loss(out, y)]
        torch.autograd.backward(losses)
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
    """
    (diagnostic,) = acl301.diagnostics(source)
    assert (diagnostic.code, diagnostic.start.line) == ("ACL301", at(source, "torch.autograd")[0])
    assert diagnostic.fix is None
    assert any("holds several losses" in note for note in diagnostic.notes)
    assert acl301.fixed(source) == textwrap.dedent(source)


DICT_OF_LOSSES = """
for i, batch in enumerate(dl):
    outputs = model(batch)
    total = sum(v for k, v in outputs.items() if "loss" in k)
    total.backward()
    if (i + 1) % accum == 0:
        opt.step(); opt.zero_grad()
"""


def test_loss_terms_summed_by_a_comprehension_are_traced(acl301, at):
    assert acl301.findings(DICT_OF_LOSSES) == [("ACL301", *at(DICT_OF_LOSSES, "total.backward()"))]
    divided = DICT_OF_LOSSES.replace("sum(v for k, v", "sum(v / accum for k, v")
    assert acl301.findings(divided) == []


AMP_ARM = """
scaler = torch.amp.GradScaler("cuda")
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y)
    (scaler.scale(loss) if use_amp else loss).backward()
    if (i + 1) % 4 == 0:
        scaler.step(opt); scaler.update()
"""


def test_a_parenthesised_receiver_is_divided_in_both_arms(acl301):
    assert acl301.fixed(AMP_ARM) == textwrap.dedent(AMP_ARM).replace(
        "    (scaler.scale(loss) if use_amp else loss).backward()",
        "    ((scaler.scale(loss) if use_amp else loss) / 4).backward()",
    )


# Issue 22: false alarms on public training code. -------------------------------------------------

EDM_ROUNDS = """
import torch


def training_loop(net, optimizer, dataset_iterator, loss_fn, batch_size, batch_gpu, num_gpus):
    batch_gpu_total = batch_size // num_gpus
    num_accumulation_rounds = batch_gpu_total // batch_gpu
    while True:
        optimizer.zero_grad(set_to_none=True)
        for round_idx in range(num_accumulation_rounds):
            images, labels = next(dataset_iterator)
            loss = loss_fn(net=net, images=images, labels=labels)
            loss.sum().mul(loss_scaling / batch_gpu_total).backward()
        optimizer.step()
"""


@pytest.mark.parametrize(
    "normalised",
    [
        "loss.sum().mul(loss_scaling / batch_gpu_total)",
        "loss.sum().mul_(1.0 / batch_gpu_total)",
        "loss.sum() * (loss_scaling / batch_gpu_total)",
        "loss.sum().div(batch_gpu_total)",
        "loss.sum() / (batch_gpu * num_accumulation_rounds)",
        "torch.mul(loss.sum(), loss_scaling / batch_gpu_total)",
    ],
)
def test_loss_normalised_by_the_window_sample_count(acl301, normalised):
    # NVlabs EDM: per-sample losses summed, then divided by the samples of the whole window
    source = EDM_ROUNDS.replace("loss.sum().mul(loss_scaling / batch_gpu_total)", normalised)
    assert acl301.findings(source) == []


def test_loss_summed_but_scaled_without_the_window_is_flagged(acl301, at):
    source = EDM_ROUNDS.replace("mul(loss_scaling / batch_gpu_total)", "mul(loss_scaling)")
    (diagnostic,) = acl301.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "loss.sum().mul(")
    assert diagnostic.fix is None  # `loss_fn` is handed in: its reduction is not visible
    visible = source.replace(
        "loss_fn(net=net, images=images, labels=labels)",
        'torch.nn.functional.mse_loss(net(images), labels, reduction="none")',
    )
    assert acl301.findings(visible) == [("ACL301", *at(visible, "loss.sum().mul("))]
    assert "(loss.sum().mul(loss_scaling) / num_accumulation_rounds).backward()" in (
        acl301.fixed(visible)
    )


YOLO_NOMINAL_BATCH = """
import torch
from utils.loss import ComputeLoss


def train(hyp, opt, device):
    batch_size = opt.batch_size
    nbs = 64  # nominal batch size
    accumulate = max(round(nbs / batch_size), 1)  # accumulate loss before optimizing
    hyp["weight_decay"] *= batch_size * accumulate / nbs  # scale weight_decay
    optimizer = smart_optimizer(model, opt.optimizer, hyp["lr0"], hyp["weight_decay"])
    scaler = torch.cuda.amp.GradScaler(enabled=amp)
    compute_loss = ComputeLoss(model)
    last_opt_step = -1
    for epoch in range(start_epoch, epochs):
        for i, (imgs, targets, paths, _) in enumerate(train_loader):
            ni = i + nb * epoch
            with torch.cuda.amp.autocast(amp):
                pred = model(imgs)
                loss, loss_items = compute_loss(pred, targets.to(device))  # scaled by batch_size
            scaler.scale(loss).backward()
            if ni - last_opt_step >= accumulate:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                last_opt_step = ni
"""


def test_window_summed_up_to_a_nominal_batch_on_purpose(acl301):
    # ultralytics/yolov5: the decay follows the window's sample count, so its gradient is a sum
    assert acl301.findings(YOLO_NOMINAL_BATCH) == []
    attribute = YOLO_NOMINAL_BATCH.replace(
        'hyp["weight_decay"] *= batch_size * accumulate / nbs',
        "cfg.weight_decay = cfg.weight_decay * batch_size * accumulate / nbs",
    )
    assert acl301.findings(attribute) == []


def test_nominal_batch_without_rescaled_decay_is_still_flagged(acl301, at):
    # a K derived from a target batch is as common with mean losses (nanoGPT's total_batch_size)
    source = YOLO_NOMINAL_BATCH.replace(
        '    hyp["weight_decay"] *= batch_size * accumulate / nbs  # scale weight_decay\n', ""
    )
    assert acl301.findings(source) == [("ACL301", *at(source, "scaler.scale(loss).backward()"))]
    lr_scaled = YOLO_NOMINAL_BATCH.replace('hyp["weight_decay"] *=', 'hyp["lr0"] *=')
    assert acl301.findings(lr_scaled) == [("ACL301", *at(lr_scaled, "scaler.scale(loss)"))]
    by_k_only = YOLO_NOMINAL_BATCH.replace("batch_size * accumulate / nbs", "accumulate")
    assert acl301.findings(by_k_only) == [("ACL301", *at(by_k_only, "scaler.scale(loss)"))]


@pytest.mark.parametrize("size", ["imgs.size(0)", "imgs.shape[0]", "len(imgs)", "batch_size"])
def test_loss_multiplied_by_the_batch_size_is_a_sum_on_purpose(acl301, at, size):
    source = f"""
    import torch.nn.functional as F

    def train(model, loader, optimizer, batch_size, accum_iter):
        for it, (imgs, targets) in enumerate(loader):
            loss = F.smooth_l1_loss(model(imgs), targets) * {size}
            loss.backward()
            if (it + 1) % accum_iter == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl301.findings(source) == []
    weighted = source.replace(f"* {size}", "* box_gain")
    assert acl301.findings(weighted) == [("ACL301", *at(weighted, "loss.backward()"))]


AVERAGING_TRAINER = """
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, optimizer, loader, accum_steps=4):
        self.model = model
        self.optimizer = optimizer
        self.loader = loader
        self.accum_steps = accum_steps

    def _average_gradients(self):
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.div_(self.accum_steps)

    def _optimizer_step(self):
        self._average_gradients()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def train_step(self, batch):
        inputs, targets = batch
        loss = F.cross_entropy(self.model(inputs), targets)
        loss.backward()
        return loss.item()

    def train(self):
        for i, batch in enumerate(self.loader):
            self.train_step(batch)
            if (i + 1) % self.accum_steps == 0:
                self._optimizer_step()
"""


@pytest.mark.parametrize(
    "division",
    [
        "p.grad.div_(self.accum_steps)",
        "p.grad /= self.accum_steps",
        "p.grad.data.mul_(1.0 / self.accum_steps)",
    ],
)
def test_gradients_divided_in_a_helper_method(acl301, division):
    source = AVERAGING_TRAINER.replace("p.grad.div_(self.accum_steps)", division)
    assert acl301.findings(source) == []


def test_trainer_without_the_gradient_average_is_flagged(acl301, at):
    source = AVERAGING_TRAINER.replace("        self._average_gradients()\n", "")
    assert acl301.findings(source) == [("ACL301", *at(source, "loss.backward()"))]
    assert "        (loss / self.accum_steps).backward()\n" in acl301.fixed(source)


FOREACH_HELPER = """
import torch
import torch.nn.functional as F


def scale_grads(model, accum_steps):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    torch._foreach_div_(grads, accum_steps)


def train(model, optimizer, loader, accum_steps):
    model.train()
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if (step + 1) % accum_steps == 0:
            scale_grads(model, accum_steps)
            optimizer.step()
            optimizer.zero_grad()
"""


def test_gradients_divided_by_a_helper_function_the_loop_calls(acl301, at):
    assert acl301.findings(FOREACH_HELPER) == []
    # called once before training (say, to check the hook): the windows are not divided
    before = FOREACH_HELPER.replace("            scale_grads(model, accum_steps)\n", "").replace(
        "    model.train()\n", "    model.train()\n    scale_grads(model, accum_steps)\n"
    )
    assert acl301.findings(before) == [("ACL301", *at(before, "loss.backward()"))]


def test_gradients_divided_in_the_loop_of_a_per_batch_method(acl301):
    source = AVERAGING_TRAINER.replace(
        "                self._optimizer_step()",
        "                for p in self.model.parameters():\n"
        "                    p.grad /= self.accum_steps\n"
        "                self.optimizer.step()\n"
        "                self.optimizer.zero_grad()",
    )
    assert acl301.findings(source) == []


TD3 = """
import torch
import torch.nn.functional as F

for global_step in range(args.total_timesteps):
    data = rb.sample(args.batch_size)
    with torch.no_grad():
        next_state_actions = target_actor(data.next_observations)
        qf1_next_target = qf1_target(data.next_observations, next_state_actions)
        next_q_value = data.rewards.flatten() + args.gamma * qf1_next_target.view(-1)
    qf1_a_values = qf1(data.observations, data.actions).view(-1)
    qf_loss = F.mse_loss(qf1_a_values, next_q_value)

    q_optimizer.zero_grad()
    qf_loss.backward()
    q_optimizer.step()

    if global_step % args.policy_frequency == 0:
        actor_loss = -qf1(data.observations, actor(data.observations)).mean()
        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
"""


def test_delayed_policy_update_is_not_accumulation(acl301):
    # cleanrl TD3/SAC: the critic steps every iteration, the actor every policy_frequency
    assert acl301.findings(TD3) == []


ARMS = """
import torch
import torch.nn.functional as F

optimizers = [torch.optim.Adam(head.parameters()), torch.optim.SGD(body.parameters(), lr=0.1)]
for step in range(steps):
    F.mse_loss(model(x), y).backward()
    if step % 2 == 0:
        optimizers[1].step()
        optimizers[1].zero_grad(set_to_none=True)
    else:
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
"""


def test_a_condition_whose_both_arms_step_makes_no_window(acl301, at):
    """modded-nanogpt: one optimizer steps every iteration, the other every second one; the
    condition picks the optimizers, and dividing the loss by 2 would halve every update of the
    first. With no step in the other arm it is a window again."""
    assert acl301.findings(ARMS) == []
    one_arm = ARMS[: ARMS.index("    else:")]
    assert acl301.findings(one_arm) == [("ACL301", *at(one_arm, "F.mse_loss(model(x), y)"))]


def test_critic_accumulated_under_the_delay_gate_is_flagged(acl301, at):
    # the critic's step moved under the gate: its window now sums policy_frequency losses
    critic_step = "        q_optimizer.step()\n        q_optimizer.zero_grad()\n"
    source = (
        TD3.replace("    q_optimizer.zero_grad()\n", "")
        .replace("    q_optimizer.step()\n", "")
        .replace(
            "        actor_optimizer.step()\n", "        actor_optimizer.step()\n" + critic_step
        )
    )
    assert acl301.findings(source) == [("ACL301", *at(source, "qf_loss.backward()"))]


def test_loss_callable_passed_in_gets_no_fix(acl301, at):
    # the reduction of `compute_loss` is whatever the caller hands in: YOLO's sums on purpose
    source = """
    import torch

    def train(model, compute_loss, loader, optimizer, scaler, accumulate):
        last_opt_step = -1
        for i, (imgs, targets) in enumerate(loader):
            with torch.autocast("cuda"):
                loss, loss_items = compute_loss(model(imgs), targets)
            scaler.scale(loss).backward()
            if i - last_opt_step >= accumulate:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                last_opt_step = i
    """
    (diagnostic,) = acl301.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "scaler.scale(loss)")
    assert "`compute_loss`" in diagnostic.message
    assert diagnostic.fix is None
    assert acl301.fixed(source, unsafe=True) == textwrap.dedent(source)


def test_loss_callable_the_caller_builds_from_torch_keeps_its_fix(acl301, at):
    source = """
    import torch.nn as nn

    def train(model, loss_fn, loader, optimizer, accum):
        for i, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y)
            loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    train(net, nn.MSELoss(), train_loader, opt, 4)
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "loss.backward()"))]
    assert "loss = loss / accum\n" in acl301.fixed(source)
    named = source.replace(
        "    train(net, nn.MSELoss(), train_loader, opt, 4)",
        "    mse = nn.MSELoss()\n    train(net, mse, train_loader, opt, 4)",
    )
    assert "loss = loss / accum\n" in acl301.fixed(named)
    custom = source.replace("nn.MSELoss()", "FocalLoss(gamma=2)").replace(
        "import torch.nn as nn", "from losses import FocalLoss"
    )
    (diagnostic,) = acl301.diagnostics(custom)
    assert diagnostic.fix is None


def test_generator_accumulated_beside_a_discriminator_stepped_every_batch(acl301, at):
    # the discriminator's zero_grad wipes what its own step would have taken of `g_loss`
    source = """
    import torch
    import torch.nn.functional as F

    for i, (real, _) in enumerate(loader):
        fake = generator(torch.randn(real.size(0), nz, 1, 1, device=device))
        g_loss = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
        g_loss.backward()
        d_optimizer.zero_grad()
        d_loss = F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros)
        d_loss.backward()
        d_optimizer.step()
        if (i + 1) % args.accum_steps == 0:
            g_optimizer.step()
            g_optimizer.zero_grad()
    """
    assert acl301.findings(source) == [("ACL301", *at(source, "g_loss.backward()"))]


STYLEGAN2 = """
import torch
from torch.nn import functional as F

for idx in pbar:
    i = idx + args.start_iter
    real_img = next(loader).to(device)
    fake_img, _ = generator(mixing_noise(args.batch, args.latent, args.mixing, device))
    d_loss = F.softplus(discriminator(fake_img)).mean() + F.softplus(-discriminator(real_img))
    discriminator.zero_grad()
    d_loss.backward()
    d_optim.step()

    d_regularize = i % args.d_reg_every == 0
    if d_regularize:
        real_img.requires_grad = True
        real_pred = discriminator(real_img)
        r1_loss = d_r1_loss(real_pred, real_img)
        discriminator.zero_grad()
        (args.r1 / 2 * r1_loss * args.d_reg_every + 0 * real_pred[0]).backward()
        d_optim.step()

    fake_img, _ = generator(mixing_noise(args.batch, args.latent, args.mixing, device))
    g_loss = F.softplus(-discriminator(fake_img)).mean()
    generator.zero_grad()
    g_loss.backward()
    g_optim.step()

    g_regularize = i % args.g_reg_every == 0
    if g_regularize:
        fake_img, latents = generator(noise, return_latents=True)
        path_loss, mean_path_length, _ = g_path_regularize(fake_img, latents, mean_path_length)
        generator.zero_grad()
        weighted_path_loss = args.path_regularize * args.g_reg_every * path_loss
        weighted_path_loss.backward()
        g_optim.step()
"""


def test_lazy_regularisation_of_both_networks_is_not_accumulation(acl301):
    # StyleGAN2: G and D step every iteration; each `i % reg_every` block is an update of its
    # own, and `* args.g_reg_every` compensates on purpose for applying the penalty lazily
    assert acl301.findings(STYLEGAN2) == []


def test_generator_updated_every_n_critic_in_a_block_of_its_own(acl301, at):
    # WGAN-style: G's whole update (zero_grad, backward, step) runs under its own modulus
    source = STYLEGAN2.replace("    g_optim.step()\n\n", "\n").replace(
        "    generator.zero_grad()\n    g_loss.backward()\n", ""
    )
    source = source.replace(
        "        weighted_path_loss.backward()\n",
        "        (weighted_path_loss + g_loss).backward()\n",
    )
    source = source.replace(
        "for idx in pbar:",
        "g_optim = torch.optim.Adam(generator.parameters(), lr=args.lr, betas=(0, 0.99))\n"
        "for idx in pbar:",
    )
    assert source.count("g_optim.step()") == 1
    assert acl301.findings(source) == []
    # the block zeroes the discriminator instead: G's gradients pile up over g_reg_every steps
    wrong = source.replace("        generator.zero_grad()\n", "        discriminator.zero_grad()\n")
    assert acl301.findings(wrong) == [
        ("ACL301", *at(wrong, "(weighted_path_loss + g_loss).backward()"))
    ]


def test_generator_accumulated_into_its_lazy_step_is_flagged(acl301, at):
    # no zero_grad in G's block and no step outside it: `g_loss` sums g_reg_every iterations
    source = (
        STYLEGAN2.replace(
            "    generator.zero_grad()\n    g_loss.backward()\n    g_optim.step()\n",
            "    g_loss.backward()\n",
        )
        .replace("        generator.zero_grad()\n", "")
        .replace(
            "        g_optim.step()\n", "        g_optim.step()\n        generator.zero_grad()\n"
        )
    )
    assert acl301.findings(source) == [
        ("ACL301", *at(source, "g_loss.backward()")),
        ("ACL301", *at(source, "weighted_path_loss.backward()")),
    ]


TOKEN_SUM = """
import torch
from torchtune import training

num_tokens = 0
for idx, batch in enumerate(dataloader):
    current_num_tokens = (batch["labels"] != loss_fn.ignore_index).sum()
    num_tokens += current_num_tokens
    logits = model(batch["tokens"])
    current_loss = loss_fn(logits, batch["labels"]) * current_num_tokens
    current_loss.backward()
    if (idx + 1) % gradient_accumulation_steps == 0:
        training.scale_grads(model, 1 / num_tokens)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        num_tokens = 0
"""


@pytest.mark.parametrize(
    "scaling",
    [
        "training.scale_grads(model, 1 / num_tokens)",
        "training.scale_grads_(model.parameters(), 1.0 / num_tokens)",
        "inv = 1.0 / num_tokens\n        utils.apply_factor(model.parameters(), inv)",
        "grad_utils.normalize_grads(model)",
    ],
)
def test_gradients_scaled_by_an_imported_helper_before_the_step(acl301, scaling):
    # torchtune: each loss is a token sum; an imported helper divides `.grad` by the window's
    # token count before the step, which the linter cannot read: a possible gradient division
    source = TOKEN_SUM.replace("training.scale_grads(model, 1 / num_tokens)", scaling)
    assert acl301.findings(source) == []


def test_gradients_scaled_in_a_trainer_method_by_an_imported_helper(acl301):
    source = """
    from torchtune import training

    class FullFinetuneRecipeSingleDevice:
        def train(self):
            num_tokens = 0
            for idx, batch in enumerate(self._dataloader):
                current_num_tokens = (batch["labels"] != self._loss_fn.ignore_index).sum()
                num_tokens += current_num_tokens
                current_loss = self._loss_step(batch) * current_num_tokens
                current_loss.backward()
                if (idx + 1) % self._gradient_accumulation_steps == 0:
                    training.scale_grads_(self._model.parameters(), 1.0 / num_tokens)
                    self._optimizer.step()
                    self._optimizer.zero_grad(set_to_none=True)
                    num_tokens = 0
    """
    assert acl301.findings(source) == []


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("", ""),
        ("wandb.watch(model)", ""),
        ("print(model)", ""),
        ("logger.log_model(model, idx)", ""),
        ("torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)", ""),
        ("", "training.scale_grads(model, 1 / num_tokens)"),
    ],
)
def test_calls_that_do_not_scale_gradients_before_the_step_hide_nothing(acl301, at, before, after):
    # no call, a call handed the model without a ratio, clipping, or scaling after the step
    source = TOKEN_SUM.replace(
        "        training.scale_grads(model, 1 / num_tokens)\n",
        f"        {before}\n" if before else "",
    ).replace(
        "        optimizer.step()\n",
        f"        optimizer.step()\n        {after}\n" if after else "        optimizer.step()\n",
    )
    assert acl301.findings(source) == [("ACL301", *at(source, "current_loss.backward()"))]


def test_loss_weighted_by_a_command_line_setting_names_no_parser_and_is_fixed(acl301, at):
    # `args.path_regularize` is a setting: the loss comes from `path_penalty`, not the parser
    source = """
    import argparse

    import torch.nn.functional as F

    def path_penalty(fake_img, latents):
        return F.mse_loss(fake_img, latents)

    def train(args, loader, generator, g_optim):
        for i, noise in enumerate(loader):
            fake_img, latents = generator(noise, return_latents=True)
            weighted_path_loss = args.path_regularize * path_penalty(fake_img, latents)
            weighted_path_loss.backward()
            if (i + 1) % args.accum == 0 or i + 1 == len(loader):
                g_optim.step()
                g_optim.zero_grad()

    parser = argparse.ArgumentParser()
    parser.add_argument("--path_regularize", type=float, default=2.0)
    args = parser.parse_args()
    train(args, loader, generator, g_optim)
    """
    (diagnostic,) = acl301.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(
        source, "weighted_path_loss.backward()"
    )
    assert "parse_args" not in diagnostic.message
    assert "weighted_path_loss = weighted_path_loss / args.accum\n" in acl301.fixed(source)


def test_an_engine_backward_given_the_loss_by_keyword_is_the_engines(acl301):
    """ColossalAI's `booster.backward(loss=..., optimizer=...)`: `Tensor.backward` has no
    `loss` parameter, so the receiver is an engine, not the loss (it was reported as
    "`booster` is backpropagated undivided" beside a loss divided by K)."""
    source = """
    from colossalai.booster import Booster

    booster = Booster(plugin=plugin)
    model, optimizer, _, dataloader, _ = booster.boost(model, optimizer, dataloader=dataloader)
    for step, x in enumerate(dataloader):
        loss = model(x.cuda()).pow(2).mean()
        booster.backward(loss=loss / accumulation_steps, optimizer=optimizer)
        if (step + 1) % accumulation_steps == 0 or step + 1 == len(dataloader):
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl301.findings(source) == []
    raw = source.replace(
        "booster.backward(loss=loss / accumulation_steps, optimizer=optimizer)", "loss.backward()"
    )
    assert [code for code, *_ in acl301.findings(raw)] == ["ACL301"]


def test_an_assignment_in_a_sibling_branch_never_reaches_the_backward(acl301, at):
    """ChatGLM's trainer: `elif engine: loss = engine.backward(loss)` cannot hold its value in
    the `else:` branch, whose loss was divided on the way there (it was named the origin)."""
    source = """
    def training_step(model, batch, args, engine=None, scaler=None):
        loss = model(**batch).loss
        if args.gradient_accumulation_steps > 1 and engine is None:
            loss = loss / args.gradient_accumulation_steps
        if scaler is not None:
            scaler.scale(loss).backward()
        elif engine is not None:
            loss = engine.backward(loss)
        else:
            loss.backward()
        return loss.detach()


    def train(model, optimizer, dataloader, args):
        for step, batch in enumerate(dataloader):
            training_step(model, batch, args)
            if (step + 1) % args.gradient_accumulation_steps == 0 or step + 1 == len(dataloader):
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl301.findings(source) == []
    undivided = source.replace(
        "        if args.gradient_accumulation_steps > 1 and engine is None:\n"
        "            loss = loss / args.gradient_accumulation_steps\n",
        "",
    )
    found = acl301.diagnostics(undivided)
    # Both raw backward paths fire (the scaler's and the plain one), and neither names the
    # engine's branch as where the loss comes from.
    assert [(d.code, d.start.line, d.start.column) for d in found] == [
        ("ACL301", 5, 8),
        ("ACL301", 9, 8),
    ]
    assert all("engine.backward" not in d.message for d in found)
