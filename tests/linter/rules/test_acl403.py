"""ACL403 metrics-without-gather: evaluation metrics fed by `gather` or by one process."""

from __future__ import annotations

import textwrap

import pytest

HEAD = """
import torch
import evaluate
from accelerate import Accelerator

accelerator = Accelerator()
metric = evaluate.load("accuracy")
model, opt, train_dl, eval_dl = accelerator.prepare(model, opt, train_dl, eval_dl)
"""


def with_head(body: str) -> str:
    return textwrap.dedent(HEAD) + textwrap.dedent(body)


ADD_BATCH = (
    HEAD
    + """
model.eval()
for batch in eval_dl:
    with torch.no_grad():
        preds = model(**batch).logits.argmax(-1)
    p, r = accelerator.gather((preds, batch["labels"]))  # both tensors
    metric.add_batch(predictions=p, references=r)
print(metric.compute())
"""
)


def test_gather_feeding_add_batch_becomes_gather_for_metrics(acl403, at):
    assert acl403.findings(ADD_BATCH) == [("ACL403", *at(ADD_BATCH, "accelerator.gather("))]
    assert acl403.fixed(ADD_BATCH) == textwrap.dedent(ADD_BATCH).replace(
        "accelerator.gather(", "accelerator.gather_for_metrics("
    )


def test_gather_inside_the_metric_call(acl403, at):
    source = with_head("""
    for batch in eval_dl:
        with torch.no_grad():
            preds = model(**batch).logits.argmax(-1)
        metric.add_batch(predictions=accelerator.gather(preds), references=batch["labels"])
    """)
    assert acl403.findings(source) == [("ACL403", *at(source, "accelerator.gather("))]


def test_prediction_list_in_an_evaluate_function(acl403, at):
    source = """
    import torch

    def evaluate(accelerator, model, loader):
        all_preds = []
        for batch in loader:
            with torch.no_grad():
                logits = model(batch["x"])
            gathered = accelerator.gather(logits)
            all_preds.append(gathered.argmax(-1).cpu())
        return torch.cat(all_preds)
    """
    assert acl403.findings(source) == [("ACL403", *at(source, "accelerator.gather("))]


def test_running_counts_after_later_assignments(acl403, at):
    source = with_head("""
    correct = 0
    for inputs, targets in eval_dl:
        with torch.no_grad():
            logits = model(inputs)
        logits, targets = accelerator.gather((logits, targets))
        hits = logits.argmax(-1) == targets
        correct += hits.sum().item()
    """)
    assert acl403.findings(source) == [("ACL403", *at(source, "accelerator.gather("))]


def test_metric_updated_from_one_process_is_reported_without_a_fix(acl403, at):
    source = with_head("""
    for batch in eval_dl:
        with torch.no_grad():
            preds = model(**batch).logits.argmax(-1)
        metric.add_batch(predictions=preds, references=batch["labels"])
    """)
    assert acl403.findings(source) == [("ACL403", *at(source, "metric.add_batch"))]
    assert acl403.fixed(source) == textwrap.dedent(source)
    (found,) = acl403.diagnostics(source)  # one process sees the whole loader: latent
    assert found.configuration.latent and found.severity == "warning"


@pytest.mark.parametrize(
    "body",
    [
        # gather_for_metrics already drops the padding
        'p, r = accelerator.gather_for_metrics((preds, batch["labels"]))\n'
        "metric.add_batch(predictions=p, references=r)",
        # a scalar summary reduced across processes
        "total = accelerator.reduce(preds.sum(), reduction='sum')\nprint(total)",
        # gathered values that never reach a metric
        "accelerator.print(accelerator.gather(preds).shape)",
        # the padded tail truncated by hand
        "p = accelerator.gather(preds)\n"
        "if step == len(eval_dl) - 1:\n"
        "    p = p[: len(eval_dl.dataset) - seen]\n"
        "else:\n"
        "    seen += p.shape[0]\n"
        'metric.add_batch(predictions=p, references=batch["labels"])',
    ],
)
def test_clean_evaluation_loops(acl403, body):
    source = textwrap.dedent(HEAD) + (
        "seen = 0\n"
        "for step, batch in enumerate(eval_dl):\n"
        "    with torch.no_grad():\n"
        "        preds = model(**batch).logits.argmax(-1)\n" + textwrap.indent(body, "    ") + "\n"
    )
    assert acl403.findings(source) == []


def test_gather_in_the_training_loop_for_loss_logging_is_clean(acl403):
    source = with_head("""
    losses = []
    for batch in train_dl:
        loss = model(**batch).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(accelerator.gather(loss.detach()).mean())
    """)
    assert acl403.findings(source) == []


def test_torchmetrics_and_unprepared_loaders_are_not_called_unsynchronised(acl403):
    source = """
    import torch
    import torchmetrics
    import evaluate
    from accelerate import Accelerator

    accelerator = Accelerator()
    acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)
    metric = evaluate.load("accuracy")
    model, val_dl = accelerator.prepare(model, val_dl)
    for x, y in val_dl:
        with torch.no_grad():
            acc.update(model(x), y)
    if accelerator.is_main_process:
        for x, y in test_dl:
            with torch.no_grad():
                metric.add_batch(predictions=model(x).argmax(-1), references=y)
    """
    assert acl403.findings(source) == []


def test_decoded_predictions_truncated_by_hand_are_clean(acl403):
    source = with_head("""
    seen = 0
    for step, batch in enumerate(eval_dl):
        with torch.no_grad():
            tokens = accelerator.unwrap_model(model).generate(batch["input_ids"])
        tokens = accelerator.gather(tokens)
        texts = tokenizer.batch_decode(tokens)
        if step == len(eval_dl) - 1:
            texts = texts[: len(eval_dl.dataset) - seen]
        else:
            seen += len(texts)
        metric.add_batch(predictions=texts, references=batch["refs"])
    """)
    assert acl403.findings(source) == []


def test_per_process_summaries_averaged_on_the_spot_are_clean(acl403):
    source = with_head("""
    for x, y in eval_dl:
        with torch.no_grad():
            acc1 = accuracy(model(x), y)
        acc1 = accelerator.gather(acc1).mean(0)
        meter.update(acc1.item(), x.size(0))
    """)
    assert acl403.findings(source) == []


GATHERED_LOSSES = """
import math
import torch
from accelerate import Accelerator

def run(model, eval_set, eval_dl, bs):
    accelerator = Accelerator()
    model, eval_dl = accelerator.prepare(model, eval_dl)
    model.eval()
    losses = []
    for batch in eval_dl:
        with torch.no_grad():
            loss = model(**batch).loss
        losses.append(accelerator.gather(loss.repeat(bs)))
    losses = torch.cat(losses)[: len(eval_set)]
    return math.exp(torch.mean(losses))
"""


def test_gathered_batches_cut_to_the_dataset_length_after_the_loop(acl403, at):
    """HF's run_clm_no_trainer: the list of gathered losses is cut to `len(eval_dataset)`
    once the loop is over, which drops the padded repeats as gather_for_metrics would."""
    assert acl403.findings(GATHERED_LOSSES) == []
    uncut = GATHERED_LOSSES.replace("[: len(eval_set)]", "")
    assert acl403.findings(uncut) == [("ACL403", *at(uncut, "accelerator.gather"))]


def test_gathered_batches_copied_by_a_helper_handed_the_dataset(acl403, at):
    """HF's run_qa_no_trainer: `create_and_fill_np_array(all_start_logits, eval_dataset, n)`
    copies the gathered rows into an array of the dataset's length; a metric handed the
    dataset's labels beside them is no such helper."""
    source = """
    import torch
    from accelerate import Accelerator

    def evaluate(model, eval_dataset, eval_dl, metric):
        accelerator = Accelerator()
        model, eval_dl = accelerator.prepare(model, eval_dl)
        all_logits = []
        for batch in eval_dl:
            with torch.no_grad():
                logits = model(**batch).start_logits
            all_logits.append(accelerator.gather(logits).cpu().numpy())
        preds = create_and_fill_np_array(all_logits, eval_dataset, 384)
        return metric.compute(predictions=preds, references=eval_dataset["label"])
    """
    assert acl403.findings(source) == []
    straight = source.replace(
        "        preds = create_and_fill_np_array(all_logits, eval_dataset, 384)\n", ""
    ).replace("predictions=preds", "predictions=all_logits")
    assert acl403.findings(straight) == [("ACL403", *at(straight, "accelerator.gather"))]


# a count of correct predictions over a prepared loader ------------------------------------------
COUNTING = """
import torch
from accelerate import Accelerator


def evaluate(model, loader):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in loader:
            preds = model(**batch).logits.argmax(-1)
            correct += (preds == batch["labels"]).sum().item()
            total += batch["labels"].numel()
    model.train()
    return correct / total


def main(model, optimizer, train_dl, eval_dl):
    accelerator = Accelerator()
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)
    for epoch in range(3):
        for batch in train_dl:
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.print(evaluate(model, eval_dl))
"""


def test_count_of_correct_predictions_over_a_prepared_loader(acl403, at):
    (found,) = acl403.diagnostics(COUNTING)
    assert (found.start.line, found.start.column) == at(COUNTING, "correct += (preds")
    assert found.message.startswith("`correct` counts the correct predictions of this process's")
    assert found.severity == "warning" and found.fix is None
    assert found.configuration.latent  # one process evaluates the whole loader
    inline = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model, eval_dl = accelerator.prepare(model, eval_dl)
    model.eval()
    hits = torch.zeros(1)
    with torch.no_grad():
        for x, y in eval_dl:
            hits += model(x).argmax(-1).eq(y).sum()
    accelerator.print(hits / len(eval_dl.dataset))
    """
    assert acl403.findings(inline) == [("ACL403", *at(inline, "hits +="))]


def test_counts_combined_across_processes_are_not_flagged(acl403):
    reduced_after = COUNTING.replace(
        "    model.train()\n    return correct / total\n",
        "    model.train()\n"
        "    counts = accelerator.reduce(torch.tensor([correct, total]))\n"
        "    return (counts[0] / counts[1]).item()\n",
    )
    gathered_in_loop = COUNTING.replace(
        "            preds = model(**batch).logits.argmax(-1)\n",
        "            preds = model(**batch).logits.argmax(-1)\n"
        '            preds, labels = accelerator.gather_for_metrics((preds, batch["labels"]))\n',
    )
    returned_then_reduced = COUNTING.replace("return correct / total", "return correct").replace(
        "        accelerator.print(evaluate(model, eval_dl))\n",
        "        correct = evaluate(model, eval_dl)\n"
        "        accelerator.print(accelerator.reduce(torch.tensor(correct)))\n",
    )
    for source in (reduced_after, gathered_in_loop, returned_then_reduced):
        assert acl403.findings(source) == [], source


def test_counts_over_loaders_not_seen_prepared_are_not_flagged(acl403):
    never_prepared = COUNTING.replace(
        "train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)",
        "train_dl = accelerator.prepare(model, optimizer, train_dl)",
    )
    assert never_prepared != COUNTING
    # a helper nobody in the module calls: its loader may come from anywhere
    uncalled = COUNTING.split("def main(")[0]
    plain_loop = """
    import torch

    def evaluate(model, loader):
        correct = 0
        with torch.no_grad():
            for x, y in loader:
                correct += (model(x).argmax(-1) == y).sum().item()
        return correct
    """
    for source in (never_prepared, uncalled, plain_loop):
        assert acl403.findings(source) == [], source
