"""Warn mode as a user reads it: each finding printed once as `path:line: CODE message`, and at
exit a summary grouped by code (count, first step, one line per location): plain text for logs,
a rich table on a terminal."""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import torch

from guard import _voice

HERE = __file__


def _line_of(marker: str) -> int:
    lines = Path(HERE).read_text(encoding="utf-8").splitlines()
    return 1 + next(i for i, line in enumerate(lines) if line.endswith(f"# {marker}"))


def _two_ungated_schedulers(windows: int) -> list[int]:
    """K=2 with two schedulers stepped on every micro-batch: ACL305 at two lines, repeatedly.
    Returns the optimizer step at which each micro-batch ran."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, 0.5, total_iters=4)
    decay = torch.optim.lr_scheduler.StepLR(opt, 2)
    steps = []
    for i in range(2 * windows):
        (model(torch.randn(2, 4)).sum() / 2).backward()
        if (i + 1) % 2 == 0:
            opt.step()
            opt.zero_grad()
        steps.append((i + 1) // 2)
        warmup.step()  # first-sched
        decay.step()  # second-sched
    return steps


def test_each_finding_is_printed_once_in_the_linters_shape(guard_mode):
    guard = guard_mode("warn")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default", guard.GuardWarning)
        _two_ungated_schedulers(windows=3)
    printed = [  # as Python prints a warning, with the format the guard installed
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line).rstrip("\n")
        for w in shown
        if issubclass(w.category, guard.GuardWarning)
    ]
    where = os.path.relpath(HERE)
    assert [line.split(" ACL305 ")[0] for line in printed] == [
        f"{where}:{_line_of('first-sched')}:",
        f"{where}:{_line_of('second-sched')}:",
    ]
    assert all(line.endswith("(accel-lint --explain ACL305)") for line in printed)
    assert all("\n" not in line and "GuardWarning" not in line for line in printed)
    assert sorted(f.count for f in guard.findings()) == [3, 3]  # every ungated micro-step


def test_the_plain_summary_groups_by_code(guard_mode):
    guard = guard_mode("warn")
    _two_ungated_schedulers(windows=3)
    findings = guard.findings()
    stream = io.StringIO()
    _voice.print_summary(findings, stream)  # a StringIO is no terminal: plain text
    lines = stream.getvalue().splitlines()
    where = os.path.relpath(HERE)
    total = sum(f.count for f in findings)
    assert lines[0] == f"accel-guard summary: {total} finding(s) of 1 code(s) at 2 location(s)"
    first_step = min(f.step for f in findings)
    assert lines[1] == f"ACL305 ungated-scheduler-step: {total}x, first at step {first_step}"
    by_line = {f.location: f for f in findings}
    for text, marker in zip(lines[2:], ("first-sched", "second-sched"), strict=True):
        f = by_line[f"{HERE}:{_line_of(marker)}"]
        assert text.startswith(f"  {where}:{_line_of(marker)}: {f.count}x from step {f.step}: ")
        assert "accel-lint --explain" not in text  # the fix and the pointer stay in the report
    assert len(lines) == 4


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_rich_table(guard_mode):
    guard = guard_mode("warn")
    _two_ungated_schedulers(windows=2)
    stream = _Terminal()
    _voice.print_summary(guard.findings(), stream)
    text = stream.getvalue()
    assert "accel-guard summary" in text and "\x1b[" in text  # styled for the terminal
    assert "┃" in text or "│" in text  # drawn as a table
    for marker in ("first-sched", "second-sched"):
        assert f":{_line_of(marker)}" in text
    assert text.count("ACL305") == 1  # one group row for the code
