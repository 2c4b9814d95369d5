"""ACL502 eval-without-no-grad: evaluation that records graphs or runs in the wrong mode."""

from __future__ import annotations

import pytest

DATA = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""

VALIDATE = (
    DATA
    + """
def validate(model, loader):
    model.eval()
    return sum(crit(model(x), y).item() for x, y in loader) / len(loader)

model.train()
for epoch in range(3):
    for x, y in train_loader:
        crit(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    print(validate(model, val_loader))
"""
)


def test_validate_without_no_grad_that_leaves_eval_mode_is_one_finding(acl502, at):
    [finding] = acl502.diagnostics(VALIDATE)
    assert (finding.code, finding.start.line, finding.start.column) == (
        "ACL502",
        *at(VALIDATE, "model(x), y).item()"),
    )
    assert "gradients enabled" in finding.message and "model.train()" in finding.message
    assert finding.severity == "error"  # the mode leak folded in: training continues in eval


def test_eval_loop_over_a_val_loader_without_no_grad(acl502, at):
    source = (
        DATA
        + """
for epoch in range(3):
    model.train()
    for x, y in train_loader:
        crit(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    for x, y in tqdm(val_loader):
        val_loss = crit(model(x), y)
"""
    )
    assert acl502.findings(source) == [("ACL502", *at(source, "model(x), y)", 1))]
    # gradients alone: time and memory wasted, the results are right
    assert acl502.diagnostics(source)[0].severity is None
    assert __import__("rules").ALL_RULES["ACL502"].severity == "warning"


def test_trainer_method_named_evaluate(acl502, at):
    source = """
    import torch

    class Trainer:
        def evaluate(self):
            self.model.eval()
            for batch in self.loader:
                out = self.model(batch)
                self.metric.update(out)
    """
    assert acl502.findings(source) == [("ACL502", *at(source, "self.model(batch)"))]


def test_eval_mode_never_undone_in_the_epoch_loop(acl502, at):
    source = (
        DATA
        + """
model.train()
for epoch in range(3):
    for x, y in train_loader:
        crit(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        for x, y in val_loader:
            crit(model(x), y)
"""
    )
    assert acl502.findings(source) == [("ACL502", *at(source, "model.eval()"))]
    assert acl502.diagnostics(source)[0].severity == "error"


def test_eval_mode_set_inside_a_helper_called_each_epoch(acl502, at):
    source = (
        DATA
        + """
@torch.no_grad()
def evaluate(net, loader):
    net.eval()
    return [net(x) for x, _ in loader]

def main():
    model.train()
    for epoch in range(2):
        for x, y in train_loader:
            crit(model(x), y).backward()
            opt.step()
        evaluate(model, val_loader)
"""
    )
    assert acl502.findings(source) == [("ACL502", *at(source, "net.eval()"))]


def test_evaluation_in_a_file_that_never_sets_eval_mode(acl502, at):
    source = (
        DATA
        + """
for epoch in range(3):
    for x, y in train_loader:
        crit(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        for x, y in val_loader:
            crit(model(x), y)
"""
    )
    [finding] = acl502.diagnostics(source)
    assert (finding.start.line, finding.start.column) == at(source, "model(x), y)", 1)
    assert "no `.eval()`" in finding.message
    assert finding.severity == "error"  # dropout on, BatchNorm updated from evaluation data


GOOD_BODIES = {
    "no_grad_decorator": "@torch.no_grad()\ndef validate(model, loader):\n"
    "    model.eval()\n    return [model(x) for x, _ in loader]\n",
    "bare_decorator": "@torch.inference_mode\ndef evaluate(model, loader):\n"
    "    model.eval()\n    return [model(x) for x, _ in loader]\n",
    "project_decorator": "@smart_inference_mode()\ndef validate(model, loader):\n"
    "    model.eval()\n    return [model(x) for x, _ in loader]\n",
    "with_two_items": "def validate(model, loader):\n    model.eval()\n"
    "    with torch.no_grad(), torch.autocast('cuda'):\n"
    "        return [model(x) for x, _ in loader]\n",
    "set_grad_enabled_statement": "def validate(model, loader):\n    model.eval()\n"
    "    torch.set_grad_enabled(False)\n    return [model(x) for x, _ in loader]\n",
    "generate": "def evaluate(model, loader):\n    model.eval()\n"
    "    return [model.generate(x) for x, _ in loader]\n",
    "test_time_adaptation": "def test(model, loader):\n    model.eval()\n"
    "    for x, _ in loader:\n        loss = model(x).entropy()\n        loss.backward()\n",
    "saliency": "def evaluate(model, loader):\n    model.eval()\n    for x, y in loader:\n"
    "        x.requires_grad_(True)\n"
    "        g = torch.autograd.grad(model(x)[0, y], x)\n",
    "lightning_hook": "class Lit(LightningModule):\n"
    "    def validation_step(self, batch, idx):\n        return self.model(batch)\n",
    "factory_call": "@torch.no_grad()\ndef validate(loader):\n    model = create_model('x')\n"
    "    model.eval()\n    return [model(x) for x, _ in loader]\n",
    "restores_train_mode": "@torch.no_grad()\ndef validate(model, loader):\n"
    "    model.eval()\n    try:\n        return [model(x) for x, _ in loader]\n"
    "    finally:\n        model.train()\n",
}


@pytest.mark.parametrize("body", GOOD_BODIES.values(), ids=GOOD_BODIES.keys())
def test_clean_evaluation_functions(acl502, body):
    assert acl502.findings(DATA + body) == []


def test_caller_wraps_the_evaluate_helper_in_no_grad(acl502):
    source = (
        DATA
        + """
def evaluate(model, loader):
    model.eval()
    out = [model(x) for x, _ in loader]
    model.train()
    return out

with torch.no_grad():
    evaluate(model, val_loader)
"""
    )
    assert acl502.findings(source) == []


def test_phase_loop_with_set_grad_enabled(acl502):
    source = (
        DATA
        + """
for epoch in range(2):
    for phase in ["train", "val"]:
        model.train() if phase == "train" else model.eval()
        for x, y in loaders[phase]:
            with torch.set_grad_enabled(phase == "train"):
                loss = crit(model(x), y)
                if phase == "train":
                    loss.backward()
                    opt.step()
"""
    )
    assert acl502.findings(source) == []


def test_train_at_the_top_of_each_epoch_is_clean(acl502):
    source = (
        DATA
        + """
for epoch in range(3):
    model.train()
    for x, y in train_loader:
        crit(model(x), y).backward()
        opt.step()
    model.eval()
    with torch.inference_mode():
        val = [crit(model(x), y).item() for x, y in val_loader]
"""
    )
    assert acl502.findings(source) == []


def test_train_mode_restored_by_an_imported_epoch_function(acl502):
    source = (
        DATA
        + """
from engine import train_one_epoch

for epoch in range(3):
    for x, y in train_loader:
        crit(model(x), y).backward()
        opt.step()
    train_one_epoch(model, extra_loader)
    model.eval()
"""
    )
    assert acl502.findings(source) == []


def test_frozen_teacher_stays_in_eval_mode(acl502):
    source = (
        DATA
        + """
teacher.requires_grad_(False)
model.train()
for epoch in range(3):
    teacher.eval()
    for x, y in train_loader:
        with torch.no_grad():
            target = teacher(x)
        crit(model(x), target).backward()
        opt.step()
"""
    )
    assert acl502.findings(source) == []


def test_function_that_trains_through_a_helper_is_not_an_evaluation(acl502):
    source = (
        DATA
        + """
def train(model, loader):
    for x, y in loader:
        crit(model(x), y).backward()
        opt.step()

def eval_linear(model, loader):
    train(model, loader)
    model.eval()
    return model(next(iter(loader))[0])
"""
    )
    assert acl502.findings(source) == []


def test_never_setting_eval_mode_without_dropout_or_batchnorm_is_clean(acl502):
    source = """
    import torch

    for epoch in range(3):
        for x, y in train_loader:
            crit(net(x), y).backward()
            opt.step()
        with torch.no_grad():
            for x, y in test_loader:
                crit(net(x), y)
    """
    assert acl502.findings(source) == []


def test_pretrained_model_never_switched_to_train_is_already_in_eval_mode(acl502):
    source = """
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained("name")
    with torch.no_grad():
        for batch in eval_loader:
            model(**batch)
    """
    assert acl502.findings(source) == []


def test_train_with_a_mode_argument_may_switch_back(acl502):
    source = (
        DATA
        + """
for epoch in range(3):
    for x, y in train_loader:
        crit(model(x), y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val = [crit(model(x), y) for x, y in val_loader]
    model.train(mode=args.train_mode)
"""
    )
    assert acl502.findings(source) == []


def test_other_frameworks_are_not_judged(acl502):
    source = """
    import mxnet as mx

    def validate(net, val_data):
        for batch in val_data:
            outputs = net(batch.data[0])
    """
    assert acl502.findings(source) == []


def test_frozen_model_records_no_graph(acl502):
    source = (
        DATA
        + """
encoder.requires_grad_(False)
encoder.eval()

def evaluate(loader):
    return [encoder(x) for x, _ in loader]
"""
    )
    assert acl502.findings(source) == []


def test_smoke_test_function_is_not_an_evaluation(acl502):
    source = """
    import torch

    def test():
        net = ResNet18()
        y = net(torch.randn(1, 3, 32, 32))
        print(y.size())
    """
    assert acl502.findings(source) == []


def test_per_batch_evaluate_step_called_from_a_loop(acl502, at):
    source = """
    import torch

    def evaluate(model, batch):
        model.eval()
        return model(batch["x"])

    for batch in loader:
        evaluate(model, batch)
    """
    assert acl502.findings(source) == [("ACL502", *at(source, 'model(batch["x"])'))]


def test_linear_probe_trains_with_its_backbone_in_eval_mode(acl502):
    source = (
        DATA
        + """
def train(loader, model):
    model.eval()  # frozen backbone: BatchNorm statistics must not move
    for x, y in loader:
        crit(model(x), y).backward()
        opt.step()

@torch.no_grad()
def validate(loader, model):
    model.eval()
    return [model(x) for x, _ in loader]

for epoch in range(3):
    train(train_loader, model)
    validate(val_loader, model)
"""
    )
    assert acl502.findings(source) == []


def test_warm_up_forward_beside_the_evaluation_loop_is_not_it(acl502):
    source = (
        DATA
        + """
def test(model, loader):
    model.eval()
    model(torch.zeros(1, 8))  # warm-up
    with torch.no_grad():
        for x, _ in loader:
            model(x)

for weights in all_weights:
    test(model, loader)
"""
    )
    assert acl502.findings(source) == []


def test_a_model_from_from_pretrained_is_in_eval_mode_already(acl502, at):
    """PixArt's validation embeddings: the text encoder comes from `from_pretrained()` (eval
    mode) and is never trained, so only the missing no_grad is said (a warning)."""
    source = """
    import torch
    from accelerate import Accelerator
    from transformers import T5EncoderModel, T5Tokenizer

    accelerator = Accelerator()

    def prepare_vis(path):
        validation_prompts = ["a dog", "a cat"]
        tok = T5Tokenizer.from_pretrained(path)
        text_encoder = T5EncoderModel.from_pretrained(path).to(accelerator.device)
        if accelerator.is_main_process:
            for prompt in validation_prompts:
                ids = tok(prompt, return_tensors="pt").to(accelerator.device)
                emb = text_encoder(ids.input_ids, attention_mask=ids.attention_mask)[0]
                torch.save(emb, f"{prompt}.pt")

    def train(model, opt, dl):
        model, opt, dl = accelerator.prepare(model, opt, dl)
        for batch in dl:
            accelerator.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()
    """
    (found,) = acl502.diagnostics(source)
    assert (found.start.line, found.start.column) == at(source, "text_encoder(ids")
    assert found.severity is None and "training mode" not in found.message
    trained = source.replace("    def train(", "    text_encoder.train()\n\n    def train(")
    (found,) = acl502.diagnostics(trained.replace("text_encoder.train()", "enc.train()"))
    assert found.severity is None  # another model's train() says nothing of this one
