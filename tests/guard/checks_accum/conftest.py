"""Accelerate singletons reset between the ACL3xx-5xx runtime-check tests."""

from __future__ import annotations

import sys
import warnings

import pytest


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; every test starts from a clean slate."""
    yield
    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()


@pytest.fixture
def guard_on():
    """The guard installed in raise mode with every check selected (a must-not-flag loop must
    not trip any code), no findings yet; the previous settings are restored afterwards."""
    import guard
    from guard import _report

    guard.install()
    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode="raise", select=("ACL",))
    guard.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.GuardWarning)
        yield guard
    guard.reset()
    _report._state.settings = saved
