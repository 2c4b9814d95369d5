"""A small fake rule set injected in place of the real analysis, so the machinery is tested alone.

ACL101: every `loss.backward()` call; safe fix -> `accelerator.backward(loss)`.
ACL303: every `clip_grad_norm_(`; unsafe fix that prefixes `# ` (comments the line out).
Invalid Python raises ParseFailure with the compiler's line and 0-based column.
"""

from __future__ import annotations

import re

import pytest

from linter import analysis
from linter.types import Diagnostic, Edit, Fix, Position

BACKWARD = re.compile(r"loss\.backward\(\)")
CLIP = re.compile(r"clip_grad_norm_\(")


def fake_analyze(source: str, path: str, codes) -> list[Diagnostic]:
    try:
        compile(source, path, "exec")
    except SyntaxError as exc:
        raise analysis.ParseFailure(
            exc.msg, exc.lineno or 1, max(0, (exc.offset or 1) - 1)
        ) from None
    found = []
    # A commented-out line is never flagged (so the ACL303 fix converges).
    for number, line in enumerate(re.split(r"\r\n|\r|\n", source), start=1):
        for match in BACKWARD.finditer(line) if "ACL101" in codes else ():
            start, end = Position(number, match.start()), Position(number, match.end())
            edit = Edit(start, end, "accelerator.backward(loss)")
            fix = Fix("safe", "Use `accelerator.backward(loss)`", (edit,))
            found.append(Diagnostic("ACL101", "raw backward", path, start, end, fix))
        if line.lstrip().startswith("#"):
            continue
        for match in CLIP.finditer(line) if "ACL303" in codes else ():
            start, end = Position(number, match.start()), Position(number, match.end())
            indent = len(line) - len(line.lstrip())
            edit = Edit(Position(number, indent), Position(number, indent), "# ")
            fix = Fix("unsafe", "Comment out the clip", (edit,))
            found.append(Diagnostic("ACL303", "clip per micro-step", path, start, end, fix))
    return found


@pytest.fixture
def fake_rules(monkeypatch):
    """Replace the analysis with the fake; returns a list that records every analysed path."""
    calls: list[str] = []

    def recording(source, path, codes, cache=None):
        calls.append(path)
        return fake_analyze(source, path, codes)

    monkeypatch.setattr(analysis, "analyze_source", recording)
    return calls


@pytest.fixture
def project(tmp_path, monkeypatch):
    """An empty project directory (with its own pyproject) as the working directory."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def invoke():
    """Run the CLI in-process (so the fake rules apply); returns typer's Result."""
    from typer.testing import CliRunner

    from linter.cli import app

    def run(*args: str):
        return CliRunner().invoke(app, list(args))

    return run
