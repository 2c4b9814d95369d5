"""The HF Trainer (transformers 5.x) under the guard: a tiny BERT sequence classifier from a
config, `use_cpu=True`, `gradient_accumulation_steps=4`, 70 samples at batch 4 (a short last
batch). Its correct runs report nothing; fp16 on CPU (trained in fp32) is the user's
configuration, reported once at the user's line."""

from __future__ import annotations

import sys

import torch
import transformers  # the dev extra installs it

HERE = "test_hf_trainer.py:"


class _Samples(torch.utils.data.Dataset):
    def __init__(self, n: int = 70) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 100, (n, 8), generator=generator)
        self.labels = torch.randint(0, 2, (n,), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _trainer(tmp_path, precision: str, device: str = "cpu"):
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_train_epochs=1,
        use_cpu=device == "cpu",
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=_Samples())


def _weights(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_sequence_classification_reports_nothing_and_trains_as_without_the_guard(
    guard_warn, tmp_path, device
):
    """fp32: no finding, and the same weights as a run with the guard uninstalled (bit for bit
    on CPU; on CUDA the embedding's backward adds atomically, in no fixed order)."""
    trainer = _trainer(tmp_path, "fp32", device)
    trainer.train()
    assert guard_warn.findings() == []
    guarded = _weights(trainer)
    guard_warn.uninstall()
    try:
        reference = _trainer(tmp_path, "fp32", device)
        reference.train()
    finally:
        guard_warn.install()
    for a, b in zip(guarded, _weights(reference), strict=True):
        assert torch.equal(a, b) if device == "cpu" else torch.allclose(a, b, atol=1e-5)


def test_bf16_sequence_classification_reports_nothing(guard_warn, tmp_path, device):
    _trainer(tmp_path, "bf16", device).train()
    assert guard_warn.findings() == []


def test_fp16_on_cpu_is_one_acl602_at_the_users_line(guard_warn, tmp_path):
    trainer = _trainer(tmp_path, "fp16")
    trainer.train()
    line = f"{HERE}{sys._getframe().f_lineno - 1}"
    [finding] = guard_warn.findings()
    assert finding.code == "ACL602"
    assert finding.location.endswith(line)
    assert "fp16" in finding.message and "fp32" in finding.message
