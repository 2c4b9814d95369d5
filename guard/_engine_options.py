"""Accelerator(...)'s constructor arguments, read by `guard.Engine` so a script can swap classes.

`cpu=`, `mixed_precision=None` (the `ACCELERATE_MIXED_PRECISION` environment variable, as
Accelerate), `project_dir=` / `project_config=`, `log_with=`, `dataloader_config=` and
`kwargs_handlers=` (GradScaler, profiler and DDP settings) are honoured; arguments that select a
feature the engine does not have raise NotImplementedError (see `_engine_unsupported`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from guard import _engine_unsupported as unsupported

# Accelerator arguments with no effect on what this engine computes (placement is always on).
_IGNORED = {"device_placement", "rng_types", "step_scheduler_with_optimizer", "dynamo_backend"}


@dataclass
class ProjectConfiguration:
    """Accelerate's `ProjectConfiguration` fields, for when accelerate is not installed."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | None = None) -> None:
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir


class AccelerateOptions:
    """The constructor half of the drop-in: what `Engine.__init__` hands over and keeps."""

    def _adopt_accelerate_options(
        self, mixed_precision: Any, device: Any, options: dict[str, Any]
    ) -> tuple[str, Any]:
        """Normalised (mixed_precision, device); the other options are kept on the engine."""
        options = dict(options)
        for name in list(options):
            unsupported.unsupported_option(name, options[name])
        if mixed_precision is None:
            mixed_precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        mixed_precision = str(getattr(mixed_precision, "value", mixed_precision))
        if mixed_precision == "fp8":
            raise unsupported.fp8_precision()
        if options.pop("cpu", False):
            device = "cpu"
        if device is not None and torch.device(device).type == "xla":
            raise unsupported.tpu_device()
        self._project_config(options.pop("project_dir", None), options.pop("project_config", None))
        self.log_with = options.pop("log_with", None)
        self._kwargs_handlers = list(options.pop("kwargs_handlers", None) or [])
        self._dataloader_config = options.pop("dataloader_config", None)
        _refuse_dataloader_config(self._dataloader_config)
        _refuse_other_plugins(options)
        unknown = sorted(set(options) - _IGNORED)
        if unknown:
            raise TypeError(f"guard.Engine got unexpected keyword arguments {unknown}")
        return mixed_precision, device

    def _finish_accelerate_options(self) -> None:
        """After the engine's own setup: split_batches, scaler settings, DDP handler checks."""
        config = self._dataloader_config
        if config is not None and getattr(config, "split_batches", False):
            self.split_batches = True
        scaler_kwargs = self._handler("GradScalerKwargs")
        if scaler_kwargs is not None and self.scaler is not None:
            self.scaler = torch.amp.GradScaler(self.device.type, **scaler_kwargs.to_kwargs())
        ddp = self._handler("DistributedDataParallelKwargs")
        if ddp is not None and self.num_processes > 1 and ddp.to_kwargs():
            raise NotImplementedError(
                "guard.Engine does not apply DistributedDataParallelKwargs; wrap the model in "
                "DistributedDataParallel(model, ...) yourself (and register_comm_hook on it) "
                "before prepare: the engine keeps a model you wrapped"
            )
        self.trackers: list[Any] = []
        self.flag_tensor: torch.Tensor | None = None

    def _project_config(self, project_dir: Any, config: Any) -> None:
        if config is None:
            config = _new_project_configuration(project_dir)
        if project_dir is not None and config.project_dir is None:
            config.set_directories(str(project_dir))
        self.project_configuration = config

    def _handler(self, class_name: str) -> Any:
        """The kwargs handler of that Accelerate class, or None (matched by name: no import)."""
        for handler in self._kwargs_handlers:
            if type(handler).__name__ == class_name:
                return handler
        return None

    # ---------------------------------------------------------------- Accelerate's properties
    @property
    def gradient_accumulation_steps(self) -> int:
        return self._accumulation_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        """Settable, as in Accelerate (find_executable_batch_size retries change it)."""
        if steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, not {steps}")
        self._accumulation_steps = steps
        window = self.__dict__.get("_window")
        if window is not None:
            window.num_steps = steps

    @property
    def step(self) -> int:
        """Accelerate's micro-step counter (the window's; saved in random_states_<rank>.pkl)."""
        return self._window.step

    @step.setter
    def step(self, value: int) -> None:
        self._window.step = value

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        return self.project_configuration.iteration

    @property
    def even_batches(self) -> bool:
        return True

    @contextlib.contextmanager
    def profile(self, profile_handler: Any = None) -> Iterator[Any]:
        """torch.profiler around the block; a chrome trace per process when the handler asks."""
        handler = profile_handler or self._handler("ProfileKwargs")
        profiler = handler.build() if handler is not None else torch.profiler.profile()
        with profiler:
            yield profiler
        trace_dir = getattr(handler, "output_trace_dir", None)
        if trace_dir is None:
            return
        os.makedirs(trace_dir, exist_ok=True)
        profiler.export_chrome_trace(os.path.join(trace_dir, f"profile_{self.process_index}.json"))
        self.wait_for_everyone()


def _new_project_configuration(project_dir: Any) -> Any:
    """Accelerate's class when it is importable (scripts may set its fields), else ours."""
    try:
        from accelerate.utils import ProjectConfiguration as Accelerates
    except ImportError:
        return ProjectConfiguration(project_dir=project_dir)
    return Accelerates(project_dir=project_dir)


def _refuse_dataloader_config(config: Any) -> None:
    """Loader settings the prepared loaders cannot honour raise instead of being ignored."""
    if config is None:
        return
    refused = {
        "dispatch_batches": bool(getattr(config, "dispatch_batches", None)),
        "even_batches=False": getattr(config, "even_batches", True) is False,
        "use_stateful_dataloader": bool(getattr(config, "use_stateful_dataloader", False)),
    }
    named = [name for name, on in refused.items() if on]
    if named:
        raise NotImplementedError(
            f"guard.Engine's prepared loaders do not support {', '.join(named)}: they shard "
            "map-style loaders evenly; resume mid-epoch with skip_first_batches"
        )


def _refuse_other_plugins(options: dict[str, Any]) -> None:
    for name in ("gradient_accumulation_plugin", "dynamo_plugin"):
        if options.pop(name, None) is not None:
            raise NotImplementedError(
                f"guard.Engine does not take Accelerate's {name}: pass "
                "gradient_accumulation_steps= directly, and torch.compile the model yourself"
            )
