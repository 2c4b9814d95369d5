"""Constructs from real code on which `bench/crash_free.py` found the linter crashing, reduced
to a few lines each."""

from __future__ import annotations

# torch/_library/custom_ops.py: a module function returning `()`, called like a scheduler
# factory; stripping the parentheses of the empty tuple raised CSTValidationError.
EMPTY_TUPLE_FACTORY = """import torch


def make_schedule(optimizer):
    return ()


def train(model, optimizer, loader):
    schedule = make_schedule(optimizer)
    for batch in loader:
        loss = model(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_a_factory_returning_an_empty_tuple_is_checked(project, invoke):
    (project / "train.py").write_text(EMPTY_TUPLE_FACTORY)
    result = invoke("train.py", "--fix", "--unsafe-fixes")
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == "All checks passed!\n"
