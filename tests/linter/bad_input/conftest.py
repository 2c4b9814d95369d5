"""Shared pieces of the bad-input tests: a project directory and the real CLI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The tests import `bad_input_scripts` from here (pytest's importlib mode adds no path).
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def project(tmp_path, monkeypatch):
    """An empty project directory (with its own pyproject) as the working directory."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def invoke():
    """Run the real CLI in-process; returns typer's Result (stdout and stderr apart)."""
    from typer.testing import CliRunner

    from linter.cli import app

    def run(*args: str):
        return CliRunner().invoke(app, [*args, "--no-cache", "--output-format", "concise"])

    return run
