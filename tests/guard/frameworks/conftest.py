"""The guard on the loops of training frameworks (HF Trainer, Lightning): tiny models built from
configs, synthetic data, no downloads. Each test runs with every code selected in warn mode, so a
framework's correct loop must produce no finding at all."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

# The frameworks' correct loops run on every device present (bench/gpu_check.sh: `-k cuda`).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def guard_warn():
    import guard
    from guard import _report

    guard.install()
    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode="warn", select=("ACL",))
    guard.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield guard
    guard.reset()
    _report._state.settings = saved
    if "accelerate" in sys.modules:  # the HF Trainer builds an Accelerator: a process singleton
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
