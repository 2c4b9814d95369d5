"""ACL308 token-mean-under-accumulation: per-micro-batch token means averaged over the window."""

from rules._base import Rule

RULE = Rule(
    code="ACL308",
    name="token-mean-under-accumulation",
    summary="token-level mean loss per micro-batch under accumulation overweights short batches",
    severity="warning",
    fix="none",
    runtime="heuristic",
    static=True,
    docs="""\
## What it does
Flags a token-level mean loss that reaches a backward inside an accumulation window
(`accumulate()` or a `sync_gradients` gate with an engine K > 1, a step gate `% K` or a counter
with K > 1, or a micro-step loop): `F.cross_entropy` / `F.nll_loss` / `nn.CrossEntropyLoss()` /
`nn.NLLLoss()` with the default reduction on flattened logits (`.view(-1, V)`, `.reshape(-1, V)`,
`.flatten(0, 1)`) or with `ignore_index`, and `.loss` of a causal-LM, seq2seq, masked-LM or
token-classification model (`AutoModelForCausalLM`, `*ForConditionalGeneration`, ...) called
with `labels=` or `**batch`. The loss is followed through names, `/ K`, helper functions of the
module, `prepare` and model wrappers. Not flagged: `reduction="sum"` (or `"none"` then `.sum()`),
a mean multiplied by its token count, models given `num_items_in_batch=`, sequence-level losses
(unflattened classification logits), no accumulation, and token means in a module that never
masks or pads labels (no `ignore_index`, `-100`, padding collator or `padding=`): texts packed
into blocks of one length have the same token count in every micro-batch, hence no bias. The same
holds for packed next-token pretraining, whose targets are the token stream shifted by one from
the inputs (`x = data[:, :T]; y = data[:, 1:T + 1]`, `x, y = batch[:, :-1], batch[:, 1:]`,
nanoGPT's `get_batch()`), when the `ignore_index` is absent or negative (no token id matches it),
the targets are not masked afterwards and nothing in the module pads batches; a named
`ignore_index` such as a pad id is still flagged.

## Why is this bad?
The large-batch objective of a token-level loss is the sum of the token losses divided by the
number T of valid tokens in the whole window (across all ranks). A mean within each micro-batch,
then averaged over K micro-batches and W ranks, gives a token of micro-batch i the weight
1/(K·T_i) instead of 1/T, so tokens of short, heavily padded micro-batches count more. The gradient
is biased, the bias grows with the spread of the T_i and with K and W, and the logged loss is off
too. It is reported as a warning because the bias depends on the data: equal-length or packed
batches have none.

## Example
```python
import torch.nn.functional as F
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=K)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        logits = model(batch["input_ids"]).logits.flatten(0, 1)
        loss = F.cross_entropy(logits, batch["labels"].flatten(), ignore_index=-100)
        accelerator.backward(loss)              # per-micro-batch mean, then /K
        opt.step(); opt.zero_grad()
```

## Use instead
```python
import torch.nn.functional as F
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=K)
model, opt, dl = accelerator.prepare(model, opt, dl)
# window: the K batches of this optimizer step, fetched up front (labels pre-shifted)
n_tok = accelerator.gather(sum((b["labels"] != -100).sum() for b in window)).sum()
for b in window:
    with accelerator.accumulate(model):
        logits = model(b["input_ids"]).logits.flatten(0, 1)
        s = F.cross_entropy(logits, b["labels"].flatten(), reduction="sum")
        accelerator.backward(s * K * accelerator.num_processes / n_tok)  # undo /K and DDP's mean
        opt.step(); opt.zero_grad()
```

## Fix safety
No autofix: the remedy needs the window fetched up front and a collective over ranks, so it is
offered as advice only.

## At runtime
Heuristic, with a measured bias: the engine follows the loss graph to its `NllLossBackward0` node,
reads whether it is a mean and that micro-batch's valid-token count T_i, gathers the window's T_i
across ranks at the update step and reports ACL308 when max_i |mean(T)/T_i - 1| exceeds a
configurable threshold. A sum-reduced loss passed with the window's item count is normalised by
the engine and raises nothing.
""",
)
