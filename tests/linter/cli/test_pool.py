"""Many files go through a process pool and give the same results as a sequential run."""

from linter import runner
from linter.config import Overrides, Resolver
from linter.discovery import discover


def test_pool_matches_sequential(project, fake_rules, monkeypatch):
    for index in range(6):
        body = "for b in dl:\n" + "    loss.backward()\n" * (index + 1)
        (project / f"train_{index}.py").write_text(body)
    files = discover([project], Resolver(Overrides(), cwd=project)).files
    sequential = runner.run(files).diagnostics
    assert len(fake_rules) == 6
    monkeypatch.setattr(runner, "POOL_THRESHOLD", 2)
    pooled = runner.run(files).diagnostics
    assert len(fake_rules) == 6  # the pooled analyses ran in worker processes
    assert pooled == sequential and len(pooled) == 21
