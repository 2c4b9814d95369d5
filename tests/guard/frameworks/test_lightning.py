"""Lightning manual optimisation under the guard: `automatic_optimization = False`,
`self.manual_backward(loss / N)`, `precision="bf16-mixed"`. Lightning runs `training_step`, and
so the backward, inside its own autocast: that is the framework's design, which the user cannot
change, so the guard reports nothing (the same check does see it when Lightning is not known
as a framework)."""

from __future__ import annotations

import lightning.pytorch as pl  # the dev extra installs it
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

N = 4


class _Manual(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, index):
        optimizer = self.optimizers()
        x, y = batch
        self.manual_backward(nn.functional.mse_loss(self.net(x).float(), y) / N)
        if (index + 1) % N == 0:
            optimizer.step()
            optimizer.zero_grad()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(device: str = "cpu") -> None:
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=4)
    trainer = pl.Trainer(
        accelerator=device,
        devices=1,
        max_epochs=1,
        precision="bf16-mixed",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_Manual(), data)


def test_manual_backward_inside_lightnings_autocast_reports_nothing(guard_warn, device):
    _fit(device)
    assert guard_warn.findings() == []


def test_the_check_sees_it_when_lightning_is_not_a_known_framework(guard_warn, monkeypatch):
    from guard import _report

    monkeypatch.setattr(_report, "_FRAMEWORK_NAMES", ())
    monkeypatch.setattr(_report, "_framework_files", {})
    _fit()
    assert {f.code for f in guard_warn.findings()} == {"ACL202"}
