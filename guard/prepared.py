"""What `Engine.prepare` hands back: a model with an autocast forward, and wrappers around the
optimizer, scheduler and dataloader that carry the accumulation gating.

The wrappers follow Accelerate's semantics (README, "What the engine does", 5, 6, 8 and 10:
optimizer and scheduler gated on the update step, an autocast forward with fp32 outputs, a tail
window divided by K) and differ where Accelerate is wrong or silent:
- a skipped fp16 step is detected by the scale back-off, so fused optimizers are covered too;
- fp16 on CPU really runs fp16 autocast (Accelerate silently trains fp32 there).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, IterableDataset

from guard import _patch, distributed
from guard._tracker import TRACKER
from guard._window import Window

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class StepHooks(Protocol):
    """What the prepared objects ask of the engine that prepared them, and nothing more: its
    accumulation window, its device and scaler, the calls around a real optimizer step, and the
    list its prepared loaders join (for save_state). `guard.Engine` hands them its own."""

    @property
    def window(self) -> Window: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def scaler(self) -> torch.amp.GradScaler | None: ...

    @property
    def loaders(self) -> list[Any]: ...

    def before_step(self) -> None:
        """Once the sync step's optimizer is about to step (the window's normalisation)."""

    def after_step(self, optimizer: PreparedOptimizer) -> None:
        """After it stepped (or the scaler skipped it: `optimizer.step_was_skipped`)."""


def to_fp32(value: Any) -> Any:
    """Cast fp16/bf16 tensors (nested in tuples, lists, dicts) back to fp32."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in _LOW_PRECISION else value
    if isinstance(value, dict):
        for key in list(value.keys()):  # in place: keeps dict subclasses such as ModelOutput
            value[key] = to_fp32(value[key])
        return value
    if isinstance(value, (tuple, list)):
        items = [to_fp32(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def to_device(value: Any, device: torch.device) -> Any:
    """Move tensors (nested in tuples, lists, dicts) to `device`."""
    if isinstance(value, torch.Tensor):
        if value.device == device:  # `.to` costs tens of microseconds even when it is a no-op
            return value
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return type(value)({k: to_device(v, device) for k, v in value.items()})
    if isinstance(value, (tuple, list)):
        items = [to_device(v, device) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


class _AutocastForward(_patch.TransparentWrapper):
    """The engine's forward: autocast around the model's own, fp32 outputs (so the loss is
    computed in fp32 and backward runs outside autocast). A checkpoint (`torch.save(model)`,
    pickle, deepcopy) holds the model's own forward: it loads without the guard, as the plain
    model."""

    def __init__(self, forward: Any, device_type: str, dtype: torch.dtype) -> None:
        super().__init__(forward)
        self._device_type, self._dtype = device_type, dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        autocast = torch.autocast(self._device_type, dtype=self._dtype)
        if TRACKER.active and not torch.compiler.is_compiling():
            with TRACKER.autocast_origin("engine"), autocast:  # the guard's checks see the engine
                outputs = self.__wrapped__(*args, **kwargs)
        else:
            with autocast:
                outputs = self.__wrapped__(*args, **kwargs)
        return to_fp32(outputs)


def wrap_forward(model: torch.nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """Run `model.forward` under autocast and return fp32 outputs, as Accelerate does.

    The loss is then computed in fp32 and backward runs outside autocast. The original forward
    stays reachable as `model._original_forward`, as with Accelerate.
    """
    original = model.forward
    model._original_forward = original  # type: ignore[attr-defined]
    model.forward = _AutocastForward(original, device_type, dtype)  # type: ignore[method-assign]


class PreparedOptimizer(torch.optim.Optimizer):
    """Steps and zeroes only on sync steps; fp16 steps go through the scaler.

    It shares `param_groups` and `state` with the wrapped optimizer, so schedulers, checkpoints
    and `opt.param_groups[0]["lr"]` keep working on either object.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, hooks: StepHooks):
        # Deliberately no super().__init__: all optimizer state lives in `optimizer`.
        self.optimizer = optimizer
        self._hooks = hooks
        self._window = hooks.window  # read directly on every micro-step (no property hop)
        self.step_was_skipped = False

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, state: Any) -> None:
        self.optimizer.state = state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults: dict[str, Any]) -> None:
        self.optimizer.defaults = defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._window.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if not self._window.sync_gradients:
            return None
        self._hooks.before_step()
        if TRACKER.active:  # the guard's step checks learn that the engine is stepping
            with TRACKER.flag("step_wrapper", self):
                result = self._inner_step(closure)
        else:
            result = self._inner_step(closure)
        self._hooks.after_step(self)
        return result

    def _inner_step(self, closure: Any) -> Any:
        scaler = self._hooks.scaler
        if scaler is None:
            self.step_was_skipped = False
            return self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        return self._scaled_step(scaler, closure)

    def _scaled_step(self, scaler: torch.amp.GradScaler, closure: Any) -> Any:
        """`scaler.step` + `scaler.update`; a lower scale afterwards means the step was skipped.

        Comparing scales (one host read per optimizer step) sees skips inside fused and
        capturable optimizers, which torch's own skip flag misses.
        """
        before = scaler.get_scale()
        result = scaler.step(self.optimizer, closure) if closure else scaler.step(self.optimizer)
        scaler.update()
        self.step_was_skipped = scaler.get_scale() < before
        return result

    def __repr__(self) -> str:
        return f"PreparedOptimizer({self.optimizer!r})"


class PreparedScheduler:
    """Steps the wrapped scheduler only after a real optimizer step: on an update step whose
    optimizer step ran (not after a skipped fp16 step), as Accelerate does.

    Like Accelerate it steps W times per optimizer step unless `split_batches=True`, so a
    schedule sized in global batches (samples / per-process batch size) keeps its length.
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: list[PreparedOptimizer],
        hooks: StepHooks,
        split_batches: bool,
    ):
        self.scheduler = scheduler
        self.optimizers = optimizers
        self._window = hooks.window
        self.split_batches = split_batches

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self._window.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        repeats = 1 if self.split_batches else distributed.world_size()
        with TRACKER.flag("sched_wrapper", self):
            self._step_inner(repeats, args, kwargs)

    def _step_inner(self, repeats: int, args: tuple, kwargs: dict[str, Any]) -> None:
        for _ in range(repeats):
            total = getattr(self.scheduler, "total_steps", None)
            if total is not None and self.scheduler._step_count > total:
                return  # OneCycleLR raises past its end; Accelerate stops there too
            self.scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def __getattr__(self, name: str) -> Any:  # last_epoch, base_lrs, ... of the wrapped scheduler
        scheduler = self.__dict__.get("scheduler")
        if scheduler is None:
            raise AttributeError(name)
        return getattr(scheduler, name)


class _ShardedBatches(torch.utils.data.Sampler):
    """Rank r takes batches r, r + W, r + 2W, ... of the original batch sampler.

    The last group of W batches is completed, and every batch in it filled to the full batch
    size, with indices taken again from the start of the epoch, so all ranks run the same number
    of equally sized batches (Accelerate's `even_batches`). `gather_for_metrics` drops them.
    """

    def __init__(self, batch_sampler: Any, batch_size: int, rank: int, world: int):
        self.batch_sampler = batch_sampler
        self.batch_size = batch_size
        self.rank = rank
        self.world = world

    def __len__(self) -> int:
        return math.ceil(len(self.batch_sampler) / self.world)

    def __iter__(self) -> Iterator[list[int]]:
        batches = [list(b) for b in self.batch_sampler]
        if not batches:
            return
        flat = [i for b in batches for i in b]
        groups = math.ceil(len(batches) / self.world)
        full = groups * self.world
        padded = batches + [[] for _ in range(full - len(batches))]
        cursor = 0
        for position in range((groups - 1) * self.world, full):
            while len(padded[position]) < self.batch_size:
                padded[position].append(flat[cursor % len(flat)])
                cursor += 1
        yield from padded[self.rank :: self.world]


class PreparedDataLoader:
    """Yields device batches and flags its last batch one batch ahead: that batch's
    `accumulate()` entry is an update step whatever the count, as in Accelerate.

    Under W > 1 it shards a map-style loader's batches across ranks (see `_ShardedBatches`).
    """

    def __init__(self, loader: DataLoader, hooks: StepHooks):
        self._hooks = hooks
        self.base_loader = loader
        self.end_of_dataloader = False
        self.remainder = 0  # real samples in the last global batch; 0 when it is full
        self.loader = self._shard(loader) if distributed.world_size() > 1 else loader
        self.skip_batches = 0  # batches the next pass drops first (resuming mid-epoch)
        self.pass_rng: Any = None  # generator states the current pass drew its order from
        self.resume_rng: Any = None  # pass_rng of the interrupted run, set by load_state
        hooks.loaders.append(self)  # save_state keeps pass_rng for an exact resume

    def _shard(self, loader: DataLoader) -> DataLoader:
        if isinstance(loader.sampler, torch.utils.data.DistributedSampler):
            return loader  # already sharded by the user
        if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None:
            raise ValueError(
                "guard.Engine shards map-style DataLoaders with a batch_size under several "
                "processes; shard this loader yourself (e.g. DistributedSampler) before prepare"
            )
        world, rank = distributed.world_size(), distributed.rank()
        sharded = _ShardedBatches(loader.batch_sampler, loader.batch_size, rank, world)
        global_batch = loader.batch_size * world
        self.remainder = len(loader.dataset) % global_batch  # type: ignore[arg-type]
        kwargs: dict[str, Any] = {
            "batch_sampler": sharded,
            "num_workers": loader.num_workers,
            "collate_fn": loader.collate_fn,
            "pin_memory": loader.pin_memory,
            "timeout": loader.timeout,
            "worker_init_fn": loader.worker_init_fn,
            "generator": loader.generator,
        }
        if loader.num_workers > 0:
            kwargs["prefetch_factor"] = loader.prefetch_factor
            kwargs["persistent_workers"] = loader.persistent_workers
            kwargs["multiprocessing_context"] = loader.multiprocessing_context
        return DataLoader(loader.dataset, **kwargs)

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def dataset(self) -> Any:
        return self.base_loader.dataset

    @property
    def batch_size(self) -> int | None:
        return self.base_loader.batch_size

    def set_epoch(self, epoch: int) -> None:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def _resumed(self, skip: int, states: Any) -> Iterator[Any]:
        """The next pass, `skip` batches on. Resuming from save_state, its order (and worker
        seeds) are drawn again from the states the interrupted pass drew them from; either way
        the global generator is left as it was (as load_state restored it), so the rest of the
        pass sees the numbers the interrupted run would have."""
        with torch.random.fork_rng(devices=[]):
            if states is not None:
                _set_generator_states(self.loader, states)
            self.pass_rng = _generator_states(self.loader)
            iterator = iter(self.loader)
            for _ in range(skip):
                next(iterator, None)
        return iterator

    def __iter__(self) -> Iterator[Any]:
        window = self._hooks.window
        device = self._hooks.device
        self.end_of_dataloader = False
        window.loaders.append(self)
        try:
            skip, self.skip_batches = self.skip_batches, 0
            resume_rng, self.resume_rng = self.resume_rng, None
            if skip:
                iterator = self._resumed(skip, resume_rng)
            else:
                self.pass_rng = _generator_states(self.loader)
                iterator = iter(self.loader)
            try:
                current = next(iterator)
            except StopIteration:
                return
            for upcoming in iterator:
                yield to_device(current, device)
                current = upcoming
            self.end_of_dataloader = True
            yield to_device(current, device)
        finally:
            window.loaders.remove(self)


def _generators(loader: DataLoader) -> list[torch.Generator]:
    """The loader's own generators (its sampler's), without the global one."""
    found: list[torch.Generator] = []
    for owner in (loader, getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


def _generator_states(loader: DataLoader) -> list[torch.Tensor]:
    """The global CPU generator's state, then the loader's own generators' states."""
    return [torch.get_rng_state()] + [g.get_state() for g in _generators(loader)]


def _set_generator_states(loader: DataLoader, states: list[torch.Tensor]) -> None:
    torch.set_rng_state(states[0])
    for generator, state in zip(_generators(loader), states[1:], strict=False):
        generator.set_state(state)
