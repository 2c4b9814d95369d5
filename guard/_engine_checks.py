"""The engine's own runtime checks: catalogue codes that only the engine can see from the inside.

The guard's general checks (guard/checks/) leave calls the engine owns to these functions. Each
is cheap on the micro-step path (flag reads, one walk up the loss graph's root, one device-side
`isfinite`); anything that needs a host read waits for the sync step.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from guard import _report
from guard.checks import _graph
from guard.checks import acl308_token_mean_under_accumulation as token_means
from guard.checks._common import report

_FACTOR_ROOTS = ("DivBackward0", "MulBackward0")


def scaler_outside_fp16(precision: str) -> None:
    """ACL105: a GradScaler handed to an engine that does not train in fp16."""
    if precision == "bf16":
        report(
            "ACL105",
            "a GradScaler was passed to a bf16 engine: bf16 has fp32's exponent range, so "
            "scaling buys nothing and would hide genuine inf steps; the engine builds no scaler",
        )
    raise ValueError(f"a GradScaler belongs to mixed_precision='fp16', not {precision!r}")


def low_precision_parameters(model: torch.nn.Module, scaled: bool, n: int) -> None:
    """ACL107: trainable fp16 parameters under a scaler, or low-precision gradient sums (N > 1)."""
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    if scaled and torch.float16 in dtypes:
        report(
            "ACL107",
            "the model has trainable fp16 parameters and the engine uses fp16 loss scaling: "
            "GradScaler cannot unscale fp16 gradients; keep the weights in fp32 (autocast does "
            "the fp16 math)",
        )
    low = sorted(str(d).removeprefix("torch.") for d in dtypes & {torch.float16, torch.bfloat16})
    if n > 1 and low:
        report(
            "ACL107",
            f"trainable {'/'.join(low)} parameters with {n}-step accumulation: every micro-step "
            "adds into a low-precision .grad and loses low-order bits; keep the weights in fp32",
            "warning",
        )


def backward_under_autocast(device_type: str) -> None:
    """ACL202: engine.backward called inside an enabled autocast region."""
    if torch.is_autocast_enabled(device_type) and _report.enabled("ACL202"):
        report(
            "ACL202",
            "engine.backward runs inside an autocast region: only the forward belongs there "
            "(a compiled backward can inherit fp16); call backward after the `with` block",
        )


def manual_division(loss: torch.Tensor, n: int, world: int) -> None:
    """ACL302 / ACL402: the loss reaching engine.backward was already divided by N or by W."""
    if n == 1 and world == 1 or type(loss.grad_fn).__name__ not in _FACTOR_ROOTS:
        return  # the usual case: the loss's root is the loss function itself, not a factor
    if not (_report.enabled("ACL302") or _report.enabled("ACL402")):
        return
    factor = _graph.root_factor(loss)
    if factor is None or factor == 1.0:
        return
    if n > 1 and (_close(factor, 1 / n) or world > 1 and _close(factor, 1 / (n * world))):
        report(
            "ACL302",
            f"the loss passed to engine.backward is already multiplied by {factor:g} = 1/{n}, "
            f"and the engine divides by N={n} again: gradients are {n}x too small; pass the "
            "undivided loss",
            "warning",
        )
    if world > 1 and (_close(factor, 1 / world) or _close(factor, 1 / (n * world))):
        report(
            "ACL402",
            f"the loss passed to engine.backward is divided by the world size {world}: DDP "
            f"already averages gradients over the {world} processes, so they end {world}x too "
            "small; pass the undivided loss",
            "warning",
        )


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6)


def clip_off_sync(what: str, done: int, n: int) -> None:
    """ACL303: a clip or unscale while the window is not complete."""
    report(
        "ACL303",
        f"engine.{what} on a non-sync micro-step ({done} of {n} micro-batches accumulated): it "
        "acts on a partial sum (and a second unscale in the window fails in fp16); put it under "
        "`if engine.sync_gradients:`",
    )


def backward_outside_accumulate(n: int) -> None:
    """ACL306: with N > 1, a backward outside `with engine.accumulate(...)`."""
    report(
        "ACL306",
        f"engine.backward outside engine.accumulate() with gradient_accumulation_steps={n}: "
        f"the loss is divided by {n} but the window never advances, so the optimizer steps on "
        f"every batch with 1/{n} of the gradient; wrap the micro-step in "
        "`with engine.accumulate(model):`",
    )


def tail_weight(r: int, n: int) -> None:
    """ACL307 (a note, not a finding): a tail window of r < N micro-batches was flushed with
    Accelerate's 1/N, the engine's documented default; a correct loop, so nothing is reported."""
    _report.note(
        "ACL307",
        f"the loader ended after {r} of {n} micro-batches of a window; the engine stepped on "
        f"them, each divided by {n} as Accelerate does, so this tail counts {r}/{n} of a full "
        f"window; Engine(tail='exact') gives it the weight of a full batch "
        "(accel-lint --explain ACL307)",
    )


class NonFinite:
    """ACL601: a non-finite loss in the window, read once at the sync step (one host read)."""

    def __init__(self) -> None:
        self._losses: list[torch.Tensor] = []

    def record(self, loss: torch.Tensor) -> None:
        """Keep a detached reference: no kernel and no host read on the micro-step path."""
        self._losses.append(loss.detach())

    def check(self, scaled: bool) -> None:
        """Report before the optimizer runs; under a scaler only as a warning (it skips)."""
        losses, self._losses = self._losses, []
        if not losses:
            return
        # a non-scalar loss is summed in fp32 (a fp16 sum could overflow); stack promotes dtypes,
        # and one .tolist() is the single host read (cheaper than isfinite + all + bool kernels)
        losses = [loss.float().sum() if loss.dim() else loss for loss in losses]
        if all(math.isfinite(value) for value in torch.stack(losses).tolist()):
            return
        if scaled:
            report(
                "ACL601",
                "a loss in this window was inf/NaN before loss scaling: the scaler will skip the "
                "step, but an unscaled non-finite loss is a bug in the model or data, not an "
                "overflow",
                "warning",
            )
            return
        report(
            "ACL601",
            "a loss in this window was inf/NaN: stepping would write it into every weight (and "
            "Adam's moments); the step was refused before any parameter changed",
        )

    @staticmethod
    def check_norm(norm: torch.Tensor) -> None:
        """ACL601 for the gradient norm that clipping computed anyway (no scaler active)."""
        if not bool(torch.isfinite(norm)):
            report(
                "ACL601",
                f"the total gradient norm is {float(norm)}: stepping would write it into every "
                "weight; the step was refused before any parameter changed",
            )


ADVICE = "use engine.backward(loss_sum, num_items=valid_tokens) for the exact token mean"


class TokenMeans:
    """ACL308: token means averaged over a window (and ranks) with very different token counts.

    Each backward's mean-reduced NLL node gives that micro-batch's valid-token count T_i (a
    tensor, no host read); at the sync step the counts of all ranks are gathered and the bias
    max_i |mean(T) / T_i - 1| is reported above `token_bias` (the guard's option, default 0.25).
    """

    def __init__(self) -> None:
        self._counts: list[torch.Tensor] = []
        self._calls = 0

    def record(self, loss: torch.Tensor) -> None:
        self._calls += 1
        count = _graph.token_mean_count(loss)
        if count is not None:
            self._counts.append(count)

    def check(self, world: int) -> None:
        """Once per sync step. With W > 1 every rank enters the gather, whatever it saw (a
        collective entered by some ranks only would pair with the next one, or hang)."""
        counts, calls = self._counts, self._calls
        self._counts, self._calls = [], 0
        if not _report.enabled("ACL308"):  # the same answer on every rank
            return
        complete = bool(counts) and len(counts) == calls
        if world > 1:
            rows = token_means.gathered_rows(counts if complete else None)
            token_means.judge(rows, world, ADVICE)
        elif complete and len(counts) >= 2:
            token_means.judge([token_means.local_row(counts)], 1, ADVICE)


class OverflowStreak:
    """ACL603: consecutive fp16 steps skipped for inf/NaN, or a collapsed loss scale."""

    def __init__(self) -> None:
        self.consecutive = 0

    def after_step(self, skipped: bool, scaler: Any) -> None:
        if not skipped:
            self.consecutive = 0
            return
        self.consecutive += 1
        streak = int(_report.option("overflow_streak", 20))
        scale = scaler.get_scale()
        if self.consecutive >= streak or scale < 1:
            report(
                "ACL603",
                f"{self.consecutive} optimizer steps in a row were skipped for inf/NaN gradients "
                f"and the loss scale is now {scale:g}: the weights stopped changing while the "
                "loop goes on; look for a loss or layer that overflows at any scale",
            )
