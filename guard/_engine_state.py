"""Checkpoints in Accelerate's layout: `save_state` / `load_state`, `save`, `save_model`,
`get_state_dict`, `unwrap_model` and `register_for_checkpointing` on `guard.Engine`.

A `save_state(dir)` folder holds Accelerate's files (so either library can load it) plus one
file per process with the engine's own state:

    model.safetensors       model_1.safetensors ...  (pytorch_model.bin without safetensors)
    optimizer.bin           optimizer_1.bin ...
    scheduler.bin           scheduler_1.bin ...
    scaler.pt               fp16 only
    random_states_<rank>.pkl   python, numpy, torch (and CUDA) generators, Accelerate's "step"
    custom_checkpoint_<i>.pkl  objects passed to register_for_checkpointing, in that order
    guard_engine_<rank>.pt     the accumulation window, the scaler and, mid-window, this rank's
                               accumulated gradients (Engine.state_dict); for each prepared
                               loader, the generator states its current pass was drawn from

FSDP2-sharded models are saved and loaded by `save_sharded_state` / `load_sharded_state` instead
(torch.distributed.checkpoint, one shard per rank; see guard/_fsdp2.py).

Process 0 writes the shared files (once per machine with `save_on_each_node`), every process its
own random states and engine state. Loading a folder without `guard_engine_*` (an Accelerate
checkpoint) restores the window position from the "step" Accelerate stores.
"""

from __future__ import annotations

import codecs
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import hooks

from guard import _fsdp2
from guard._tracker import TRACKER

_CHECKPOINT_NUMBER = re.compile(r"([0-9]+)(?=[^/\\]*$)")
_CUSTOM_FILE = re.compile(r"^custom_checkpoint_\d+\.pkl$")


def _suffixed(name: str, index: int) -> str:
    """`optimizer.bin` for the first object, `optimizer_1.bin` for the second, ..."""
    if index == 0:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}_{index}{dot}{ext}"


class Checkpointing:
    """Mixin: Accelerate's checkpoint API with the engine's window state added."""

    # ------------------------------------------------------------------------------ models
    def unwrap_model(
        self,
        model: torch.nn.Module,
        keep_fp32_wrapper: bool = True,
        keep_torch_compile: bool = True,
    ) -> torch.nn.Module:
        """The model without DDP (and, on request, without torch.compile or the engine's
        autocast forward), as Accelerate's."""
        compiled = model if hasattr(model, "_orig_mod") else None
        inner = model._orig_mod if compiled is not None else model
        while isinstance(inner, torch.nn.parallel.DistributedDataParallel):
            inner = inner.module
        if not keep_fp32_wrapper and "_original_forward" in inner.__dict__:
            _restore_forward(inner)
        if compiled is not None and keep_torch_compile:
            return compiled if compiled._orig_mod is inner else _recompiled(compiled, inner)
        return inner

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        return (self.unwrap_model(model) if unwrap else model).state_dict()

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """`torch.save` (or safetensors) on the main process only, or once per machine."""
        if not self._writes_shared_files():
            return
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(_without_aliases(obj), f, metadata={"format": "pt"})
        else:
            torch.save(obj, f)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """The unwrapped weights in `save_directory`, sharded as Hugging Face checkpoints are."""
        if os.path.isfile(save_directory):
            raise ValueError(f"save_model expects a directory, {save_directory} is a file")
        if any(p.device.type == "meta" for p in model.parameters()):
            raise RuntimeError("some parameters are on the meta device: nothing to save")
        state = self.get_state_dict(model)
        if safe_serialization:
            state = _without_aliases(state)
        os.makedirs(save_directory, exist_ok=True)
        index = None
        for name, shard, shard_index in _shards(state, max_shard_size, safe_serialization):
            self.save(shard, os.path.join(save_directory, name), safe_serialization)
            index = shard_index
        if index is not None and self._writes_shared_files():
            weights = "model.safetensors" if safe_serialization else "pytorch_model.bin"
            path = os.path.join(save_directory, f"{weights}.index.json")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(index, indent=2, sort_keys=True) + "\n")

    # -------------------------------------------------------------------- registered state
    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load these objects' state_dict with save_state / load_state, in order."""
        invalid = [type(o).__name__ for o in objects if not _has_state(o)]
        if invalid:
            raise ValueError(
                f"objects need state_dict and load_state_dict to be checkpointed: {invalid}"
            )
        self._custom_objects.extend(objects)

    @property
    def _custom_objects(self) -> list[Any]:
        return self.__dict__.setdefault("_registered_for_checkpointing", [])

    @property
    def _dataloaders(self) -> list[Any]:
        """The prepared loaders, in prepare order (their pass states go in guard_engine_*)."""
        return self.__dict__.setdefault("_prepared_dataloaders", [])

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> hooks.RemovableHandle:
        """`hook(models, weights, output_dir)` runs before save_state writes the weights."""
        return _add_hook(self.__dict__.setdefault("_save_state_hooks", {}), hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> hooks.RemovableHandle:
        """`hook(models, input_dir)` runs before load_state reads the weights."""
        return _add_hook(self.__dict__.setdefault("_load_state_hooks", {}), hook)

    # ------------------------------------------------------------------------- save_state
    def save_state(
        self, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True, **_: Any
    ) -> Path:
        """Everything a resumed run needs, in the layout of this module's docstring."""
        output = Path(self._checkpoint_folder(output_dir))
        output.mkdir(parents=True, exist_ok=True)
        if any(_fsdp2.is_sharded(m) for m in self._models):  # FSDP2: the sharded DCP layout
            self.save_sharded_state(output)
            self.project_configuration.iteration += 1
            return output
        weights = [self.get_state_dict(m, unwrap=False) for m in self._models]
        for hook in self.__dict__.get("_save_state_hooks", {}).values():
            hook(self._models, weights, str(output))
        stem = "model.safetensors" if safe_serialization else "pytorch_model.bin"
        for i, state in enumerate(weights):
            self.save(state, output / _suffixed(stem, i), safe_serialization)
        for i, optimizer in enumerate(self._optimizers):
            self.save(optimizer.state_dict(), output / _suffixed("optimizer.bin", i))
        for i, scheduler in enumerate(self._schedulers):
            self.save(scheduler.state_dict(), output / _suffixed("scheduler.bin", i))
        if self.scaler is not None:
            self.save(self.scaler.state_dict(), output / "scaler.pt")
        for i, obj in enumerate(self._custom_objects):
            self.save(obj.state_dict(), output / f"custom_checkpoint_{i}.pkl")
        self._save_rank_files(output, engine=self.state_dict())
        self.project_configuration.iteration += 1
        return output

    def _save_rank_files(self, output: Path, **state: Any) -> None:
        """This rank's own files, also beside FSDP2's shards: its random generators
        (`random_states_<rank>.pkl`, Accelerate's) and the generator states its loaders' current
        passes were drawn from, with `state` (`guard_engine_<rank>.pt`)."""
        rank = self.process_index
        torch.save(_random_states(self.step), output / f"random_states_{rank}.pkl")
        loaders = [loader.pass_rng for loader in self._dataloaders]
        torch.save({**state, "loader_rng": loaders}, output / f"guard_engine_{rank}.pt")

    def _read_rank_file(self, folder: Path) -> dict | None:
        """This rank's `guard_engine_<rank>.pt`, None when the folder has none (Accelerate's)."""
        path = folder / f"guard_engine_{self.process_index}.pt"
        if not path.is_file():
            return None
        return torch.load(path, map_location="cpu", weights_only=True)

    def _resume_loader_passes(self, saved: dict) -> None:
        """Each prepared loader's next pass redraws the order the saved pass was drawn from."""
        for loader, states in zip(self._dataloaders, saved["loader_rng"], strict=False):
            loader.resume_rng = states

    def _checkpoint_folder(self, output_dir: str | os.PathLike | None) -> str:
        config = self.project_configuration
        if not config.automatic_checkpoint_naming:
            if output_dir is None:
                raise ValueError("save_state needs an output_dir (or automatic_checkpoint_naming)")
            return str(output_dir)
        root = os.path.join(config.project_dir, "checkpoints")
        os.makedirs(root, exist_ok=True)
        folders = sorted(_numbered(root), key=_number)
        excess = len(folders) + 1 - (config.total_limit or len(folders) + 1)
        if excess > 0 and self.is_main_process:
            for folder in folders[:excess]:
                shutil.rmtree(folder)
        target = os.path.join(root, f"checkpoint_{config.iteration}")
        if os.path.exists(target):
            raise ValueError(f"checkpoint folder {target} exists already: set save_iteration")
        self.wait_for_everyone()
        return target

    # ------------------------------------------------------------------------- load_state
    def load_state(
        self, input_dir: str | os.PathLike | None = None, load_kwargs: dict | None = None, **kwargs
    ) -> None:
        """Restore what `save_state` wrote; prepare the same objects, in the same order, first."""
        folder = Path(self._input_folder(input_dir))
        if any(_fsdp2.is_sharded(m) for m in self._models):
            self.load_sharded_state(folder)
            return
        for hook in self.__dict__.get("_load_state_hooks", {}).values():
            hook(self._models, str(folder))
        kwargs.pop("map_location", None)
        for i, model in enumerate(self._models):
            _load_weights(model, folder, i, kwargs)
        for i, optimizer in enumerate(self._optimizers):
            optimizer.load_state_dict(_load(folder / _suffixed("optimizer.bin", i), load_kwargs))
        for i, scheduler in enumerate(self._schedulers):
            scheduler.load_state_dict(_load(folder / _suffixed("scheduler.bin", i), load_kwargs))
        if self.scaler is not None:
            self.scaler.load_state_dict(_load(folder / "scaler.pt", load_kwargs))
        step = _restore_random_states(folder / f"random_states_{self.process_index}.pkl")
        self._load_custom_objects(folder)
        saved = self._read_rank_file(folder)
        if saved is not None:
            self.load_state_dict(saved["engine"])
            self._resume_loader_passes(saved)
        elif step is not None:  # an Accelerate checkpoint: its micro-step counter
            self.step = step

    def _input_folder(self, input_dir: str | os.PathLike | None) -> str:
        if input_dir is not None:
            folder = os.path.expanduser(str(input_dir))
            if not os.path.isdir(folder):
                raise ValueError(f"Tried to find {folder} but folder does not exist")
            return folder
        if not self.project_configuration.automatic_checkpoint_naming:
            raise ValueError("No input_dir provided and automatic checkpoint naming is disabled.")
        root = os.path.join(self.project_configuration.project_dir, "checkpoints")
        return sorted(_numbered(root), key=_number)[-1]

    def _load_custom_objects(self, folder: Path) -> None:
        found = [f for f in os.listdir(folder) if _CUSTOM_FILE.match(f)]
        if len(found) != len(self._custom_objects):
            raise RuntimeError(
                f"{folder} holds {len(found)} custom checkpoints but {len(self._custom_objects)} "
                "objects are registered for checkpointing: register the same objects as the run "
                "that saved it"
            )
        for i, obj in enumerate(self._custom_objects):
            path = folder / f"custom_checkpoint_{i}.pkl"
            obj.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))

    def _credit_restored_window(self) -> None:
        """The guard counts each window's backward passes per optimizer; a window restored
        mid-way began before this process did, so its micro-steps count as seen (else its
        short first step looks like ACL312's early gate)."""
        if not TRACKER.active:
            return
        done = self._window.length
        for optimizer in self._optimizers:
            state = TRACKER.state(optimizer.optimizer)
            state.contrib_backwards += done
            if self.scaler is not None:
                state.contrib_scaled += done

    def _writes_shared_files(self) -> bool:
        if self.project_configuration.save_on_each_node:
            return self.is_local_main_process
        return self.is_main_process


def _restore_forward(model: torch.nn.Module) -> None:
    """Undo the engine's autocast forward: the class's own forward again, or the one before."""
    original = model.__dict__.pop("_original_forward")
    if getattr(original, "__func__", None) is type(model).forward:
        model.__dict__.pop("forward", None)
    else:
        model.forward = original


def _recompiled(compiled: torch.nn.Module, inner: torch.nn.Module) -> torch.nn.Module:
    compiled._orig_mod = inner
    return compiled


def _has_state(obj: Any) -> bool:
    return hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")


def _add_hook(table: dict, hook: Callable) -> hooks.RemovableHandle:
    handle = hooks.RemovableHandle(table)
    table[handle.id] = hook
    return handle


def _numbered(root: str) -> list[str]:
    names = [name for name in os.listdir(root) if _CHECKPOINT_NUMBER.search(name)]
    return [os.path.join(root, name) for name in names]


def _number(folder: str) -> int:
    return int(_CHECKPOINT_NUMBER.search(folder).group(1))


def _without_aliases(state: Any) -> Any:
    """Safetensors refuses tensors sharing storage (tied weights): keep the first name of each."""
    if not isinstance(state, dict):
        return state
    seen: set[tuple] = set()
    kept = {}
    for name, tensor in state.items():
        if isinstance(tensor, torch.Tensor):
            key = (tensor.device, tensor.untyped_storage().data_ptr())
            if tensor.numel() and key in seen:
                continue
            seen.add(key)
            tensor = tensor.contiguous()
        kept[name] = tensor
    return kept


def _shards(state: dict, max_shard_size: Any, safe: bool):
    """(file name, tensors, index or None) per shard, Hugging Face's naming when sharded."""
    pattern = "model{suffix}.safetensors" if safe else "pytorch_model{suffix}.bin"
    try:
        from huggingface_hub import split_torch_state_dict_into_shards
    except ImportError:
        yield pattern.format(suffix=""), state, None
        return
    split = split_torch_state_dict_into_shards(
        state, filename_pattern=pattern, max_shard_size=max_shard_size
    )
    index = None
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    for name, names in split.filename_to_tensors.items():
        yield name, {n: state[n] for n in names}, index


def _random_states(step: int) -> dict[str, Any]:
    states: dict[str, Any] = {
        "step": step,
        "random_state": random.getstate(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    numpy = _numpy()
    if numpy is not None:
        states["numpy_random_seed"] = numpy.random.get_state()
    if torch.cuda.is_available():
        states["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    return states


def _restore_random_states(path: Path) -> int | None:
    """Set the generators saved in `path`; the saved "step", or None without the file."""
    if not path.is_file():
        return None
    states = _load(path, None, numpy_allowed=True)
    random.setstate(states["random_state"])
    torch.set_rng_state(states["torch_manual_seed"])
    numpy = _numpy()
    if numpy is not None and "numpy_random_seed" in states:
        numpy.random.set_state(states["numpy_random_seed"])
    if torch.cuda.is_available() and "torch_cuda_manual_seed" in states:
        torch.cuda.set_rng_state_all(states["torch_cuda_manual_seed"])
    return states.get("step")


def _load(path: Path, load_kwargs: dict | None, numpy_allowed: bool = False) -> Any:
    """torch.load with weights_only (numpy's RNG state types allowed where asked)."""
    kwargs = {"map_location": "cpu", "weights_only": True, **(load_kwargs or {})}
    numpy = _numpy() if numpy_allowed else None
    if numpy is None:
        return torch.load(path, **kwargs)
    core = getattr(numpy, "_core", None) or numpy.core
    allowed = [core.multiarray._reconstruct, numpy.ndarray, numpy.dtype, codecs.encode]
    allowed += [type(numpy.dtype(numpy.uint32))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, **kwargs)


def _load_weights(model: torch.nn.Module, folder: Path, index: int, kwargs: dict) -> None:
    safe = folder / _suffixed("model.safetensors", index)
    if safe.is_file():
        from safetensors.torch import load_model

        load_model(model, safe, device="cpu", **kwargs)
        return
    state = torch.load(folder / _suffixed("pytorch_model.bin", index), map_location="cpu")
    model.load_state_dict(state, **kwargs)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy
