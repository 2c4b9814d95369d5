"""`guard.Engine`: mixed precision, gradient accumulation and data parallelism, done correctly.

The method names are Accelerate's, so switching is mechanical. The semantics are Accelerate's
(the README's "What the engine does": backward divides by K, an update step every K
`accumulate()` entries or at the loader's last batch, optimizer, scheduler and `no_sync` gated on
it, an autocast forward with fp32 outputs), with these differences:

- fp16 on a CPU device really runs fp16 autocast with `torch.amp.GradScaler("cpu")`
  (Accelerate silently trains fp32 there while reporting fp16).
- A skipped fp16 step is detected by the scale back-off, so fused and capturable optimizers
  never advance the scheduler on a skipped step (Accelerate's skip flag misses them).
- `tail="exact"` weights a tail window of r < K micro-batches by 1/r instead of Accelerate's
  1/K (the default, `tail="accelerate"`, keeps Accelerate's r/K weight).
- `backward(loss_sum, num_items=n)` normalises by the item count of the whole window across all
  ranks, which gives the exact large-batch gradient for variable-length token losses.
- `state_dict()` also holds the gradients of a half-finished window, so resuming mid-window gives
  the same parameters as an uninterrupted run (without them a checkpoint taken mid-window loses
  or repeats micro-batches on resume).

Kept from Accelerate on purpose: under W processes a prepared map-style loader gives rank r the
batches r, r + W, ...; the last group is completed with samples from the start of the epoch (they
are trained on, and `gather_for_metrics` drops them), and the scheduler steps W times per
optimizer step unless `split_batches=True`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import torch
from torch.utils.data import DataLoader

from guard import _fsdp2, distributed
from guard._engine_options import AccelerateOptions
from guard._engine_processes import ProcessHelpers
from guard._engine_sharded import ShardedCheckpointing
from guard._engine_state import Checkpointing
from guard._engine_tracking import Tracking
from guard._engine_unsupported import UnsupportedNames
from guard._tracker import TRACKER
from guard._window import Window
from guard.checks import acl105_scaler_with_bf16 as acl105
from guard.checks import acl107_fp16_params_with_scaler as acl107
from guard.checks import acl202_backward_in_autocast as acl202
from guard.checks import acl302_double_loss_division as acl302
from guard.checks import acl303_per_microstep_clipping as acl303
from guard.checks import acl306_accumulate_context_missing as acl306
from guard.checks import acl307_dropped_tail_window as acl307
from guard.checks import acl308_token_mean_under_accumulation as acl308
from guard.checks import acl601_non_finite_loss_or_grad as acl601
from guard.checks import acl603_overflow_streak as acl603
from guard.prepared import (
    PreparedDataLoader,
    PreparedOptimizer,
    PreparedScheduler,
    wrap_forward,
)

Precision = Literal["no", "fp16", "bf16"]
Tail = Literal["accelerate", "exact"]
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class _Accumulate:
    """The `with engine.accumulate(...)` block: no_sync on non-sync steps, the in-window flag."""

    __slots__ = ("_window", "_ddp", "_stack")

    def __init__(self, window: Window, ddp: list[torch.nn.Module]):
        self._window = window
        self._ddp = ddp
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> None:
        self._window.in_accumulate = True
        if self._ddp:
            self._stack = contextlib.ExitStack()
            for model in self._ddp:  # DDP's no_sync or FSDP2's sync switch
                self._stack.enter_context(_fsdp2.no_sync(model))

    def __exit__(self, *exc: Any) -> None:
        self._window.in_accumulate = False
        if self._stack is not None:
            self._stack.close()
            self._stack = None


class _StepHooks:
    """The engine as the objects it prepared see it (`guard.prepared.StepHooks`)."""

    __slots__ = ("_engine",)

    def __init__(self, engine: Engine):
        self._engine = engine

    @property
    def window(self) -> Window:
        return self._engine._window

    @property
    def device(self) -> torch.device:
        return self._engine.device

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self._engine.scaler

    @property
    def loaders(self) -> list[Any]:
        return self._engine._dataloaders

    def before_step(self) -> None:
        self._engine._before_optimizer_step()

    def after_step(self, optimizer: PreparedOptimizer) -> None:
        self._engine._after_optimizer_step(optimizer)


class Engine(
    Checkpointing,
    ShardedCheckpointing,
    ProcessHelpers,
    Tracking,
    AccelerateOptions,
    UnsupportedNames,
):
    """A training engine with Accelerate's method names and correct accumulation semantics.

    Args:
        mixed_precision: "no", "fp16" (autocast + GradScaler, also on CPU) or "bf16" (autocast,
            never a scaler).
        gradient_accumulation_steps: K, the micro-steps per optimizer step.
        device: where models and batches go; default cuda:<local rank> if CUDA is present, else CPU.
        tail: how a tail window of r < K micro-batches is weighted: "accelerate" (1/K each, as
            Accelerate) or "exact" (1/r each, as a full batch of the remaining samples).
        split_batches: as in Accelerate, whether the scheduler steps once (True) or W times (False)
            per optimizer step.
        fsdp_plugin: shard prepared models with FSDP2 (`fully_shard`) instead of wrapping them in
            DDP, under several processes: a `guard.FSDP2Plugin` (block policy, resharding),
            Accelerate's `FullyShardedDataParallelPlugin(fsdp_version=2, ...)` (its supported
            fields mapped, the others refused by name), or True for the defaults. See
            guard/_fsdp2.py.
        **accelerate_options: Accelerator's other arguments (cpu, log_with, project_dir, ...),
            for scripts written for Accelerate; see guard/_engine_options.py.
    """

    def __init__(
        self,
        mixed_precision: Precision | None = "no",
        gradient_accumulation_steps: int = 1,
        device: str | torch.device | None = None,
        *,
        tail: Tail = "accelerate",
        split_batches: bool = False,
        fsdp_plugin: Any = None,
        **accelerate_options: Any,
    ):
        mixed_precision, device = self._adopt_accelerate_options(
            mixed_precision, device, accelerate_options
        )
        if mixed_precision not in ("no", "fp16", "bf16"):
            raise ValueError(f"mixed_precision must be no, fp16 or bf16, not {mixed_precision!r}")
        if tail not in ("accelerate", "exact"):
            raise ValueError(f"tail must be 'accelerate' or 'exact', not {tail!r}")
        self.device = _resolve_device(device)
        distributed.init_from_env(self.device)
        self.mixed_precision = mixed_precision
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.tail = tail
        self.split_batches = split_batches
        self.fsdp_plugin = _fsdp2.resolve(fsdp_plugin)
        self._window = Window(gradient_accumulation_steps)
        self._hooks = _StepHooks(self)  # what the prepared objects may ask of the engine
        self._plain_accumulate = _Accumulate(self._window, [])  # stateless without DDP: reused
        self.scaler = torch.amp.GradScaler(self.device.type) if mixed_precision == "fp16" else None
        self._models: list[torch.nn.Module] = []
        self._optimizers: list[PreparedOptimizer] = []
        self._schedulers: list[PreparedScheduler] = []
        self._items: Any = None  # summed num_items of the current window (None: not used)
        self._grads_ready = False  # grads of this sync step rescaled and, in fp16, unscaled
        self._unscaled: set[int] = set()  # ids of optimizers unscaled in this sync step
        self._nonfinite = acl601.EngineLosses()
        self._overflow = acl603.EngineStreak()
        self._token_means = acl308.EngineTokenMeans()
        self._tail_noted = False
        self._finish_accelerate_options()

    # ----------------------------------------------------------------- process information
    @property
    def num_processes(self) -> int:
        return distributed.world_size()

    @property
    def process_index(self) -> int:
        return distributed.rank()

    @property
    def is_main_process(self) -> bool:
        return distributed.rank() == 0

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print() on the main process only."""
        if self.is_main_process:
            print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        distributed.barrier()

    # ----------------------------------------------------------------------------- prepare
    def prepare(self, *objects: Any) -> Any:
        """Prepare models, optimizers, dataloaders and schedulers, returned in the given order."""
        prepared: list[Any] = [self._prepare_one(obj) for obj in objects]
        if self.fsdp_plugin is not None:  # sharding replaced the parameters the optimizers hold
            _fsdp2.adopt_sharded_parameters(self._optimizers)
        for i, obj in enumerate(objects):  # schedulers need the prepared optimizers first
            if _is_scheduler(obj):
                prepared[i] = self._prepare_scheduler(obj)
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def _prepare_one(self, obj: Any) -> Any:
        if isinstance(obj, torch.nn.Module):
            return self._prepare_model(obj)
        if isinstance(obj, PreparedOptimizer):
            return obj
        if isinstance(obj, torch.optim.Optimizer):
            optimizer = PreparedOptimizer(obj, self._hooks)
            self._optimizers.append(optimizer)
            if TRACKER.active:  # the guard's checks judge this optimizer by the engine's rules
                state = TRACKER.state(obj)
                state.prepared_by, state.wrapper = self, optimizer
                TRACKER.establish("prepared")
            return optimizer
        if isinstance(obj, DataLoader):
            return PreparedDataLoader(obj, self._hooks)
        if _is_scheduler(obj):
            return obj
        if isinstance(obj, torch.amp.GradScaler):
            return self._adopt_scaler(obj)
        raise TypeError(f"Engine.prepare does not know how to prepare {type(obj).__name__}")

    def _adopt_scaler(self, scaler: torch.amp.GradScaler) -> torch.amp.GradScaler:
        """fp16: use the caller's scaler (its init_scale, growth settings) instead of ours."""
        if self.mixed_precision != "fp16":
            acl105.scaler_outside_fp16(self.mixed_precision)
        self.scaler = scaler
        return scaler

    def _prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        acl107.engine_parameters(model, self.scaler is not None, self.gradient_accumulation_steps)
        model.to(self.device)
        inner = self.unwrap_model(model)
        if self.mixed_precision in _DTYPES and not hasattr(inner, "_original_forward"):
            wrap_forward(inner, self.device.type, _DTYPES[self.mixed_precision])
        if model is not inner or _fsdp2.is_sharded(model):  # wrapped (DDP) or sharded already
            self._models.append(model)
            return model
        if distributed.world_size() > 1 and any(p.requires_grad for p in model.parameters()):
            if self.fsdp_plugin is not None:
                model = _fsdp2.shard(model, self.fsdp_plugin, self.mixed_precision)
                self._models.append(model)
                return model
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        self._models.append(model)
        return model

    def _prepare_scheduler(self, scheduler: Any) -> PreparedScheduler:
        inner = scheduler.optimizer
        owners = [o for o in self._optimizers if o.optimizer is inner or o is inner]
        if not owners:
            raise ValueError("prepare the scheduler's optimizer with (or before) the scheduler")
        prepared = PreparedScheduler(scheduler, owners, self._hooks, self.split_batches)
        self._schedulers.append(prepared)
        if TRACKER.active:
            TRACKER.prepared_schedulers[scheduler] = (self, prepared)
            TRACKER.establish("prepared")
        return prepared

    # -------------------------------------------------------------------------- the window
    @property
    def sync_gradients(self) -> bool:
        """True on the micro-step that ends a window: the optimizer will really step."""
        return self._window.sync_gradients

    @property
    def optimizer_steps(self) -> int:
        """Real (not skipped) optimizer steps taken so far."""
        return self._window.optimizer_steps

    def accumulate(self, *models: torch.nn.Module) -> _Accumulate:
        """One micro-step; on non-sync steps DDP models run forward and backward under no_sync."""
        window = self._window
        window.advance()
        if window.sync_gradients:
            return self._plain_accumulate
        ddp = [m for m in models if _fsdp2.syncs_gradients(m)]  # DDP or FSDP2
        return _Accumulate(window, ddp) if ddp else self._plain_accumulate

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """DDP's no_sync (FSDP2: gradient sync off) for a prepared model; else nothing."""
        return _fsdp2.no_sync(model)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The engine's autocast region (for code outside the prepared model's forward)."""
        if self.mixed_precision not in _DTYPES:
            yield
            return
        region = torch.autocast(self.device.type, dtype=_DTYPES[self.mixed_precision])
        with TRACKER.autocast_origin("engine"), region:
            yield

    # ---------------------------------------------------------------------------- backward
    def backward(self, loss: torch.Tensor, num_items: Any = None, **kwargs: Any) -> None:
        """Backward of `loss / K` (scaled in fp16); the caller's tensor is left untouched.

        With `num_items`, `loss` is a sum over `num_items` items (tokens, samples) of this
        micro-batch on this rank; at the sync step the window's gradient is divided by the total
        item count over the window and all ranks, giving the exact large-batch mean.
        """
        self._check_backward(loss, num_items)
        if self._grads_ready:  # the previous sync step is done: a new window starts
            self._grads_ready = False
            self._unscaled.clear()
        if num_items is None:
            if self._items is not None:
                raise ValueError("backward(loss) and backward(loss, num_items=) mixed in a window")
            loss = loss / self.gradient_accumulation_steps
        else:
            self._add_items(num_items)
        if TRACKER.active:  # tell the guard's checks this backward is the engine's own
            with TRACKER.owning("engine"):
                self._run_backward(loss, kwargs)
        else:
            self._run_backward(loss, kwargs)

    def _check_backward(self, loss: torch.Tensor, num_items: Any) -> None:
        n = self.gradient_accumulation_steps
        if n > 1 and not self._window.in_accumulate:
            acl306.engine_backward(n)
        acl202.engine_backward(self.device.type)
        if num_items is None:
            world = distributed.world_size()
            acl302.engine_backward(loss, n, world)
            if n > 1 or world > 1:  # whether ACL308 is enabled is asked once, at the sync step
                self._token_means.record(loss)
        if not TRACKER.active:  # when installed, the guard's ACL601 check covers every backward
            self._nonfinite.record(loss)

    def _run_backward(self, loss: torch.Tensor, kwargs: dict[str, Any]) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward(**kwargs)
        else:
            loss.backward(**kwargs)

    def _add_items(self, num_items: Any) -> None:
        if self._items is None:
            self._items = 0
        self._items = self._items + num_items

    # ------------------------------------------------------------------ sync-step gradients
    def _trained_parameters(self) -> list[torch.Tensor]:
        return [p for o in self._optimizers for g in o.param_groups for p in g["params"]]

    def _prepare_gradients(self) -> None:
        """Once per sync step: apply the window's normalisation (num_items or exact tail)."""
        if self._grads_ready or not self._window.sync_gradients:
            return  # mid-window (an off-sync clip in warn mode) the sums are left alone
        self._grads_ready = True
        if not TRACKER.active:
            self._nonfinite.check(scaled=self.scaler is not None)
        self._token_means.check(self.num_processes)
        if self.tail == "accelerate" and self._window.is_tail and not self._tail_noted:
            self._tail_noted = True
            acl307.engine_tail(self._window.length, self.gradient_accumulation_steps)
        factor = self._window_factor()
        if factor is None:
            return
        grads = _fsdp2.trained_grads(self._trained_parameters())  # DTensors: their shards
        if grads:
            torch._foreach_mul_(grads, factor)

    def _window_factor(self) -> Any:
        """What the summed gradients must be multiplied by, or None when they are already right."""
        if self._items is not None:
            items = torch.as_tensor(self._items, dtype=torch.float64, device=self.device)
            items = distributed.all_reduce_sum(items.clone())
            self._items = None
            # DDP averages over ranks, so the rank sum is W times the average it produced.
            return (self.num_processes / items).float()
        if self.tail == "exact" and self._window.is_tail:
            return self.gradient_accumulation_steps / self._window.length
        return None

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """fp16: divide the gradients by the loss scale, once per optimizer step."""
        self._refuse_off_sync("unscale_gradients")
        self._prepare_gradients()
        if self.scaler is None:
            return
        targets = self._optimizers if optimizer is None else [optimizer]
        for opt in targets:
            inner = opt.optimizer if isinstance(opt, PreparedOptimizer) else opt
            if id(inner) not in self._unscaled:
                self._unscaled.add(id(inner))
                self.scaler.unscale_(inner)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Unscale (fp16), then clip the total gradient norm; returns the unclipped norm."""
        self._refuse_off_sync("clip_grad_norm_")
        parameters = list(parameters)
        self.unscale_gradients()
        with TRACKER.flag("clip_via", "engine"):
            norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
        norm = _fsdp2.plain_norm(norm)  # FSDP2: the all-reduced global norm, as a plain tensor
        if self.scaler is None and not TRACKER.active:
            acl601.EngineLosses.check_norm(norm)
        return norm

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Unscale (fp16), then clamp every gradient element to [-clip_value, clip_value]."""
        self._refuse_off_sync("clip_grad_value_")
        parameters = list(parameters)
        self.unscale_gradients()
        with TRACKER.flag("clip_via", "engine"):
            torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def _refuse_off_sync(self, what: str) -> None:
        if self.gradient_accumulation_steps > 1 and not self._window.sync_gradients:
            acl303.off_sync(f"engine.{what}", self._window.length, self.gradient_accumulation_steps)

    def _before_optimizer_step(self) -> None:
        self._prepare_gradients()

    def _after_optimizer_step(self, optimizer: PreparedOptimizer) -> None:
        if not optimizer.step_was_skipped:
            self._window.optimizer_steps += 1
        if self.scaler is not None and not TRACKER.active:  # else the guard's ACL603 check runs
            self._overflow.after_step(optimizer.step_was_skipped, self.scaler)

    # --------------------------------------------------------------------------- metrics
    def gather(self, data: Any) -> Any:
        """Concatenate tensors from all processes along dimension 0."""
        return distributed.gather(data)

    def gather_for_metrics(self, data: Any) -> Any:
        """`gather`, minus the duplicate samples padded into the last batch of a prepared loader."""
        gathered = distributed.gather(data)
        loaders = self._window.loaders
        if not loaders or not loaders[-1].end_of_dataloader or loaders[-1].remainder == 0:
            return gathered
        return _truncate(gathered, loaders[-1].remainder)

    def skip_first_batches(
        self, loader: PreparedDataLoader, num_batches: int
    ) -> PreparedDataLoader:
        """The same prepared loader, whose next pass starts after `num_batches` (for resuming)."""
        loader.skip_batches = num_batches
        return loader

    # ------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Scaler state, window counters and, mid-window, the gradients accumulated so far."""
        mid_window = not self._window.sync_gradients
        grads = None
        if mid_window and any(_fsdp2.is_sharded(m) for m in self._models):
            _fsdp2.refuse_mid_window()
        if mid_window:
            grads = [
                None if p.grad is None else p.grad.detach().clone()
                for p in self._trained_parameters()
            ]
        items = self._items
        return {
            "window": self._window.state_dict(),
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "grads": grads,
            "items": items.clone() if isinstance(items, torch.Tensor) else items,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved; prepare models and optimizers first."""
        self._window.load_state_dict(state["window"])
        if (state["scaler"] is None) != (self.scaler is None):
            raise ValueError("checkpoint and engine disagree on whether fp16 loss scaling is used")
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        self._items = state["items"]
        if state["grads"] is not None:
            params = self._trained_parameters()
            if len(params) != len(state["grads"]):
                raise ValueError("checkpoint holds gradients for a different set of parameters")
            for param, grad in zip(params, state["grads"], strict=True):
                param.grad = None if grad is None else grad.to(param.device, param.dtype)
            self._credit_restored_window()


def _resolve_device(device: str | torch.device | None) -> torch.device:
    """The given device with an explicit CUDA index (DDP and batch moves compare indices)."""
    if device is None:
        return distributed.default_device()
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _is_scheduler(obj: Any) -> bool:
    return isinstance(
        obj, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    )


def _truncate(data: Any, count: int) -> Any:
    if isinstance(data, torch.Tensor):
        return data[:count]
    if isinstance(data, dict):
        return type(data)({k: _truncate(v, count) for k, v in data.items()})
    items = [_truncate(v, count) for v in data]
    return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
