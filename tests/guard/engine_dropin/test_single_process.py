"""guard.Engine's process, memory, profiling and tracking methods on one process, against
Accelerate's Accelerator(cpu=True) as the oracle."""

from __future__ import annotations

import json
import os

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, ProfileKwargs
from dropin_reference import setup

import guard


@pytest.fixture
def both():
    return {"engine": guard.Engine(cpu=True), "accelerate": Accelerator(cpu=True)}


def test_identity_is_accelerates_single_process_answer(both):
    answers = {
        name: [
            lib.distributed_type,
            lib.use_distributed,
            lib.local_process_index,
            lib.is_local_main_process,
            lib.is_last_process,
            lib.state.num_processes,
            lib.state.distributed_type,
        ]
        for name, lib in both.items()
    }
    assert answers["engine"] == answers["accelerate"]
    assert answers["engine"][0] is DistributedType.NO  # Accelerate's member, once imported
    assert repr(both["engine"].state).startswith("Distributed environment: NO\nNum processes: 1")


def test_helpers_leave_single_process_data_alone(both):
    for lib in both.values():
        data = ["A", "B", "C"]
        with lib.split_between_processes(data, apply_padding=True) as part:
            assert part is data
        value = torch.tensor([1.0, 2.0])
        assert lib.pad_across_processes(value) is value
        for reduction in ("sum", "mean", "max", "none"):
            reduced = lib.reduce(value, reduction=reduction)
            assert torch.equal(reduced, value) and reduced is not value
        ran = []
        with lib.main_process_first(), lib.local_main_process_first():
            ran.append(lib.process_index)
        assert ran == [0]
        assert lib.on_main_process(lambda: "main")() == "main"
        assert lib.on_process(lambda: "p0", process_index=0)() == "p0"
        assert lib.on_process(lambda: "p1", process_index=1)() == "p1"  # one process: runs
        assert lib.check_trigger() is False
        lib.set_trigger()
        assert [lib.check_trigger(), lib.check_trigger()] == [True, False]


def test_free_memory_forgets_the_prepared_objects(both, tmp_path):
    for name, lib in both.items():
        model, opt, _, sched = setup(lib)
        assert lib.free_memory(model, opt) == [None, None]
        lib.save_state(tmp_path / name)  # nothing prepared is left to save
    files = {name: sorted(os.listdir(tmp_path / name)) for name in both}
    assert files["engine"] == sorted(files["accelerate"] + ["guard_engine_0.pt"])
    assert files["accelerate"] == ["random_states_0.pkl"]


def test_settable_accumulation_steps_change_the_window(both):
    syncs = {}
    for name, lib in both.items():
        lib.gradient_accumulation_steps = 3
        model, _, loader, _ = setup(lib, samples=28)  # 7 batches
        syncs[name] = []
        for _ in loader:
            with lib.accumulate(model):
                syncs[name].append(lib.sync_gradients)
    assert syncs["engine"] == syncs["accelerate"] == [False, False, True] * 2 + [True]


def test_profile_writes_one_chrome_trace_per_process(both, tmp_path):
    for name, lib in both.items():
        handler = ProfileKwargs(output_trace_dir=str(tmp_path / name))
        with lib.profile(handler) as profiler:
            torch.ones(8).sum()
        assert isinstance(profiler, torch.profiler.profile)
        trace = json.loads((tmp_path / name / "profile_0.json").read_text())
        assert any(e.get("name") == "aten::sum" for e in trace["traceEvents"])
    assert os.listdir(tmp_path / "engine") == os.listdir(tmp_path / "accelerate")


def test_no_log_with_tracks_nothing_as_accelerate(both, tmp_path):
    for lib in both.values():
        lib.init_trackers("run", config={"lr": 0.1})
        lib.log({"loss": 1.0}, step=0)
        assert lib.trackers == []
        assert lib.get_tracker("jsonl").log({"loss": 1.0}) is None  # the blank tracker
        lib.end_training()


def test_jsonl_tracker_is_the_default_when_no_other_is_installed(tmp_path, monkeypatch):
    import guard._engine_tracking

    monkeypatch.setattr(guard._engine_tracking, "_available", lambda: [])  # none installed
    engine = guard.Engine(cpu=True, log_with="all", project_dir=str(tmp_path))
    engine.init_trackers("run", config={"lr": 0.1, "epochs": 2})
    engine.log({"loss": torch.tensor(0.5), "accuracy": 0.75}, step=1)
    engine.log({"loss": 0.25}, step=2)
    assert engine.get_tracker("jsonl").name == "jsonl"
    engine.end_training()
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row) for row in rows] == [
        {"step": 1, "loss": 0.5, "accuracy": 0.75},
        {"step": 2, "loss": 0.25},
    ]
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"lr": 0.1, "epochs": 2}


def test_a_tracker_that_needs_a_folder_without_project_dir_is_refused():
    engine = guard.Engine(cpu=True, log_with="jsonl")
    with pytest.raises(ValueError, match="project_dir"):
        engine.init_trackers("run")
