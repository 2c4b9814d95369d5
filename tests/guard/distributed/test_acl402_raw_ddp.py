"""ACL402 in raw DDP loops under `torchrun -m guard` (gloo, 2 CPU processes, warn mode): a loss
divided by the world size on its way to a DDP model's backward is one warning at the division's
line, and the run really trains on 1/W of the gradient (its weights equal a single-process
reference trained on both ranks' batches with the extra 1/W). The catalogue's must-not-flag
loops report nothing and train like their reference. One torchrun launch runs every case on
both ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WORKER = HERE / "world_size_worker.py"


def _marked_lines(marker: str = "# W-division") -> dict[str, int]:
    """The worker's case function -> the line of its marked division."""
    found, case = {}, None
    for number, text in enumerate(WORKER.read_text(encoding="utf-8").splitlines(), start=1):
        if text.startswith("def "):
            case = text[4 : text.index("(")]
        if text.rstrip().endswith(marker):
            found[case] = number
    return found


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    results = tmp_path_factory.mktemp("world-size-results")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        ACCEL_GUARD="warn",
        ACCEL_DIST_RESULTS=str(results),
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    command = [*torchrun, "--standalone", "--nproc-per-node", "2", "-m", "guard", str(WORKER)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    rows = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(results.glob("rank*.json"))]
    assert [row["rank"] for row in rows] == [0, 1], done.stderr[-3000:]
    return rows


@pytest.mark.parametrize("case", ["divided_by_world_size", "accumulation_divided_by_k_and_w"])
def test_a_loss_divided_by_the_world_size_warns_once_at_the_division(ranks, case):
    line = _marked_lines()[case]
    for row in ranks:
        [finding] = row[case]["findings"]
        assert (finding["code"], finding["level"], finding["count"]) == ("ACL402", "warning", 1)
        assert finding["location"] == f"{WORKER}:{line}"
        assert row[case]["matches_reference"]  # the weights of a run whose gradients are 1/W


@pytest.mark.parametrize(
    "case",
    [
        "correct",
        "logged_average",
        "accumulation_divided_by_k_equal_to_w",
        "manual_gradient_sum",
        "comm_hook_that_sums",
        "global_token_normalisation",
        "two_terms_averaged",
    ],
)
def test_must_not_flag(ranks, case):
    for row in ranks:
        assert row[case] == {"findings": [], "matches_reference": True}
