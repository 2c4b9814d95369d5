"""Shared fixtures for the guard's own tests (opt-in: nothing here is autouse)."""

from __future__ import annotations

import warnings

import pytest

# The codes whose checks these tests exercise; the other checks have their own tests and the
# fixture cross-check, so a loop written to probe one code is not judged by every check.
E2_CODES = (
    "ACL101 ACL102 ACL103 ACL104 ACL105 ACL106 ACL107 ACL108 ACL201 ACL202 ACL204 ACL601 ACL602 "
    "ACL603"
).split()


@pytest.fixture
def guard_on():
    """The guard installed, in raise mode, selecting `E2_CODES`, with no findings yet; the
    previous settings are restored afterwards."""
    import guard
    from guard import _report

    guard.uninstall()  # a fresh tracker: objects earlier tests left alive are not this test's
    guard.install()
    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode="raise", select=tuple(E2_CODES))
    guard.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.GuardWarning)
        yield guard
    guard.reset()
    _report._state.settings = saved


def codes(guard_module) -> list[str]:
    return sorted(f.code for f in guard_module.findings())
