"""The accumulation window: which micro-step we are on and whether this one ends with a sync.

Kept apart from the engine so that Accelerate's counting rules live in one small, testable place:
each `accumulate()` entry is a micro-step, an update step when the count reaches a multiple of K
or the loader yields its last batch, and a tail window of r < K micro-batches is still divided
by K (README, "What the engine does", 2 and 10). Everything here is plain Python state: no
tensors, no syncs.
"""

from __future__ import annotations

from typing import Any


class Window:
    """Micro-step counter for K-step accumulation, with the loader-end forced sync."""

    def __init__(self, num_steps: int):
        if num_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, not {num_steps}")
        self.num_steps = num_steps
        self.step = 0  # micro-steps completed in the current window (Accelerate's `step`)
        self.length = 0  # micro-steps in the current window so far, including the current one
        self.sync_gradients = True
        self.forced = False  # this sync was forced by the end of a prepared loader
        self.in_accumulate = False
        self.optimizer_steps = 0  # real (not skipped) optimizer steps taken
        self.loaders: list[Any] = []  # prepared loaders being iterated, innermost last

    @property
    def end_of_dataloader(self) -> bool:
        return bool(self.loaders) and self.loaders[-1].end_of_dataloader

    def advance(self) -> None:
        """Enter one micro-step: sync when the count reaches K or the active loader is ending."""
        if self.sync_gradients:
            self.length = 0  # the previous micro-step closed a window
        self.length += 1
        self.forced = self.end_of_dataloader
        if self.forced:
            self.step = 0
            self.sync_gradients = True
        else:
            self.step += 1
            self.sync_gradients = self.step % self.num_steps == 0

    @property
    def is_tail(self) -> bool:
        """True on a sync step that closes a window shorter than K (the loader ran out)."""
        return self.sync_gradients and self.forced and self.length < self.num_steps

    def state_dict(self) -> dict[str, Any]:
        return {
            "num_steps": self.num_steps,
            "step": self.step,
            "length": self.length,
            "sync_gradients": self.sync_gradients,
            "forced": self.forced,
            "optimizer_steps": self.optimizer_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_steps"] != self.num_steps:
            raise ValueError(
                f"checkpoint was taken with gradient_accumulation_steps={state['num_steps']}, "
                f"this engine uses {self.num_steps}"
            )
        self.step = state["step"]
        self.length = state["length"]
        self.sync_gradients = state["sync_gradients"]
        self.forced = state["forced"]
        self.optimizer_steps = state["optimizer_steps"]
