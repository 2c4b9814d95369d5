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


NANOGPT = """
import numpy as np
import torch
import torch.nn.functional as F


def get_batch(split):
    data = np.memmap(f"{split}.bin", dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack(
        [torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix]
    )
    return x.to(device), y.to(device)


def train(model, optimizer, gradient_accumulation_steps, max_iters):
    X, Y = get_batch("train")
    for iter_num in range(max_iters):
        for micro_step in range(gradient_accumulation_steps):
            logits = model(X)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), Y.view(-1), ignore_index=-1)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch("train")
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
"""

SHIFTED = """
import torch.nn.functional as F
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
for batch in train_loader:
    with accelerator.accumulate(model):
        x, y = batch[:, :-1], batch[:, 1:]
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1), ignore_index=-1)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
"""

PACKED_TENSOR = """
import numpy as np
import torch
from torch import nn

criterion = nn.CrossEntropyLoss(ignore_index=-1)
tokens = torch.from_numpy(np.load("tokens.npy").astype(np.int64))
data = tokens[: len(tokens) // (T + 1) * (T + 1)].view(-1, T + 1)
for step in range(max_steps):
    for micro in range(grad_accum_steps):
        chunk = data[torch.randint(len(data), (B,))]
        x = chunk[:, :T]
        y = chunk[:, 1 : T + 1]
        logits = model(x)
        loss = criterion(logits.view(-1, logits.size(-1)), y.view(-1))
        (loss / grad_accum_steps).backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_packed_next_token_pretraining(acl308):
    """Targets that are the token stream shifted by one hold raw token ids: a negative
    `ignore_index` never matches, every micro-batch has B * T tokens, no bias (issue 22)."""
    assert acl308.findings(NANOGPT) == []
    assert acl308.findings(SHIFTED) == []
    assert acl308.findings(PACKED_TENSOR) == []
    no_ignore = SHIFTED.replace(", ignore_index=-1", "")
    assert acl308.findings(no_ignore) == []


def test_shifted_targets_with_a_pad_id_ignored_still_vary(acl308, at):
    """A named `ignore_index` (a pad id) matches tokens of the stream: counts vary."""
    source = SHIFTED.replace("ignore_index=-1", "ignore_index=tokenizer.pad_token_id")
    assert acl308.findings(source) == [("ACL308", *at(source, "F.cross_entropy"))]


def test_shifted_targets_masked_afterwards_still_vary(acl308, at):
    source = PACKED_TENSOR.replace(
        "        logits = model(x)\n", "        y[y == eot_token] = -1\n        logits = model(x)\n"
    )
    assert acl308.findings(source) == [("ACL308", *at(source, "criterion(logits"))]


def test_shifted_targets_of_padded_batches_still_vary(acl308, at):
    """Padded to the longest sequence, micro-batches differ in length even without masking."""
    source = SHIFTED.replace(
        "for batch in train_loader:\n",
        "def collate(seqs):\n    return pad_sequence(seqs, batch_first=True, padding_value=0)\n\n"
        "for batch in train_loader:\n",
    )
    assert acl308.findings(source) == [("ACL308", *at(source, "F.cross_entropy"))]


def test_labels_shifted_against_the_logits_are_not_a_token_stream(acl308, at):
    """`labels[..., 1:]` beside `logits[..., :-1, :]` (the HF shift): labels carry -100."""
    source = accelerate(
        'logits = model(batch["input_ids"]).logits\n'
        "shift_logits = logits[..., :-1, :].contiguous()\n"
        'shift_labels = batch["labels"][..., 1:].contiguous()\n'
        "loss = F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), "
        "shift_labels.view(-1), ignore_index=-100)"
    ).replace("collate_fn=DataCollatorForSeq2Seq(tokenizer, model=model)", "batch_size=8")
    assert acl308.findings(source) == [("ACL308", *at(source, "F.cross_entropy"))]


def test_shifted_targets_masked_into_a_new_tensor_still_vary(acl308, at):
    source = SHIFTED.replace(
        "        x, y = batch[:, :-1], batch[:, 1:]\n",
        "        x, y = batch[:, :-1], batch[:, 1:]\n"
        "        y = y.masked_fill(y == tokenizer.pad_token_id, -1)\n",
    )
    assert acl308.findings(source) == [("ACL308", *at(source, "F.cross_entropy"))]


# A sum reduction divided by the window's token count: the catalogue's Right.
PARLER_STYLE = """
import contextlib

from accelerate import Accelerator
from parler_tts import ParlerTTSForConditionalGeneration

accelerator = Accelerator()
gradient_accumulation_steps = 4
model = ParlerTTSForConditionalGeneration.from_pretrained("parler-tts/parler-tts-mini-v1")
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)


def train_step(batch, num_items_in_batch):
    outputs = model(**batch, loss_reduction="sum")
    ce_loss = (
        outputs.loss * gradient_accumulation_steps * accelerator.num_processes
    ) / num_items_in_batch
    return ce_loss


train_iterator = iter(train_dataloader)
for update_step in range(total_steps):
    batch_samples = [next(train_iterator) for _ in range(gradient_accumulation_steps)]
    num_items_in_batch = sum((b["labels"] != -100).sum() for b in batch_samples)
    num_items_in_batch = accelerator.gather(num_items_in_batch).sum().item()
    for i, batch in enumerate(batch_samples):
        ctx = model.no_sync if i < len(batch_samples) - 1 else contextlib.nullcontext
        with ctx():
            loss = train_step(batch, num_items_in_batch)
            accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
"""


def test_model_sum_divided_by_the_gathered_window_count(acl308):
    assert acl308.findings(PARLER_STYLE) == []


def test_model_mean_averaged_over_the_window_still_fires(acl308, at):
    source = PARLER_STYLE.replace(', loss_reduction="sum"', "").replace(
        ") / num_items_in_batch", ") / gradient_accumulation_steps"
    )
    assert acl308.findings(source) == [("ACL308", *at(source, "outputs.loss"))]


def test_model_sum_divided_by_its_own_micro_batch_count_fires(acl308, at):
    source = PARLER_STYLE.replace(") / num_items_in_batch", ') / (batch["labels"] != -100).sum()')
    line, column = at(source, "ce_loss = (")
    assert acl308.findings(source) == [("ACL308", line, column + len("ce_loss = "))]


TRAINER_STYLE = """
import torch.nn.functional as F
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)


def compute_loss(model, inputs, num_items_in_batch=None):
    labels = inputs.pop("labels")
    logits = model(**inputs).logits
    shift_logits = logits[..., :-1, :].contiguous().view(-1, logits.size(-1))
    shift_labels = labels[..., 1:].contiguous().view(-1)
    loss = F.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum")
    return loss / num_items_in_batch


def get_batch_samples(epoch_iterator, num_batches):
    batch_samples = [next(epoch_iterator) for _ in range(num_batches)]
    num_items_in_batch = sum((batch["labels"].ne(-100)).sum() for batch in batch_samples)
    return batch_samples, accelerator.gather(num_items_in_batch).sum().item()


epoch_iterator = iter(train_dataloader)
for step in range(max_steps):
    batch_samples, num_items_in_batch = get_batch_samples(
        epoch_iterator, args.gradient_accumulation_steps
    )
    for inputs in batch_samples:
        with accelerator.accumulate(model):
            loss = compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
            loss = loss * args.gradient_accumulation_steps * accelerator.num_processes
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
"""


def test_trainer_style_compute_loss_given_num_items_in_batch(acl308):
    assert acl308.findings(TRAINER_STYLE) == []


def test_trainer_style_compute_loss_with_the_default_mean_fires(acl308, at):
    source = TRAINER_STYLE.replace(', reduction="sum"', "").replace(
        "return loss / num_items_in_batch", "return loss"
    )
    assert acl308.findings(source) == [("ACL308", *at(source, "F.cross_entropy"))]


def test_trainer_style_sum_divided_by_the_micro_batch_count_fires(acl308, at):
    source = TRAINER_STYLE.replace(
        "    return loss / num_items_in_batch\n",
        "    n_tokens = (shift_labels != -100).sum()\n    loss /= n_tokens\n    return loss\n",
    )
    assert acl308.findings(source) == [("ACL308", *at(source, "loss /= n_tokens"))]


def test_catalogue_right_sum_over_the_gathered_window(acl308):
    source = """
    import torch.nn.functional as F
    from accelerate import Accelerator

    N = 4
    accelerator = Accelerator(gradient_accumulation_steps=N)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    batches = iter(dl)
    for step in range(num_steps):
        window = [next(batches) for _ in range(N)]
        n_tok = accelerator.gather(sum((b["labels"] != -100).sum() for b in window)).sum()
        for b in window:
            with accelerator.accumulate(model):
                logits = model(b["input_ids"]).logits
                s = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), reduction="sum")
                accelerator.backward(s * N * accelerator.num_processes / n_tok)
                opt.step()
                opt.zero_grad()
    """
    assert acl308.findings(source) == []


def test_reduce_sum_over_tokens_all_reduced_across_ranks(acl308):
    source = """
    import torch.distributed as dist
    import torch.nn as nn

    criterion = nn.CrossEntropyLoss(ignore_index=-100, reduction="sum")
    for step, window in enumerate(windows):
        num_items = sum(int(mb["attention_mask"].sum()) for mb in window)
        num_items = torch.tensor(num_items, device=device)
        dist.all_reduce(num_items)
        for micro_step, mb in enumerate(window):
            logits = model(mb["input_ids"], attention_mask=mb["attention_mask"])
            loss = criterion(logits.view(-1, logits.size(-1)), mb["labels"].view(-1))
            (loss * world_size / num_items).backward()
            if (micro_step + 1) % args.grad_accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl308.findings(source) == []


def test_loss_object_sum_divided_by_its_own_mask_count_fires(acl308, at):
    source = """
    import torch.nn as nn

    criterion = nn.CrossEntropyLoss(ignore_index=-100, reduction="sum")
    for micro_step, mb in enumerate(train_loader):
        logits = model(mb["input_ids"], attention_mask=mb["attention_mask"])
        loss = criterion(logits.view(-1, logits.size(-1)), mb["labels"].view(-1))
        loss = loss / mb["attention_mask"].sum().clamp(min=1)
        (loss / args.grad_accum_steps).backward()
        if (micro_step + 1) % args.grad_accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl308.findings(source) == [("ACL308", *at(source, "loss / mb["))]


def test_labels_sampled_from_the_model_never_match_an_ignore_index(acl308, at):
    """Sophia's Hessian estimate: `y = Categorical(logits=logits).sample()` holds class ids, so
    `ignore_index=-1` never matches and every micro-batch of fixed crops has B * T tokens. A
    padded target with a pad-id ignore index beside it still fires."""
    source = """
    import torch
    import torch.nn.functional as F

    for iter_num in range(1000):
        for micro_step in range(gradient_accumulation_steps):
            logits = model(get_batch())
            y_sample = torch.distributions.Categorical(logits=logits).sample()
            flat = logits.view(-1, logits.size(-1))
            loss = F.cross_entropy(flat, y_sample.view(-1), ignore_index=-1)
            (loss / gradient_accumulation_steps).backward()
        optimizer.step()
        optimizer.zero_grad()
    """
    assert acl308.findings(source) == []
    padded = source.replace(
        "y_sample.view(-1), ignore_index=-1", "batch_labels.view(-1), ignore_index=pad_id"
    )
    assert [code for code, *_ in acl308.findings(padded)] == ["ACL308"]
