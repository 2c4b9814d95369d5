"""guard.Engine's TensorBoard tracking, read back from the event files it writes, against
Accelerate's Accelerator(log_with="tensorboard") logging the same run (the oracle for the
scalars, the hyperparameters and the folder layout)."""

from __future__ import annotations

import os
import re
import types

import torch
from accelerate import Accelerator
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

import guard
from guard import _engine_tracking

CONFIG = {"lr": 0.05, "epochs": 3}
STEPS = [0, 8, 16]  # optimizer steps, not 0..n-1, so a lost or renumbered step shows


def _losses() -> list[torch.Tensor]:
    """The losses of a few real SGD steps on a tiny regression, kept as tensors (as scripts do)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=CONFIG["lr"])
    inputs, targets = torch.randn(16, 4), torch.randn(16, 1)
    losses = []
    for _ in STEPS:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


def _track(lib, losses: list[torch.Tensor]) -> str:
    """One run through Accelerate's tracking API; returns the tracker class that wrote it."""
    lib.init_trackers("run", config=CONFIG)
    for step, loss in zip(STEPS, losses, strict=True):
        lib.log({"loss": loss, "lr": CONFIG["lr"]}, step=step)
    tracker = type(lib.get_tracker("tensorboard"))
    lib.end_training()
    return f"{tracker.__module__}.{tracker.__name__}"


def _scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the run's own event files, as (step, value) per tag."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in tags}


def _hparams(run_dir) -> dict[str, float]:
    """The hyperparameters `add_hparams` stored, from the timestamped folder it writes."""
    (folder,) = [
        entry.path
        for entry in os.scandir(run_dir)
        if entry.is_dir() and any(n.startswith("events.out.tfevents") for n in os.listdir(entry))
    ]
    events = EventAccumulator(folder)
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {name: value.number_value for name, value in info.hparams.items()}


def _layout(root) -> list[str]:
    """The files under `root`, with time stamps, host names and process ids taken out."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            parts = os.path.relpath(os.path.join(folder, name), root).split(os.sep)
            parts = [re.sub(r"^\d+\.\d+$", "<time>", part) for part in parts]
            parts[-1] = re.sub(r"^events\.out\.tfevents\..*", "events.out.tfevents", parts[-1])
            found.append("/".join(parts))
    return sorted(found)


def _expected(losses: list[torch.Tensor]) -> dict[str, list[tuple[int, float]]]:
    """What was logged: the losses are float32 already, so TensorBoard keeps them exactly."""
    return {
        "loss": [(step, loss.item()) for step, loss in zip(STEPS, losses, strict=True)],
        "lr": [(step, float(torch.tensor(CONFIG["lr"]).item())) for step in STEPS],  # as float32
    }


def _accelerates_run(root, losses) -> str:
    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(root))
    return _track(accelerator, losses)


def test_engine_logs_to_tensorboard_as_accelerate_does(tmp_path):
    losses = _losses()
    engine = guard.Engine(cpu=True, log_with="tensorboard", project_dir=str(tmp_path / "engine"))
    engine_tracker = _track(engine, losses)
    accelerate_tracker = _accelerates_run(tmp_path / "accelerate", losses)

    assert engine_tracker == accelerate_tracker == "accelerate.tracking.TensorBoardTracker"
    engine_run, accelerate_run = tmp_path / "engine" / "run", tmp_path / "accelerate" / "run"
    assert _scalars(engine_run) == _scalars(accelerate_run) == _expected(losses)
    assert _hparams(engine_run) == _hparams(accelerate_run) == CONFIG
    assert _layout(tmp_path / "engine") == _layout(tmp_path / "accelerate")
    assert "run/events.out.tfevents" in _layout(tmp_path / "engine")


def test_without_accelerate_the_engine_writes_through_torchs_summary_writer(tmp_path, monkeypatch):
    """The fallback tracker: same scalars, hyperparameters and event files as Accelerate's.

    Accelerate also dumps the config to `<run>/<time>/hparams.yml` with PyYAML, which is not
    there without accelerate; the event files hold the same hyperparameters."""

    def find_spec(name: str, *args):
        return None if name == "accelerate" else real_find_spec(name, *args)

    real_find_spec = _engine_tracking.importlib.util.find_spec
    hidden = types.SimpleNamespace(util=types.SimpleNamespace(find_spec=find_spec))
    monkeypatch.setattr(_engine_tracking, "importlib", hidden)
    losses = _losses()
    engine = guard.Engine(cpu=True, log_with="tensorboard", project_dir=str(tmp_path / "engine"))
    assert _track(engine, losses) == "guard._engine_tracking.TensorBoardTracker"
    _accelerates_run(tmp_path / "accelerate", losses)

    engine_run, accelerate_run = tmp_path / "engine" / "run", tmp_path / "accelerate" / "run"
    assert _scalars(engine_run) == _scalars(accelerate_run) == _expected(losses)
    assert _hparams(engine_run) == _hparams(accelerate_run) == CONFIG
    without_yaml = [p for p in _layout(tmp_path / "accelerate") if p != "run/<time>/hparams.yml"]
    assert _layout(tmp_path / "engine") == without_yaml


def test_log_with_all_picks_the_trackers_accelerate_picks(tmp_path):
    engine = guard.Engine(cpu=True, log_with="all", project_dir=str(tmp_path / "engine"))
    accelerator = Accelerator(cpu=True, log_with="all", project_dir=str(tmp_path / "accelerate"))
    names = []
    for lib in (engine, accelerator):
        lib.init_trackers("run")
        names.append([tracker.name for tracker in lib.trackers])
        lib.end_training()
    assert names[0] == names[1] and "tensorboard" in names[0]
