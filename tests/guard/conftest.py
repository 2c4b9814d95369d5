"""Shared fixtures for the guard's own tests (opt-in: nothing here is autouse)."""

from __future__ import annotations

import warnings

import pytest


@pytest.fixture
def guard_on():
    """The guard installed, in raise mode, with no findings; settings restored afterwards."""
    import guard
    from guard import _report

    guard.install()
    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode="raise")
    guard.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.GuardWarning)
        yield guard
    guard.reset()
    _report._state.settings = saved


def codes(guard_module) -> list[str]:
    return sorted(f.code for f in guard_module.findings())
