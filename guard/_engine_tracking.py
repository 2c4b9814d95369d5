"""Experiment tracking for `guard.Engine`: `init_trackers`, `log`, `end_training`, `get_tracker`.

The engine does not implement trackers, it picks a well-kept one for each `log_with` entry:
Accelerate's tracker classes when accelerate is installed (tensorboard, wandb, mlflow, ...,
and custom `GeneralTracker` objects), TensorBoard through `torch.utils.tensorboard` when only
the `tensorboard` package is there, and a JSONL file (`"jsonl"`) as the embedded default:
`log_with="all"` with no other tracker available logs there instead of nowhere. As in
Accelerate, nothing is tracked without `log_with`, and only the main process tracks.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from guard import distributed


class JsonlTracker:
    """One JSON object per `log` call in `<logging_dir>/<project>/metrics.jsonl`."""

    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **_: Any) -> None:
        self.folder = os.path.join(str(logging_dir), run_name)
        self.path = os.path.join(self.folder, "metrics.jsonl")
        self._file: Any = None

    @property
    def tracker(self) -> Any:
        return self._file

    def start(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in finish)

    def store_init_configuration(self, values: dict) -> None:
        path = os.path.join(self.folder, "config.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({k: _plain(v) for k, v in values.items()}, fh, indent=2, sort_keys=True)

    def log(self, values: dict, step: int | None = None, **_: Any) -> None:
        row = {"step": step, **{k: _plain(v) for k, v in values.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardTracker:
    """TensorBoard through torch's SummaryWriter (used when accelerate is not installed)."""

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(str(logging_dir), run_name), **kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def start(self) -> None:
        pass

    def store_init_configuration(self, values: dict) -> None:
        self.writer.add_hparams({k: _plain(v) for k, v in values.items()}, metric_dict={})
        self.writer.flush()

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            value = _plain(value)
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class _Blank:
    """What get_tracker returns off the main process: every call does nothing."""

    tracker = None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Tracking:
    """Mixin: Accelerate's tracking methods, delegating to the trackers chosen by `log_with`."""

    def init_trackers(
        self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None
    ) -> None:
        if not self.is_main_process:
            return
        init_kwargs = init_kwargs or {}
        for choice in _choices(self.log_with):
            if not isinstance(choice, str):  # a tracker object (Accelerate's GeneralTracker)
                self.trackers.append(choice)
                continue
            tracker_class = _tracker_class(choice)
            kwargs = init_kwargs.get(choice, {})
            if tracker_class.requires_logging_directory:
                if self.logging_dir is None:
                    raise ValueError(f"log_with={choice!r} needs project_dir= (a logging folder)")
                self.trackers.append(tracker_class(project_name, self.logging_dir, **kwargs))
            else:
                self.trackers.append(tracker_class(project_name, **kwargs))
        for tracker in self.trackers:
            tracker.start()
        if config is not None:
            for tracker in self.trackers:
                tracker.store_init_configuration(config)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        if not self.is_main_process:
            return
        log_kwargs = log_kwargs or {}
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        if not self.trackers:
            return _Blank()
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        raise ValueError(f"{name} is not an available tracker stored inside the engine.")

    def end_training(self) -> None:
        """Finish the trackers and leave the process group (as Accelerate's)."""
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
        if distributed.is_initialized():
            import torch.distributed as dist

            dist.destroy_process_group()


def _choices(log_with: Any) -> list[Any]:
    """The trackers `log_with` asks for, "all" expanded to those importable here."""
    if log_with is None:
        return []
    wanted = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    names = [str(getattr(w, "value", w)) for w in wanted if isinstance(w, str)]
    objects = [w for w in wanted if not isinstance(w, str)]
    if "all" in names:
        names = _available() or ["jsonl"]
    return objects + list(dict.fromkeys(names))


def _available() -> list[str]:
    if importlib.util.find_spec("accelerate") is not None:
        from accelerate.tracking import get_available_trackers

        return [str(getattr(t, "value", t)) for t in get_available_trackers()]
    return ["tensorboard"] if importlib.util.find_spec("tensorboard") is not None else []


def _tracker_class(name: str) -> Any:
    if name == "jsonl":
        return JsonlTracker
    if importlib.util.find_spec("accelerate") is not None:
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        if name in LOGGER_TYPE_TO_CLASS:
            return LOGGER_TYPE_TO_CLASS[name]
    if name == "tensorboard":
        return TensorBoardTracker
    raise ValueError(
        f"unknown tracker {name!r}: use 'jsonl', 'tensorboard', or install accelerate for "
        "its trackers (wandb, mlflow, comet_ml, aim, ...)"
    )


def _plain(value: Any) -> Any:
    """A one-element tensor (or numpy scalar) becomes its Python number."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "numel", lambda: getattr(value, "size", 1))() == 1:
        return item()
    return value
