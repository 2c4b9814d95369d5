"""`linter.cli.main` parses common invocations without typer: it must parse them as click does,
and leave everything else (help, usage errors, what it does not know) to the typer app."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from linter import cli, command
from linter.typer_app import app

COMMAND = typer.main.get_command(app)


def click_parse(args: list[str]) -> dict:
    with COMMAND.make_context("accel-lint", list(args)) as ctx:
        return normalised(ctx.params)


def normalised(params: dict) -> dict:
    """Defaults filled in; paths and the format as text (typer converts click's values after)."""
    defaults = {k: p.default for k, p in inspect.signature(command.lint).parameters.items()}

    def plain(value):
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value] or None
        return value.value if isinstance(value, command.OutputFormat) else _text(value)

    return {k: plain(v) for k, v in {**defaults, **params}.items()}


def _text(value):
    return str(value) if isinstance(value, Path) else value


def test_the_table_is_the_typer_apps_options():
    flags, values = {}, {}
    for param in COMMAND.params:
        if param.param_type_name == "argument":
            continue
        if param.is_flag:
            for opt in param.opts:
                flags[opt] = (param.name, True)
            for opt in param.secondary_opts:
                flags[opt] = (param.name, False)
        else:
            for opt in param.opts:
                values[opt] = (param.name, param.multiple)
    flags.pop("--help", None)
    assert flags == cli._FLAGS
    assert values == cli._VALUES


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["fixtures/tour/train.py"],
        ["--no-cache", "fixtures/tour/train.py"],
        ["a.py", "--select", "ACL3", "b", "--select=ACL1,ACL2", "--ignore", "ACL301"],
        ["--output-format", "concise", "--output-format=json", "-q", "--exit-zero", "x"],
        ["--unsafe-fixes", "--no-unsafe-fixes", "--fix", "--diff", "--statistics"],
        ["--hints", "--no-hints", "--hints", "--extend-select", "ACL5", "--add-noqa"],
        [
            "--config",
            "pyproject.toml",
            "-o",
            "out.txt",
            "--output-file=o2",
            "--stdin-filename=x.py",
        ],
        ["--explain", "ACL101"],
        ["--show-loops", "fixtures/tour/train.py", "--output-format", "json"],
        ["--list-rules", "--version", "--no-cache"],
    ],
)
def test_parsed_as_click_parses(args):
    assert normalised(cli._parse(args)) == click_parse(args)


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["-h"],
        ["--select"],
        ["--select="],
        ["--select", "--fix"],
        ["--output-format", "xml"],
        ["--output-format=Concise"],
        ["--fix=1"],
        ["-qo", "out.txt"],
        ["-oout.txt"],
        ["-"],
        ["--", "a.py"],
        ["--no-cach"],
        ["--unknown"],
    ],
)
def test_left_to_typer(args):
    assert cli._parse(args) is None


def test_an_unreadable_path_is_left_to_typer(tmp_path, monkeypatch):
    target = tmp_path / "train.py"
    target.write_text("x = 1\n")
    monkeypatch.setattr(cli.os, "access", lambda path, mode: Path(path) != target)
    assert cli._parse([str(target)]) is None
    assert cli._parse(["--config", str(target)]) is None
    assert cli._parse([str(tmp_path / "absent.py")]) is not None  # click does not check those


def test_one_file_imports_neither_typer_nor_rich():
    code = (
        "import sys\n"
        "from linter.cli import main\n"
        "sys.argv = ['accel-lint', '--no-cache', 'fixtures/tour/train.py']\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    code = exit.code\n"
        "heavy = {'typer', 'click', 'rich', 'torch', 'pygls'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy), code, file=sys.stderr)\n"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.stderr.strip().splitlines()[-1] == "[] 1"
