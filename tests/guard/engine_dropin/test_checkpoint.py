"""save_state / load_state, save, save_model, get_state_dict and unwrap_model, against
Accelerate's as the oracle; and a run interrupted mid-window and resumed with
skip_first_batches ends exactly where the uninterrupted run ends (fp16 with a CPU GradScaler)."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from dropin_reference import Counter, flat_params, make_model, setup, train
from safetensors.torch import load_file

import guard

N, STOP = 4, 6  # 12 micro-batches per pass; stop two micro-steps into the second window


def _trained(engine, tmp, stop=STOP, order="sequential"):
    """Seeded setup, a partial pass and save_state; returns the objects and the folder."""
    counter = Counter()
    engine.register_for_checkpointing(counter)
    model, opt, loader, sched = setup(engine, order=order)
    train(engine, model, opt, loader, sched, counter, stop=stop)
    folder = engine.save_state(tmp)
    return model, opt, sched, counter, folder


def _accelerator(**kwargs) -> Accelerator:
    return Accelerator(cpu=True, gradient_accumulation_steps=N, **kwargs)


def test_save_state_writes_accelerates_files_with_the_same_contents(tmp_path):
    torch.manual_seed(5)
    _trained(guard.Engine(cpu=True, gradient_accumulation_steps=N), tmp_path / "engine")
    torch.manual_seed(5)
    _trained(_accelerator(), tmp_path / "accelerate")
    ours, theirs = tmp_path / "engine", tmp_path / "accelerate"
    assert sorted(os.listdir(ours)) == sorted(os.listdir(theirs) + ["guard_engine_0.pt"])
    for name in ("optimizer.bin", "scheduler.bin", "custom_checkpoint_0.pkl"):
        mine, reference = (torch.load(d / name, weights_only=False) for d in (ours, theirs))
        assert repr(mine) == repr(reference), name  # nested dicts of tensors, printed in full
    weights = [load_file(d / "model.safetensors") for d in (ours, theirs)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    rng = [torch.load(d / "random_states_0.pkl", weights_only=False) for d in (ours, theirs)]
    assert rng[0].keys() == rng[1].keys()
    assert rng[0]["step"] == rng[1]["step"] == STOP  # Accelerate counts micro-steps
    assert torch.equal(rng[0]["torch_manual_seed"], rng[1]["torch_manual_seed"])
    assert rng[0]["random_state"] == rng[1]["random_state"]


@pytest.mark.parametrize(
    "precision, order",
    [("no", "sequential"), ("fp16", "sequential"), ("fp16", "shuffled"), ("no", "own-generator")],
)
def test_resumed_run_ends_with_the_uninterrupted_runs_parameters(tmp_path, precision, order):
    """Stop mid-window, save, scramble every generator, rebuild, load, skip, finish the pass
    (and a second epoch, whose order the restored generators draw)."""
    engine = guard.Engine(precision, gradient_accumulation_steps=N)
    torch.manual_seed(11)
    model, opt, loader, sched = setup(engine, order=order)
    train(engine, model, opt, loader, sched)
    train(engine, model, opt, loader, sched)
    expected = flat_params(model), engine.optimizer_steps, torch.rand(3)

    torch.manual_seed(11)
    _trained(guard.Engine(precision, gradient_accumulation_steps=N), tmp_path, order=order)
    torch.manual_seed(999), random.seed(999)  # a new process would start elsewhere
    resumed = guard.Engine(precision, gradient_accumulation_steps=N)
    counter = Counter()
    resumed.register_for_checkpointing(counter)
    model, opt, loader, sched = setup(resumed, seed=3, order=order)  # other weights: load wins
    if loader.base_loader.generator is not None:
        loader.base_loader.generator.manual_seed(5)  # scrambled too: the checkpoint's must win
    resumed.load_state(tmp_path)
    assert counter.seen == STOP
    train(resumed, model, opt, resumed.skip_first_batches(loader, STOP), sched, counter)
    train(resumed, model, opt, loader, sched, counter)
    assert torch.equal(flat_params(model), expected[0])
    assert resumed.optimizer_steps == expected[1]
    assert torch.equal(torch.rand(3), expected[2])  # the generators continued, not restarted
    if precision == "fp16":
        assert resumed.scaler.get_scale() == engine.scaler.get_scale()
        assert (tmp_path / "scaler.pt").is_file()


def test_each_library_loads_the_others_checkpoint(tmp_path):
    _trained(guard.Engine(cpu=True, gradient_accumulation_steps=N), tmp_path / "engine", 8)
    _trained(_accelerator(), tmp_path / "accelerate", 8)
    for loader_cls, folder in ((_accelerator, "engine"), (guard.Engine, "accelerate")):
        kwargs = {"gradient_accumulation_steps": N} if loader_cls is guard.Engine else {}
        engine = loader_cls(**kwargs)
        counter = Counter()
        engine.register_for_checkpointing(counter)
        model, opt, _, sched = setup(engine, seed=3)
        engine.load_state(tmp_path / folder)
        saved = load_file(tmp_path / folder / "model.safetensors")
        assert all(torch.equal(p, saved[k]) for k, p in model.state_dict().items())
        assert counter.seen == 8 and sched.scheduler.last_epoch == 2
        assert engine.step == 8  # Accelerate's micro-step count, restored


def test_automatic_checkpoint_naming_keeps_the_newest_total_limit(tmp_path):
    names = {}
    for name, cls in (("engine", guard.Engine), ("accelerate", Accelerator)):
        config = ProjectConfiguration(
            project_dir=str(tmp_path / name), automatic_checkpoint_naming=True, total_limit=2
        )
        engine = cls(cpu=True, project_config=config)
        engine.prepare(make_model())
        for _ in range(3):
            engine.save_state()
        names[name] = sorted(os.listdir(tmp_path / name / "checkpoints"))
        engine.load_state()  # the newest
    assert names["engine"] == names["accelerate"] == ["checkpoint_1", "checkpoint_2"]


@pytest.mark.parametrize("shard", ["10GB", "1KB"])
@pytest.mark.parametrize("safe", [True, False])
def test_save_model_writes_what_accelerate_writes(tmp_path, shard, safe):
    files = {}
    for name, engine in (("engine", guard.Engine(cpu=True)), ("accelerate", Accelerator(cpu=True))):
        model = engine.prepare(make_model())
        engine.save_model(model, tmp_path / name, max_shard_size=shard, safe_serialization=safe)
        files[name] = sorted(os.listdir(tmp_path / name))
    assert files["engine"] == files["accelerate"]
    for file in files["engine"]:
        if file.endswith(".json"):
            mine, reference = (json.loads((tmp_path / d / file).read_text()) for d in files)
            assert mine == reference
        else:
            load = load_file if safe else torch.load
            mine, reference = (load(tmp_path / d / file) for d in files)
            assert mine.keys() == reference.keys()
            assert all(torch.equal(mine[k], reference[k]) for k in mine)


def test_save_get_state_dict_and_unwrap_model(tmp_path):
    engine, accelerator = guard.Engine("fp16", cpu=True), Accelerator(cpu=True)
    model = engine.prepare(make_model())
    state = engine.get_state_dict(model)
    reference = accelerator.get_state_dict(accelerator.prepare(make_model()))
    assert state.keys() == reference.keys()
    assert all(torch.equal(state[k], reference[k]) for k in state)
    engine.save(state, tmp_path / "plain.pt")
    engine.save(state, tmp_path / "safe.safetensors", safe_serialization=True)
    assert torch.equal(torch.load(tmp_path / "plain.pt")["0.weight"], state["0.weight"])
    assert torch.equal(load_file(tmp_path / "safe.safetensors")["0.weight"], state["0.weight"])
    assert engine.unwrap_model(model) is model
    assert "_original_forward" in vars(model)  # the engine's fp16 autocast forward
    engine.unwrap_model(model, keep_fp32_wrapper=False)
    assert "forward" not in vars(model) and "_original_forward" not in vars(model)
    assert model(torch.ones(2, 6)).dtype == torch.float32  # and it runs, without autocast


def test_register_for_checkpointing_refuses_objects_without_state():
    with pytest.raises(ValueError, match="state_dict"):
        guard.Engine().register_for_checkpointing(object())


def test_loading_with_other_registered_objects_is_refused(tmp_path):
    _trained(guard.Engine(gradient_accumulation_steps=N), tmp_path, 8)
    engine = guard.Engine(gradient_accumulation_steps=N)
    setup(engine)
    with pytest.raises(RuntimeError, match="custom checkpoints"):
        engine.load_state(tmp_path)
