"""Two projects linted in one run: each file reads its own project's modules, and the walk
for callers stays inside each project (never their common parent)."""

from __future__ import annotations

import textwrap

from linter import project
from linter.analysis import analyze_source

ENGINE = """
import torch


def train_one_epoch(model, data_loader, optimizer, update_freq):
    for step, (samples, targets) in enumerate(data_loader):
        loss = torch.nn.functional.cross_entropy(model(samples), targets)
        (loss / update_freq).backward()
        if (step + 1) % update_freq == 0:
            optimizer.step()
            optimizer.zero_grad()
"""

MAIN = """
import torch

from engine import train_one_epoch


def main(model, loader, optimizer, args):
    model = torch.nn.parallel.DistributedDataParallel(model)
    train_one_epoch(model, loader, optimizer, args.update_freq)
"""


def _tree(root, files):
    (root / "pyproject.toml").parent.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))


def test_each_project_reads_its_own_modules_and_walks_only_itself(tmp_path, monkeypatch):
    wrapped, plain = tmp_path / "wrapped", tmp_path / "plain"
    _tree(wrapped, {"engine.py": ENGINE, "main.py": MAIN})
    _tree(plain, {"engine.py": ENGINE, "main.py": MAIN.replace(
        "    model = torch.nn.parallel.DistributedDataParallel(model)\n", "")})  # fmt: skip
    (tmp_path / "stray.py").write_text("from engine import train_one_epoch\n")
    walked = []
    real_walk = __import__("os").walk

    def walk(top, *args, **kwargs):
        walked.append(str(top))
        return real_walk(top, *args, **kwargs)

    monkeypatch.setattr("linter.project.context.os.walk", walk)
    found = project.for_paths([wrapped, plain], [])
    project.enable(found)
    try:
        codes = {"ACL401"}
        in_wrapped = analyze_source(ENGINE, str(wrapped / "engine.py"), codes)
        in_plain = analyze_source(ENGINE, str(plain / "engine.py"), codes)
    finally:
        project.enable(None)
    # the DDP wrap in wrapped/main.py reaches wrapped/engine.py only
    assert [(d.code, d.start.line) for d in in_wrapped] == [("ACL401", 7)]
    assert in_plain == []
    assert sorted(walked) == sorted([str(wrapped), str(plain)])
