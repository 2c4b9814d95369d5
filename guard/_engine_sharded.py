"""`Engine.save_sharded_state` / `load_sharded_state`: FSDP2 checkpoints with
`torch.distributed.checkpoint`, the sharded model and optimizer state dicts, which it reshards on
load, so another world size loads them exactly; a checkpoint saved in the middle of an epoch is
refused there (each rank's batches depend on the world size). A mixin of `Engine`, beside
`_engine_state.Checkpointing`, whose per-rank files it shares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from guard._engine_state import _restore_random_states


class ShardedCheckpointing:
    """`Engine`'s FSDP2 checkpoints."""

    def save_sharded_state(self, directory: Any) -> None:
        """FSDP2: models, optimizers, schedulers and this engine's state, written sharded (one
        file per rank) by torch.distributed.checkpoint; every rank calls it."""
        _save_state(self, directory)

    def load_sharded_state(self, directory: Any) -> None:
        """Restore what `save_sharded_state` wrote; prepare the same objects first."""
        _load_state(self, directory)


def _owner(engine: Any, optimizer: Any) -> torch.nn.Module:
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for model in engine._models:
        if any(id(p) in owned for p in model.parameters()):
            return model
    raise ValueError("an optimizer prepared by the engine trains none of its prepared models")


def _optimizer_state(engine: Any, prepared: Any) -> dict[str, Any]:
    """torch's sharded optimizer state dict. For an optimizer that has not stepped yet, torch
    takes one step with zero gradients and lr 0 to create its state: that step is marked as the
    prepared optimizer's own, so the guard does not take it for the user's."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from guard._tracker import TRACKER

    model = _owner(engine, prepared)
    if not TRACKER.active:
        return get_optimizer_state_dict(model, prepared.optimizer)
    with TRACKER.flag("step_wrapper", prepared):
        return get_optimizer_state_dict(model, prepared.optimizer)


def _state(engine: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {
        "models": {str(i): get_model_state_dict(m) for i, m in enumerate(engine._models)},
        "optimizers": {
            str(i): _optimizer_state(engine, o) for i, o in enumerate(engine._optimizers)
        },
        "schedulers": {str(i): s.state_dict() for i, s in enumerate(engine._schedulers)},
        "engine": engine.state_dict(),
    }


def _world(engine: Any) -> dict[str, Any]:
    """The world size, and whether a prepared loader's pass was left unfinished (it started and
    has not reached its last batch): which batches each rank sees depends on the world size."""
    from guard import distributed

    unfinished = any(
        loader.pass_rng is not None and not loader.end_of_dataloader
        for loader in engine._dataloaders
    )
    return {"size": distributed.world_size(), "mid_epoch": unfinished}


def _save_state(engine: Any, directory: str | Path) -> None:
    """Write models, optimizers (sharded, one file per rank), schedulers, the engine's own state
    and the world it ran on with `torch.distributed.checkpoint`; every rank must call it."""
    import torch.distributed.checkpoint as dcp

    dcp.save({**_state(engine), "world": _world(engine)}, checkpoint_id=str(directory))
    # what differs by rank and is no tensor DCP could shard: generators, loader pass orders
    engine._save_rank_files(Path(directory))


def _load_rank_state(engine: Any, directory: Path, same_world: bool) -> None:
    """This rank's generators and loader pass states, when the checkpoint's world is this one
    (on another one the ranks differ, and a checkpoint taken at an epoch boundary needs none)."""
    saved = engine._read_rank_file(directory) if same_world else None
    if saved is None:
        return  # written by another world size, or before these files were written
    _restore_random_states(directory / f"random_states_{engine.process_index}.pkl")
    engine._resume_loader_passes(saved)


def _refuse_another_world_mid_epoch(directory: str | Path) -> bool:
    """Loading on another world size is exact for the model and optimizer state (DCP reshards
    them), but a pass saved mid-epoch cannot be continued: each rank's batches depend on W.
    Returns whether the checkpoint was written by this world size."""
    import torch.distributed.checkpoint as dcp

    from guard import distributed

    saved_keys = dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    if "world.size" not in saved_keys:
        return True  # written before the world was recorded
    saved = {"world": {"size": 0, "mid_epoch": False}}
    dcp.load(saved, checkpoint_id=str(directory))
    size, mid_epoch = saved["world"]["size"], saved["world"]["mid_epoch"]
    here = distributed.world_size()
    if mid_epoch and size != here:
        raise RuntimeError(
            f"this FSDP2 checkpoint was saved by {_processes(size)} in the middle of an epoch; "
            f"loading it on {_processes(here)} would continue the epoch with other batches on "
            f"each rank (skip_first_batches counts the batches of {_processes(size)}): resume "
            f"it on {_processes(size)}, or save at an epoch boundary (after the loop over the "
            "loader ends), which loads on any world size"
        )
    return size == here


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def _load_state(engine: Any, directory: str | Path) -> None:
    """Read what `save_state` wrote into the prepared models, optimizers and schedulers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    same_world = _refuse_another_world_mid_epoch(directory)
    state = _state(engine)
    dcp.load(state, checkpoint_id=str(directory))
    for i, model in enumerate(engine._models):
        set_model_state_dict(model, state["models"][str(i)])
    for i, opt in enumerate(engine._optimizers):
        model = _owner(engine, opt)
        set_optimizer_state_dict(model, opt.optimizer, state["optimizers"][str(i)])
    for i, scheduler in enumerate(engine._schedulers):
        scheduler.load_state_dict(state["schedulers"][str(i)])
    engine.load_state_dict(state["engine"])
    _load_rank_state(engine, Path(directory), same_world)
