"""The model's kinds as `StrEnum`s: a typo in a kind is an AttributeError, not a silent miss.

Members compare equal to their strings, so a module still comparing with `"clip"` keeps working
while the others move to `SiteKind.CLIP`.
"""

from __future__ import annotations

from enum import StrEnum


class SiteKind(StrEnum):
    """What a `loops.Site` is (built in `sites.py`, `scaler_clipping.py`, `scaler_protocol.py`)."""

    BACKWARD = "backward"
    """`loss.backward()` / `torch.autograd.backward(loss)`: a plain tensor backward."""
    ENGINE_BACKWARD = "engine_backward"
    """`accelerator.backward(loss)`, `manual_backward`: an engine scales and divides it."""
    OPT_STEP = "opt_step"
    """`optimizer.step()`."""
    SCALER_STEP = "scaler_step"
    """`scaler.step(optimizer)`: the optimizer step through a GradScaler."""
    SCALER_UPDATE = "scaler_update"
    """`scaler.update()`."""
    UNSCALE = "unscale"
    """`scaler.unscale_(optimizer)` / `accelerator.unscale_gradients()`."""
    CLIP = "clip"
    """`clip_grad_norm_(...)` and the other gradient clipping calls."""
    ZERO_GRAD = "zero_grad"
    """`optimizer.zero_grad()` / `model.zero_grad()`."""
    SCHED_STEP = "sched_step"
    """`scheduler.step()`."""
    GRAD_DIV = "grad_div"
    """`p.grad /= K`, `p.grad.div_(K)`, `torch._foreach_div_`: gradients divided, not the loss."""


class GateKind(StrEnum):
    """What makes a statement run only on the update step (`loops.Gate`)."""

    MODULO = "modulo"
    """`if (i + 1) % K == 0:`."""
    COUNTER = "counter"
    """`if micro == K:`: a micro-step counter compared with K."""
    SYNC = "sync"
    """`if accelerator.sync_gradients:`."""
    MICRO_LOOP = "micro-loop"
    """`for _ in range(K):` around the backward, the step after it."""
    ACCUMULATE = "accumulate"
    """`with accelerator.accumulate(model):`: the engine decides the update step."""


class RegionKind(StrEnum):
    """The `with` block around a site (`loops.Region`)."""

    ACCUMULATE = "accumulate"
    """`with accelerator.accumulate(model):`."""
    AUTOCAST = "autocast"
    """`with torch.autocast(...):` and its older spellings."""
    ENGINE_AUTOCAST = "engine_autocast"
    """`with accelerator.autocast():`."""
    NO_SYNC = "no_sync"
    """`with model.no_sync():`: DDP skips the gradient all-reduce."""


class ContextKind(StrEnum):
    """What a context manager of the module enters (`classes.Entered`)."""

    AUTOCAST = "autocast"
    """`torch.autocast(...)` and its older spellings."""
    ENGINE_AUTOCAST = "engine_autocast"
    """`accelerator.autocast()`."""
    NO_SYNC = "no_sync"
    """`model.no_sync()`."""
    NO_GRAD = "no_grad"
    """`torch.no_grad()` / `torch.inference_mode()`."""
    ENABLE_GRAD = "enable_grad"
    """`torch.enable_grad()`."""


class FrameKind(StrEnum):
    """One enclosing construct of a statement (`functions.Frame`)."""

    LOOP = "loop"
    """A `for` or `while` body."""
    IF = "if"
    """An `if` branch: its body (`holds`) or its `else` (not `holds`)."""
    EXIT = "exit"
    """After `if test: continue/break/return`: the test does not hold."""
    WITH = "with"
    """A `with` body."""


class EngineKind(StrEnum):
    """What library an engine object comes from (`setup.Engine`)."""

    ACCELERATE = "accelerate"
    """Hugging Face Accelerate's `Accelerator`."""
    GUARD = "guard"
    """This project's runtime guard `Engine`."""
    DEEPSPEED = "deepspeed"
    """The engine `deepspeed.initialize(...)` returns."""
    FABRIC = "fabric"
    """Lightning's `Fabric`."""
    UNKNOWN = "unknown"
    """Recognised only by its name (`accelerator`, `engine`): its library is untold."""


class FlowState(StrEnum):
    """Whether the loss reaching a backward is divided by K (`dataflow.Flow`)."""

    DIVIDED = "divided"
    """Some division (by K, a token count, an item count) is visible."""
    UNDIVIDED = "undivided"
    """No path divides."""
    UNKNOWN = "unknown"
    """Something on the path could still divide and is not visible."""


class ScalerRole(StrEnum):
    """What a GradScaler expression does (`roles.Roles.scaler_role`)."""

    ENABLED = "enabled"
    """It scales, or may at runtime."""
    DISABLED = "disabled"
    """Built with a literal `enabled=False`: every call passes through."""


class BuiltKind(StrEnum):
    """What a constructor call of the setup builds (`setup.built_kind`)."""

    ENGINE = "engine"
    """`Accelerator(...)`, the guard's `Engine(...)`, `Fabric(...)`: its library is
    `setup.engine_kind`."""
    SCALER = "scaler"
    """`GradScaler(...)` / `ShardedGradScaler(...)`."""
    DDP = "ddp"
    """`DistributedDataParallel(...)` / `FullyShardedDataParallel(...)` (or `DDP`, `FSDP`)."""
    SCHEDULER = "scheduler"
    """A `torch.optim.lr_scheduler` class or a schedule factory (`get_cosine_schedule_...`)."""
    OPTIMIZER = "optimizer"
    """A `torch.optim` or bitsandbytes optimizer, transformers' `AdamW`, `Adafactor`, or an
    optimizer factory (`create_optimizer`)."""


class ReadKind(StrEnum):
    """What a read of the accumulation value K does with it (`k_reads.Read`, weighed by
    ACL313: K that only enters arithmetic describes batches that never exist)."""

    ENGINE = "engine"
    """Handed to an engine, a trainer or a config (`gradient_accumulation_steps=K`)."""
    GATE = "gate"
    """A modulus, a comparison, a `range`, or any read in a loop or `if` header."""
    DIVISION = "division"
    """Divides a loss or the gradients."""
    ARITHMETIC = "arithmetic"
    """Step, learning-rate or batch arithmetic (`total_batch = bs * K`)."""
    LOG = "log"
    """Printed or logged only."""
    CALL = "call"
    """Given to a call the linter cannot see into, or returned."""
    ALIAS = "alias"
    """Bound to another name."""


class LossTermKind(StrEnum):
    """What a token-level loss on the path to a backward is (`losses.TokenMean`)."""

    MEAN = "mean"
    """A mean over the micro-batch's tokens: weighted by its token count, ACL308's finding."""
    SUM = "sum"
    """A token sum (`reduction="sum"`): no finding by itself; divided by its own micro-batch's
    token count it is a mean again."""


class CheckpointKind(StrEnum):
    """How a training checkpoint is saved (`checkpoints.Checkpoint`)."""

    TORCH_SAVE = "torch.save"
    """`torch.save(state, path)`: the keys of the saved dict can be read."""
    ENGINE = "engine"
    """`accelerator.save_state(...)` / `save_checkpoint(...)`: the engine decides what it holds."""
