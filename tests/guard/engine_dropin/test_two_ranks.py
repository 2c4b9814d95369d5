"""guard.Engine's process methods next to Accelerate's on 2 gloo processes (one worker run,
see dropin_worker.py): same values on each rank, same files, same order of processes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/guard, for the two-rank runner
from two_ranks import run_two_ranks  # noqa: E402

LIBS = ("engine", "accelerate")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[list[dict], Path]:
    results = tmp_path_factory.mktemp("dropin-results")
    rows = run_two_ranks(
        HERE / "dropin_worker.py", results, env={"ACCEL_DIST_RESULTS": str(results)}
    )
    return rows, results


@pytest.mark.parametrize("rank", [0, 1])
def test_who_and_where_answers_as_accelerate(run, rank):
    row = run[0][rank]
    mine, reference = (dict(row[lib]["identity"]) for lib in LIBS)
    assert mine.pop("state")[:2] == reference.pop("state")[:2] == [2, rank]
    assert mine == reference
    assert mine["distributed_type"] == "MULTI_CPU" and mine["is_main_process"] == (rank == 0)


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("case", ["splits", "trigger", "on_main"])
def test_process_helpers_return_what_accelerate_returns(run, rank, case):
    row = run[0][rank]
    assert row["engine"][case] == row["accelerate"][case]


def test_split_padding_and_trigger_values(run):
    rows = run[0]
    assert [r["engine"]["splits"]["list_True"] for r in rows] == [["A", "B"], ["C", "C"]]
    assert [r["engine"]["splits"]["one_False"] for r in rows] == [["only"], []]
    assert [r["engine"]["trigger"] for r in rows] == [[True, False], [True, False]]
    assert [r["engine"]["on_main"] for r in rows] == [[0, 0, None, None], [None, None, 1, 1]]


@pytest.mark.parametrize("rank", [0, 1])
def test_padding_and_reductions_match_accelerate(run, rank):
    mine, reference = (dict(run[0][rank][lib]["pads"]) for lib in LIBS)
    # Accelerate documents reduction="none" as "no operation" but sums under MULTI_CPU; the
    # engine does what the documentation says and returns this rank's own values.
    assert mine.pop("none")["tensor"] == [rank + 1.0, 2.0 * rank]
    assert reference.pop("none")["tensor"] == [3.0, 2.0]
    assert mine == reference
    assert mine["pad_end"]["tensor"][-1] == ([-1.0, -1.0] if rank == 0 else [4.0, 5.0])


def test_main_process_first_lets_rank_0_finish_the_block_first(run):
    results = run[1]
    logs = [(results / f"{lib}_order.log").read_text().splitlines() for lib in LIBS]
    assert logs[0] == logs[1]
    for block in ("main_process_first", "local_main_process_first"):
        order = [line.removeprefix(block + " ") for line in logs[0] if line.startswith(block)]
        assert order == ["0 enter", "0 leave", "1 enter", "1 leave"]


def test_save_state_writes_accelerates_files_plus_one_engine_file_per_rank(run):
    rows = run[0]
    for row in rows:
        extra = sorted(set(row["engine"]["files"]) - set(row["accelerate"]["files"]))
        assert extra == ["guard_engine_0.pt", "guard_engine_1.pt"]
        assert set(row["accelerate"]["files"]) <= set(row["engine"]["files"])


def test_ddp_run_resumed_mid_window_ends_as_the_uninterrupted_one(run):
    assert [r["resume"] for r in run[0]] == [{"equal": True, "steps": 3}] * 2


def test_trackers_run_on_the_main_process_only_and_end_the_group(run):
    rows = run[0]
    expected = ["start", ["config", {"lr": 0.1}], ["log", {"loss": 1.5}, 3], "finish"]
    assert [r["engine"]["tracker"] for r in rows] == [expected, []]
    assert [r["accelerate"]["tracker"] for r in rows] == [expected, []]
    assert [r["group_after_end"] for r in rows] == [False, False]
