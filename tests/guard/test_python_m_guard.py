"""`python -m guard` as users run it: a real subprocess (each costs a torch import, so few)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BAD_102 = ROOT / "fixtures" / "ACL102" / "bad_raw_amp_plain_step.py"


def _run(args: list[str], mode: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "ACCEL_GUARD": mode, **env}
    environ.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "guard", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_raise_mode_stops_an_unmodified_script_at_the_users_line(tmp_path):
    proc = _run([str(BAD_102)], "raise", tmp_path)
    assert proc.returncode != 0
    line = _step_line(BAD_102)  # the optimizer.step() line
    assert f"guard.GuardError: {BAD_102.relative_to(ROOT)}:{line}: ACL102 " in proc.stderr


def _step_line(path: Path) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    return 1 + next(i for i, line in enumerate(lines) if line.strip() == "optimizer.step()")


SPAWNING_SCRIPT = """
import sys
import torch
import torch.multiprocessing as mp
from torch.nn.utils import clip_grad_norm_   # bound by name before any guard import


def clip_scaled(rank):
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: F841
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(torch.randn(2, 4)).sum()).backward()
    clip_grad_norm_(model.parameters(), 1.0)          # child: ACL104


if __name__ == "__main__":
    assert sys.argv[1:] == ["--epochs", "1"]
    clip_scaled(0)                                     # parent: ACL104
    mp.spawn(clip_scaled, nprocs=1)
"""


def test_warn_mode_covers_imported_names_and_spawned_children(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SPAWNING_SCRIPT))
    report = tmp_path / "findings.json"
    proc = _run([str(script), "--epochs", "1"], "warn", tmp_path, ACCEL_GUARD_REPORT=str(report))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(report.read_text())["findings"]
    assert sorted(r["code"] for r in rows) == ["ACL104", "ACL104"]  # parent and child
    assert {r["location"] for r in rows} == {f"{script}:13"}
    assert "accel-guard summary" in proc.stderr and "ACL104" in proc.stderr


def test_explain_prints_the_shared_catalogue_text(capsys):
    from guard.__main__ import main
    from rules import ALL_RULES

    assert main(["--explain", "ACL101"]) == 0
    assert ALL_RULES["ACL101"].summary in capsys.readouterr().out


def test_a_missing_script_gets_pythons_own_message_and_exit_2(tmp_path):
    missing = tmp_path / "missing.py"
    python = subprocess.run([sys.executable, str(missing)], capture_output=True, text=True)
    proc = _run([str(missing)], "raise", tmp_path)
    assert (proc.returncode, python.returncode) == (2, 2)
    assert proc.stderr.strip() == python.stderr.strip()
    assert "Traceback" not in proc.stderr


def test_a_missing_module_is_one_line_and_exit_1(tmp_path):
    proc = _run(["-m", "no_such_package.train"], "raise", tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith(": No module named no_such_package.train")
    assert "Traceback" not in proc.stderr


def test_an_unwritable_report_path_is_said_at_start_and_the_summary_still_comes(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    report = blocker / "sub" / "run.html"  # its folder cannot exist: a file is in the way
    proc = _run([str(BAD_102)], "warn", tmp_path, ACCEL_GUARD_REPORT=str(report))
    assert proc.returncode == 0
    assert f"accel-guard: no run report will be written to {report}: cannot create" in proc.stderr
    assert "accel-guard summary" in proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_report_folder_that_does_not_exist_yet_is_made(tmp_path):
    report = tmp_path / "new" / "folder" / "run.json"
    proc = _run([str(BAD_102)], "warn", tmp_path, ACCEL_GUARD_REPORT=str(report))
    assert proc.returncode == 0, proc.stderr
    assert "ACL102" in {finding["code"] for finding in json.loads(report.read_text())["findings"]}


def test_a_closed_pipe_ends_explain_quietly():
    from rules import ALL_RULES

    command = [sys.executable, "-m", "guard", "--explain", *ALL_RULES]  # more than a pipe holds
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # as `| head -c 10` does
    _, stderr = proc.communicate(timeout=60)
    assert b"BrokenPipeError" not in stderr and b"Traceback" not in stderr
