"""ACL401, 404 and 405 with DDP on 2 gloo processes (CPU), in raise mode.

One subprocess runs all three loops on both ranks (starting a process group costs seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/guard, for the two-rank runner
from two_ranks import run_two_ranks  # noqa: E402


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    results = tmp_path_factory.mktemp("ddp-results")
    worker = HERE / "ddp_accum_worker.py"
    return run_two_ranks(worker, results, env={"ACCEL_DDP_RESULTS": str(results)})


def test_acl405_forward_through_module_raises_before_the_step(ranks):
    for rank in ranks:
        bypass = rank["bypass"]
        assert bypass["raised"] == "ACL405", bypass
        assert bypass["unchanged"]  # the replicas had not diverged yet
        assert "ddp_accum_worker.py:" in bypass["message"]  # the user's line, not the guard's


def test_acl401_missing_no_sync_warns_once_per_window(ranks):
    for rank in ranks:
        [(code, level, message)] = rank["no_sync_missing"]
        assert (code, level) == ("ACL401", "warning")
        assert message.startswith("4 of the 4 micro-batches of this optimizer step all-reduced")
        assert rank["no_sync_used"] == []


def test_acl404_same_epoch_twice_warns_and_set_epoch_is_clean(ranks):
    for rank in ranks:
        assert rank["same_epoch"] == [["ACL404", "warning"]]
        assert rank["set_epoch"] == []


def test_acl404_silent_for_the_ddp_example_peek_before_set_epoch(ranks):
    """`next(iter(loader))` before `set_epoch` starts a pass that never ends: not an epoch."""
    for rank in ranks:
        assert rank["multigpu_peek"] == []
        assert rank["multigpu_peek_no_set_epoch"] == [["ACL404", "warning"]]


def test_ddp_model_under_the_guard_survives_deepcopy_save_and_state_dict(ranks):
    for rank in ranks:
        assert rank["ddp_copies"] == {"same": [True, True, True], "findings": []}
