"""Fixtures for the guard's voice: the guard installed with every check, findings and the run
report's series reset, the settings restored afterwards."""

from __future__ import annotations

import warnings

import pytest


@pytest.fixture
def guard_mode(request):
    """`guard_mode("raise")` / `("warn")`: installed, all codes selected, no findings yet."""
    import guard
    from guard import _report

    saved = _report._state.settings
    guard.uninstall()  # a fresh tracker: what earlier tests prepared is not this run's
    guard.install()

    def set_mode(mode: str, report_path: str | None = None):
        _report._state.settings = _report._Settings(mode=mode, report_path=report_path)
        if report_path:
            _report._start_recording()
        guard.reset()
        return guard

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.GuardWarning)
        yield set_mode
    guard.reset()
    _report._state.settings = saved
