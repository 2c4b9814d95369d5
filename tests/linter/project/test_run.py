"""The project analysis in a run: the cache keyed by what a file read from other modules,
`--show-loops` naming where each fact came from, and the bounds (a module that does not parse,
an import cycle, stdin)."""

from __future__ import annotations

import json
import os

import pytest

from linter import analysis, project

ENGINE = """
import torch


def train_one_epoch(model, data_loader, optimizer, update_freq):
    for step, (samples, targets) in enumerate(data_loader):
        loss = torch.nn.functional.cross_entropy(model(samples), targets)
        (loss / update_freq).backward()
        if (step + 1) % update_freq == 0 or step + 1 == len(data_loader):
            optimizer.step()
            optimizer.zero_grad()
"""

MAIN = """
import torch

from engine import train_one_epoch
from util.misc import wrap_model


def main(args):
    model = wrap_model(build_model(args), args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        train_one_epoch(model, loader, optimizer, args.update_freq)
"""

MISC = """
import torch

VERSION = "1.0"


def wrap_model(model, args):
    return model.cuda(args.gpu)


def all_reduce_mean(value):
    return value
"""


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """The CLI in-process in a project directory; returns (run, analysed paths)."""
    from typer.testing import CliRunner

    from linter.cli import app

    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ACCEL_LINT_NO_PROJECT", raising=False)
    analysed: list[str] = []
    real = analysis._analyze

    def recording(source, path, codes, cache):
        analysed.append(os.path.basename(path))
        return real(source, path, codes, cache)

    monkeypatch.setattr(analysis, "_analyze", recording)

    def run(*args: str):
        try:
            return CliRunner().invoke(app, ["--output-format", "concise", *args])
        finally:
            project.enable(None)

    return run, analysed


def _write(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_change_in_an_imported_module_relints_its_importers_only(tmp_path, cli):
    run, analysed = cli
    _write(tmp_path, {"engine.py": ENGINE, "main.py": MAIN, "util/__init__.py": "",
                      "util/misc.py": MISC, "other.py": "loss.backward()\n"})  # fmt: skip
    cold = run("engine.py", "main.py", "other.py")
    assert "ACL401" not in cold.stdout
    assert sorted(analysed) == ["engine.py", "main.py", "other.py"]
    analysed.clear()
    run("engine.py", "main.py", "other.py")
    assert analysed == []  # warm: nothing changed
    # outside the definitions: the summary is the same, nothing is analysed again
    (tmp_path / "util" / "misc.py").write_text(MISC.replace('"1.0"', '"1.1"'))
    run("engine.py", "main.py", "other.py")
    assert analysed == []
    # wrap_model now wraps in DDP: engine.py (whose caller main() uses it) is analysed again;
    # main.py imports it but trains nothing itself (no context is read for it), other.py
    # reads nothing of the project
    wrapped = MISC.replace(
        "    return model.cuda(args.gpu)",
        "    model = model.cuda(args.gpu)\n"
        "    return torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])",
    )
    (tmp_path / "util" / "misc.py").write_text(wrapped)
    warm = run("engine.py", "main.py", "other.py")
    assert sorted(analysed) == ["engine.py"]
    assert "engine.py:7:" in warm.stdout and "ACL401" in warm.stdout


def test_the_project_can_be_switched_off(tmp_path, cli, monkeypatch):
    run, _ = cli
    wrapped = MAIN.replace(
        "    model = wrap_model(build_model(args), args)\n",
        "    model = torch.nn.parallel.DistributedDataParallel(build_model(args))\n",
    )
    _write(tmp_path, {"engine.py": ENGINE, "main.py": wrapped, "util/__init__.py": "",
                      "util/misc.py": MISC})  # fmt: skip
    assert "ACL401" in run("--no-cache", "engine.py").stdout
    monkeypatch.setenv("ACCEL_LINT_NO_PROJECT", "1")
    assert "ACL401" not in run("--no-cache", "engine.py").stdout


def test_show_loops_names_the_other_modules(tmp_path, cli):
    run, _ = cli
    wrapped = MAIN.replace(
        "    model = wrap_model(build_model(args), args)\n",
        "    model = torch.nn.parallel.DistributedDataParallel(build_model(args))\n",
    )
    _write(tmp_path, {"engine.py": ENGINE, "main.py": wrapped, "util/__init__.py": "",
                      "util/misc.py": MISC})  # fmt: skip
    shown = run("--output-format", "json", "--show-loops", "engine.py")
    described = json.loads(shown.stdout)
    (loop,) = described["loops"]
    assert (loop["file"], loop["line"]) == ("engine.py", 6)
    (ddp,) = loop["distributed"]["ddp_models"]
    wrap_line = wrapped.split("\n").index(
        "    model = torch.nn.parallel.DistributedDataParallel(build_model(args))"
    )
    assert (ddp["name"], ddp["file"], ddp["line"]) == ("model", "main.py", wrap_line + 1)
    facts = described["project"]["from_other_modules"]
    assert {(f["definition"], f["file"]) for f in facts} == {("main", "main.py")}


def test_a_module_that_does_not_parse_is_a_note(tmp_path):
    from linter.project.context import Project

    _write(tmp_path, {"pyproject.toml": "", "engine.py": ENGINE,
                      "main.py": MAIN.replace("def main(args):", "def main(args)")})  # fmt: skip
    found = Project(tmp_path)
    path = tmp_path / "engine.py"
    assert found.context(str(path), path.read_text()) is None
    assert found.notes == ["main.py: does not parse (line 8: expected ':'); nothing learnt from it"]


def test_a_byte_order_mark_or_a_coding_cookie_is_read_as_python_reads_it(tmp_path):
    from linter.project.context import Project

    misc = "\ufeff" + MISC.replace("    return model.cuda(args.gpu)", "    return DDP(model)")
    _write(tmp_path, {"pyproject.toml": "", "engine.py": ENGINE, "main.py": MAIN,
                      "util/__init__.py": ""})  # fmt: skip
    (tmp_path / "util" / "misc.py").write_bytes(misc.encode("utf-8"))
    (tmp_path / "util" / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\nNAME = '\xe9'\n")
    found = Project(tmp_path)
    assert found.summary(str(tmp_path / "util" / "misc.py")).definition("wrap_model")
    assert found.summary(str(tmp_path / "util" / "latin.py")).error is None
    assert found.notes == []


def test_the_note_is_printed_once(tmp_path, cli):
    run, _ = cli
    broken = MAIN.replace("def main(args):", "def main(args)")
    _write(tmp_path, {"engine.py": ENGINE, "main.py": broken, "util/__init__.py": "",
                      "util/misc.py": MISC})  # fmt: skip
    result = run("--no-cache", "engine.py")
    assert result.stderr.count("note: main.py: does not parse (line 8: expected ':')") == 1


def test_an_import_cycle_ends(tmp_path):
    from linter.project.context import Project

    first = ENGINE.replace("import torch\n", "import torch\n\nimport second\n") + (
        "\n\ndef helper(model):\n    second.helper(model)\n    return model.no_sync()\n"
    )
    second = (
        "import first\n\n\ndef helper(model):\n    first.helper(model)\n"
        "    return model.no_sync()\n"
    )
    _write(tmp_path, {"pyproject.toml": "", "first.py": first, "second.py": second})
    found = Project(tmp_path)
    context = found.context(str(tmp_path / "first.py"), first)
    assert [o.name for o in context.origins] == ["second_helper"]


def test_stdin_is_linted_alone(tmp_path, monkeypatch):
    from linter.config import Overrides, Resolver
    from linter.text import lint_text

    wrapped = MAIN.replace(
        "    model = wrap_model(build_model(args), args)\n",
        "    model = torch.nn.parallel.DistributedDataParallel(build_model(args))\n",
    )
    _write(tmp_path, {"pyproject.toml": "", "engine.py": ENGINE, "main.py": wrapped})
    monkeypatch.chdir(tmp_path)
    resolver = Resolver(Overrides(), cwd=tmp_path)
    result = lint_text(ENGINE, tmp_path / "engine.py", resolver)
    assert [d.code for d in result.diagnostics] == []


def test_a_summary_key_is_the_same_in_every_process(tmp_path):
    """The cache outlives the process: a key that followed string hashing (a frozenset's
    order) would differ on every run and no cached result would ever hold again."""
    import subprocess
    import sys

    path = tmp_path / "misc.py"
    path.write_text(
        "def step(loss, optimizer, scaler, model):\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.unscale_(optimizer)\n"
        "    clip_grad_norm_(model.parameters(), 1.0)\n"
        "    scaler.step(optimizer)\n"
        "    scaler.update()\n"
        "    optimizer.zero_grad()\n"
    )
    program = (
        "import sys\n"
        "from linter.project.summary import summarize\n"
        "text = open(sys.argv[1]).read()\n"
        "print(summarize(sys.argv[1], text, 'd', '').key)\n"
    )
    keys = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", program, str(path)],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        keys.add(done.stdout.strip())
    assert len(keys) == 1, keys


def _recording(monkeypatch, target: str, name: str) -> list[str]:
    """Record the basename of the path each call of `target.name` is given."""
    import importlib

    module = importlib.import_module(target)
    real, seen = getattr(module, name), []

    def recorded(*args, **kwargs):
        seen.append(os.path.basename(next(a for a in args if isinstance(a, str))))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recorded)
    return seen


def test_summaries_are_kept_on_disk_by_content(tmp_path, cli, monkeypatch):
    """A warm run reads no module of the project again (the cached findings hold while each
    module they drew on keeps its size and mtime); an edited file is analysed again with its
    modules' summaries from the disk, and only its own text is summarised."""
    run, analysed = cli
    wrapped = MISC.replace(
        "    return model.cuda(args.gpu)",
        "    return torch.nn.parallel.DistributedDataParallel(model.cuda(args.gpu))",
    )
    _write(tmp_path, {"engine.py": ENGINE, "main.py": MAIN, "util/__init__.py": "",
                      "util/misc.py": wrapped})  # fmt: skip
    summarised = _recording(monkeypatch, "linter.project.context", "summarize")
    cold = run("engine.py", "main.py")
    assert "engine.py:7:" in cold.stdout and "ACL401" in cold.stdout
    assert sorted(set(summarised)) == ["engine.py", "main.py", "misc.py"]
    summarised.clear()
    analysed.clear()
    warm = run("engine.py", "main.py")
    assert (warm.stdout, analysed, summarised) == (cold.stdout, [], [])
    (tmp_path / "engine.py").write_text(ENGINE.replace("    for step", "    # epoch\n    for step"))
    edited = run("engine.py", "main.py")
    assert analysed == ["engine.py"] and summarised == ["engine.py"]
    assert "engine.py:8:" in edited.stdout and "ACL401" in edited.stdout


def test_the_importer_index_is_kept_on_disk(tmp_path, cli, monkeypatch):
    """Who imports a module is asked of an index kept with the cache: a later run reads only
    the files whose size or mtime changed."""
    from linter.project.store import Store

    run, _ = cli
    _write(tmp_path, {"engine.py": ENGINE, "main.py": MAIN, "util/__init__.py": "",
                      "util/misc.py": MISC, "other.py": "import os\n"})  # fmt: skip
    read = _recording(monkeypatch, "linter.project.context", "_imported_words")
    run("engine.py")
    assert sorted(read) == ["__init__.py", "engine.py", "main.py", "misc.py", "other.py"]
    read.clear()
    (tmp_path / "engine.py").write_text(ENGINE + "\n")  # engine.py is analysed again
    run("engine.py")
    assert read == ["engine.py"]
    read.clear()
    (tmp_path / "main.py").write_text(MAIN.replace("from engine import", "from util import"))
    (tmp_path / "engine.py").write_text(ENGINE)
    run("engine.py")
    assert sorted(read) == ["engine.py", "main.py"]
    (directory,) = (tmp_path / ".accel_lint_cache").glob("project-*")
    main = tmp_path / "main.py"
    words = Store(directory).words(str(main), main.stat())
    assert "util" in words and "engine" not in words
