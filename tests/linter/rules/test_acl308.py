"""ACL308 token-mean-under-accumulation: per-micro-batch token means under accumulation."""

from __future__ import annotations

ACCELERATE = """
import torch.nn.functional as F
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

accelerator = Accelerator(gradient_accumulation_steps=8)
model = AutoModelForCausalLM.from_pretrained("gpt2")
dl = DataLoader(data, collate_fn=DataCollatorForSeq2Seq(tokenizer, model=model))
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        LOSS
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
"""


def accelerate(loss_lines: str) -> str:
    return ACCELERATE.replace("LOSS", loss_lines.replace("\n", "\n        "))


def test_cross_entropy_on_flattened_logits(acl308, at):
    source = accelerate(
        'logits = model(batch["input_ids"]).logits\n'
        'loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())'
    )
    assert acl308.findings(source) == [("ACL308", *at(source, "F.cross_entropy"))]
    message = acl308.diagnostics(source)[0].message
    assert "K = `8`" in message and 'reduction="sum"' in message


def test_cross_entropy_with_ignore_index(acl308, at):
    source = accelerate(
        "logits = model(batch['input_ids']).logits\n"
        "loss = F.cross_entropy(logits.transpose(1, 2), batch['labels'], ignore_index=-100)"
    )
    assert acl308.findings(source) == [("ACL308", *at(source, "F.cross_entropy"))]


def test_loss_object_on_logits_flattened_beforehand(acl308, at):
    source = """
    import torch
    from torch import nn

    crit = nn.CrossEntropyLoss()
    for step, (ids, labels) in enumerate(loader):
        labels[ids == pad_id] = -100
        logits = model(ids)
        flat = logits.view(-1, logits.size(-1))
        loss = crit(flat, labels.view(-1)) / args.grad_accum
        loss.backward()
        if (step + 1) % args.grad_accum == 0 or step + 1 == len(loader):
            opt.step()
            opt.zero_grad()
    """
    assert acl308.findings(source) == [("ACL308", *at(source, "crit(flat"))]


def test_loss_object_built_with_ignore_index_in_a_trainer_method(acl308, at):
    source = """
    from torch import nn

    class Trainer:
        def __init__(self, model, accum):
            self.model = model
            self.accum = accum
            self.loss_fn = nn.CrossEntropyLoss(ignore_index=0)

        def train(self, loader):
            for i, (src, tgt) in enumerate(loader):
                out = self.model(src)
                loss = self.loss_fn(out.permute(0, 2, 1), tgt)
                (loss / self.accum).backward()
                if (i + 1) % self.accum == 0 or i + 1 == len(loader):
                    self.opt.step()
                    self.opt.zero_grad()
    """
    assert acl308.findings(source) == [("ACL308", *at(source, "self.loss_fn(out"))]


def test_causal_lm_loss_with_labels(acl308, at):
    source = accelerate(
        'outputs = model(input_ids=batch["input_ids"], labels=batch["labels"])\nloss = outputs.loss'
    )
    assert acl308.findings(source) == [("ACL308", *at(source, "outputs.loss"))]
    message = acl308.diagnostics(source)[0].message
    assert "`.loss` of a model built as `AutoModelForCausalLM`" in message


def test_causal_lm_loss_of_a_batch_dict_in_a_nanogpt_style_micro_loop(acl308, at):
    source = """
    from transformers import GPT2LMHeadModel

    def pad(batch):
        return {"input_ids": pad_sequence(batch), "labels": pad_sequence(batch, padding_value=-100)}

    model = GPT2LMHeadModel.from_pretrained("gpt2").to(device)
    while step < max_steps:
        for micro_step in range(grad_accum_steps):
            batch = next(batches)
            loss = model(**batch).loss / grad_accum_steps
            loss.backward()
        opt.step()
        opt.zero_grad()
    """
    assert acl308.findings(source) == [("ACL308", *at(source, "model(**batch).loss"))]


def test_loss_returned_by_a_helper_function(acl308, at):
    source = """
    import torch.nn.functional as F

    def lm_loss(model, ids, labels):
        labels = labels.masked_fill(ids == pad_id, -100)
        logits = model(ids)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    def train_one_epoch(model, loader, opt, accum):
        for i, (ids, labels) in enumerate(loader):
            loss = lm_loss(model, ids, labels) / accum
            loss.backward()
            if (i + 1) % accum == 0 or i + 1 == len(loader):
                opt.step()
                opt.zero_grad()
    """
    assert acl308.findings(source) == [("ACL308", *at(source, "F.cross_entropy"))]


def test_texts_packed_into_blocks_of_one_length(acl308):
    """Without masked or padded labels anywhere (texts grouped into fixed blocks), every
    micro-batch has the same number of tokens: a token mean there has no bias."""
    packed = accelerate("loss = model(**batch).loss").replace(
        "dl = DataLoader(data, collate_fn=DataCollatorForSeq2Seq(tokenizer, model=model))\n", ""
    )
    assert acl308.findings(packed) == []
    flattened = accelerate(
        'logits = model(batch["input_ids"]).logits\n'
        'loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())'
    ).replace("collate_fn=DataCollatorForSeq2Seq(tokenizer, model=model)", "batch_size=8")
    assert acl308.findings(flattened) == []


def test_an_ignore_index_on_the_loss_is_evidence_enough(acl308, at):
    source = accelerate(
        'logits = model(batch["input_ids"]).logits\n'
        'loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=0)'
    ).replace("collate_fn=DataCollatorForSeq2Seq(tokenizer, model=model)", "batch_size=8")
    assert acl308.findings(source) == [("ACL308", *at(source, "F.cross_entropy"))]


def test_sum_divided_by_the_token_count_is_not_a_mean(acl308):
    source = accelerate(
        'logits = model(batch["input_ids"]).logits\n'
        'total = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), '
        'reduction="sum")\n'
        "loss = total * accelerator.gradient_accumulation_steps / window_tokens"
    )
    assert acl308.findings(source) == []


def test_none_reduction_summed_is_not_a_mean(acl308):
    source = accelerate(
        'logits = model(batch["input_ids"]).logits\n'
        'per_token = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), '
        'reduction="none")\n'
        "loss = per_token.sum() / n_window_tokens"
    )
    assert acl308.findings(source) == []


def test_mean_reweighted_by_its_token_count(acl308):
    source = accelerate(
        'logits = model(batch["input_ids"]).logits\n'
        'mean = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())\n'
        "loss = mean * n_tokens / window_tokens"
    )
    assert acl308.findings(source) == []


def test_model_given_num_items_in_batch(acl308):
    source = accelerate("loss = model(**batch, num_items_in_batch=num_items).loss")
    assert acl308.findings(source) == []


def test_sequence_classification_loss(acl308):
    source = accelerate(
        'clf = AutoModelForSequenceClassification.from_pretrained("bert")\nloss = clf(**batch).loss'
    ).replace("accumulate(model)", "accumulate(clf)")
    assert acl308.findings(source) == []


def test_classification_on_pooled_outputs(acl308):
    source = """
    import torch.nn.functional as F

    for i, (x, y) in enumerate(loader):
        logits = model(x.view(-1, 784))
        loss = F.cross_entropy(logits, y) / 4
        loss.backward()
        if (i + 1) % 4 == 0 or i + 1 == len(loader):
            opt.step()
            opt.zero_grad()
    """
    assert acl308.findings(source) == []


def test_no_accumulation(acl308):
    source = accelerate(
        'logits = model(batch["input_ids"]).logits\n'
        'loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())'
    ).replace("gradient_accumulation_steps=8", "mixed_precision='bf16'")
    assert acl308.findings(source) == []


def test_step_every_batch_in_a_manual_loop(acl308):
    source = """
    import torch.nn.functional as F

    for ids, labels in loader:
        logits = model(ids)
        loss = F.cross_entropy(logits.view(-1, vocab), labels.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    """
    assert acl308.findings(source) == []


def test_while_loop_with_a_micro_step_counter(acl308, at):
    source = """
    import torch.nn.functional as F

    micro = 0
    while step < max_steps:
        ids, labels = next(batches)
        logits = model(ids)
        loss = F.nll_loss(logits.log_softmax(-1).view(-1, vocab), labels.view(-1), ignore_index=0)
        (loss / cfg.grad_accum).backward()
        micro += 1
        if micro == cfg.grad_accum:
            opt.step()
            opt.zero_grad()
            micro = 0
    """
    assert acl308.findings(source) == [("ACL308", *at(source, "F.nll_loss"))]


def test_adapter_loaded_onto_a_causal_lm(acl308, at):
    source = accelerate("loss = model(**batch).loss").replace(
        'model = AutoModelForCausalLM.from_pretrained("gpt2")\n',
        'model = AutoModelForCausalLM.from_pretrained("gpt2")\n'
        'model = PeftModel.from_pretrained(model, "adapter", is_trainable=True)\n',
    )
    assert acl308.findings(source) == [("ACL308", *at(source, "model(**batch).loss"))]
