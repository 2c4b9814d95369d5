"""The pre-commit hook as pre-commit runs it: the yaml's entry with `--fix` and the staged files."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HOOKS = Path(__file__).resolve().parents[3] / ".pre-commit-hooks.yaml"
BAD = """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for x, y in dl:
    with accelerator.accumulate(model):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
"""


def hook() -> dict[str, str]:
    """The accel-lint hook's scalar keys, read with a regex (pre-commit is not a dependency)."""
    text = HOOKS.read_text()
    assert re.search(r"^- id: accel-lint$", text, re.M)
    return dict(re.findall(r"^  (\w+): (.+)$", text, re.M))


def test_hook_declaration():
    declared = hook()
    assert declared["entry"] == "accel-lint"
    assert declared["language"] == "python"
    assert declared["types"] == "[python]"
    assert declared["require_serial"] == "false"


@pytest.fixture
def repo(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "train.py").write_text(BAD)
    (tmp_path / "notes.py").write_text("print('no training here')\n")
    git("add", "train.py", "notes.py")
    return tmp_path


def run_hook(repo: Path, *files: str) -> subprocess.CompletedProcess:
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    command = [hook()["entry"], "--fix", *files]
    return subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)


def test_hook_fixes_the_staged_file(repo):
    result = run_hook(repo, "train.py", "notes.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (repo / "train.py").read_text() == BAD.replace(
        "loss.backward()", "accelerator.backward(loss)"
    )
    assert "Fixed 1 error." in result.stderr
    second = run_hook(repo, "train.py", "notes.py")
    assert second.returncode == 0 and "Fixed" not in second.stderr


def test_hook_fails_on_what_it_cannot_fix(repo):
    (repo / "train.py").write_text("loss.backward(\n")
    result = run_hook(repo, "train.py")
    assert result.returncode == 1
    assert "train.py:1:" in result.stdout and "ACL000" in result.stdout
