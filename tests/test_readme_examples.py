"""The README's console examples run, and print what the README says they print.

A ```console block preceded by `<!-- example: ... -->` is an example: each `$ command` runs
through bash, and what it prints (stdout and stderr, in order) must match the lines the README
shows under it. The marker says where: `copy=PATH` runs in a scratch folder holding a copy of
the repository's PATH (for commands that write), else in the repository itself (read-only
commands); `cwd=PATH` is the folder within. In the README's lines `...` stands for any text
within a line, and a line that is only `...` for any number of lines. `# comments` after a
command are the README's, not the shell's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"<!-- example:(.*?)-->\n```console\n(.*?)```", re.S)


@dataclass(frozen=True)
class Command:
    line: int  # in the README
    shell: str
    expected: tuple[str, ...]


def examples() -> list[tuple[dict[str, str], list[Command]]]:
    text = README.read_text(encoding="utf-8")
    found = []
    for match in MARKER.finditer(text):
        first = text.count("\n", 0, match.start(2)) + 1
        where = dict(item.split("=", 1) for item in match.group(1).split())
        found.append((where, _commands(match.group(2), first)))
    return found


def _commands(block: str, first_line: int) -> list[Command]:
    commands: list[Command] = []
    for offset, line in enumerate(block.splitlines()):
        if line.startswith("$ "):
            shell = re.sub(r"\s+#\s.*$", "", line[2:]).strip()
            commands.append(Command(first_line + offset, shell, ()))
        elif commands:
            last = commands[-1]
            commands[-1] = Command(last.line, last.shell, (*last.expected, line))
    return [_without_trailing_blanks(c) for c in commands]


def _without_trailing_blanks(command: Command) -> Command:
    expected = list(command.expected)
    while expected and not expected[-1].strip():
        expected.pop()
    return Command(command.line, command.shell, tuple(expected))


def matches(expected: tuple[str, ...], actual: list[str]) -> bool:
    """Whether `actual` fits `expected`, whose `...` elides text (or whole lines)."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head == "...":
        return any(matches(rest, actual[i:]) for i in range(len(actual) + 1))
    if not actual or not _line_matches(head, actual[0]):
        return False
    return matches(rest, actual[1:])


def _line_matches(expected: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.rstrip().split("..."))
    return re.fullmatch(pattern, actual.rstrip()) is not None  # trailing blanks do not show


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_GUARD", "PYTHONPATH"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "200"
    return env


EXAMPLES = examples()


def test_the_readme_marks_its_examples():
    assert len(EXAMPLES) >= 3
    assert all(commands for _, commands in EXAMPLES)


@pytest.mark.parametrize(
    ("where", "commands"), EXAMPLES, ids=[f"line{c[0].line}" for _, c in EXAMPLES]
)
def test_each_example_prints_what_the_readme_shows(where, commands, tmp_path):
    base = ROOT
    if "copy" in where:
        base = tmp_path
        ignored = shutil.ignore_patterns("__pycache__", ".accel_lint_cache")
        shutil.copytree(ROOT / where["copy"], tmp_path / where["copy"], ignore=ignored)
    workdir = base / where.get("cwd", ".")
    previous_status = 0
    for command in commands:
        shell = command.shell.replace("$?", str(previous_status))
        proc = subprocess.run(
            ["bash", "-c", f"{shell} 2>&1"],
            cwd=workdir,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        previous_status = proc.returncode
        actual = proc.stdout.rstrip("\n").splitlines()
        assert matches(command.expected, actual), (
            f"README.md:{command.line}: `{command.shell}` printed:\n{proc.stdout}"
        )
