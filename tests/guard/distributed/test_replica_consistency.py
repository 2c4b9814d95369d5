"""ACL405's replica-consistency check across 2 gloo processes (CPU), in warn mode so each loop
trains on: every mechanism that makes data-parallel replicas drift apart is reported with its
cause, the replicas really differ (their parameters compared across ranks), and correct loops
report nothing. One subprocess runs every case on both ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests/guard, for the two-rank runner
from two_ranks import run_two_ranks  # noqa: E402

DRIFT = "the data-parallel replicas' weights differ across ranks"
WINDOW = "none ran after a DDP forward with gradient sync on"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    results = tmp_path_factory.mktemp("replica-results")
    worker = HERE / "replica_worker.py"
    return run_two_ranks(worker, results, env={"ACCEL_DIST_RESULTS": str(results)})


def _only_acl405(ranks, case: str) -> list[dict]:
    """The case's single ACL405 finding on each rank (both ranks judge the same numbers)."""
    found = []
    for row in ranks:
        codes = [f["code"] for f in row[case]["findings"]]
        assert codes == ["ACL405"], (case, row[case]["findings"])
        found.append(row[case]["findings"][0])
    return found


@pytest.mark.parametrize("case", ["correct", "rewrapped_every_run", "batchnorm_convnet"])
def test_correct_ddp_loops_report_nothing(ranks, case):
    for row in ranks:
        assert row[case] == {"findings": [], "replicas_equal": True}


def test_weights_shared_by_every_rank_are_not_replicas_that_differ(ranks):
    """A model handed to mp.spawn lives in shared memory: both ranks train one tensor, so the
    replicas are equal (there is one), and a checksum read while the other rank steps it must
    not say they differ (it did in most runs before the check left shared memory out)."""
    for row in ranks:
        assert row["spawn_handed_models"] == {"findings": [], "replicas_equal": True}


def test_a_single_step_after_a_cast_after_wrapping_is_reported(ranks):
    """The first step's comparison is read at once: a program that ends after one step still
    gets the finding, and the cast gave each rank tensors of its own to compare."""
    case = "cast_after_wrapping_single_step"
    for finding, row in zip(_only_acl405(ranks, case), ranks, strict=True):
        assert not row[case]["replicas_equal"]
        assert finding["message"].startswith(
            f"{DRIFT} after optimizer step 1 (they agreed before the first step)"
        )
        assert (
            "4 parameter(s) of the wrapped model got new tensors after wrapping"
            in (finding["message"])
        )
        assert finding["count"] == 1


def test_a_comparison_at_the_last_step_is_judged_at_exit(ranks):
    """The check at the run's last step has no later step to be read at: the exit reads it."""
    case = "drift_at_the_last_step"
    for finding, row in zip(_only_acl405(ranks, case), ranks, strict=True):
        assert not row[case]["replicas_equal"]
        assert finding["message"].startswith(
            f"{DRIFT} after optimizer step 6 (they agreed after step 1)"
        )
        assert "not seen by the guard" in finding["message"]


def test_parameters_ddp_ignores_may_differ(ranks):
    """A head left out of DDP on purpose (`parameters_to_ignore`) differs across ranks, and that
    is not reported: only what DDP keeps equal is compared."""
    for row in ranks:
        assert row["ignored_head_local_on_purpose"] == {"findings": [], "replicas_equal": False}


@pytest.mark.parametrize(
    ("case", "when", "cause"),
    [
        (
            "dtype_round_trip",
            "after optimizer step 1 (they agreed before the first step)",
            "4 parameter(s) of the wrapped model got new tensors after wrapping",
        ),
        (
            "params_replaced",
            "after optimizer step 1 (they agreed before the first step)",
            "2 trainable parameter(s) were put into the model after wrapping",
        ),
        (
            "no_initial_broadcast",
            "before the first optimizer step",
            "the initial weights were not broadcast",
        ),
    ],
)
def test_drift_the_step_checks_cannot_see_is_reported_with_its_cause(ranks, case, when, cause):
    """The forward went through the wrapper with sync on, so only the checksum sees these."""
    for finding, row in zip(_only_acl405(ranks, case), ranks, strict=True):
        assert not row[case]["replicas_equal"]
        assert finding["message"].startswith(f"{DRIFT} {when}")
        assert cause in finding["message"]
        assert finding["count"] == 1  # reported once, then the check stops


@pytest.mark.parametrize(
    ("case", "unsynced_steps"),
    [("sync_flag_left_false", 6), ("fresh_wrapper_on_some_paths", 3)],
)
def test_drift_joins_the_step_finding_of_the_same_cause(ranks, case, unsynced_steps):
    """The per-step check reports every step that followed no synced forward; the checksum's
    confirmation lands on the same finding (same code and line: one root cause, one finding),
    so the count is one more than the unsynced steps."""
    for finding, row in zip(_only_acl405(ranks, case), ranks, strict=True):
        assert not row[case]["replicas_equal"]
        assert WINDOW in finding["message"]
        assert finding["count"] == unsynced_steps + 1


REPEATS = 5  # runs of each race-prone case in one more launch (about 12 CPU seconds)
RACE_PRONE = (
    "spawn_handed_models",
    "correct",
    "batchnorm_convnet",
    "cast_after_wrapping_single_step",
)


@pytest.fixture(scope="module")
def repeated(tmp_path_factory) -> list[dict]:
    results = tmp_path_factory.mktemp("replica-repeats")
    env = {"ACCEL_DIST_RESULTS": str(results), "ACCEL_REPLICA_REPEAT": str(REPEATS)}
    return run_two_ranks(HERE / "replica_worker.py", results, *RACE_PRONE, env=env)


@pytest.mark.parametrize("run", range(REPEATS))
def test_every_run_gives_the_same_verdicts(repeated, run):
    """The replica check used to cry wolf in some runs only (a checksum racing another rank's
    step): the spawn-handed loop, the BatchNorm loop checked at every step and the single-step
    drift run again and again, and every run gives the same verdict on both ranks."""
    key = "" if run == 0 else f"/{run}"
    for row in repeated:
        for case in ("spawn_handed_models", "correct", "batchnorm_convnet"):
            assert row[case + key] == {"findings": [], "replicas_equal": True}
        drift = row["cast_after_wrapping_single_step" + key]
        assert [f["code"] for f in drift["findings"]] == ["ACL405"]
        assert drift["findings"][0]["count"] == 1
        assert not drift["replicas_equal"]
