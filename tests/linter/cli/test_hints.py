"""Hints (info-level findings) are off by default, opt-in, and never fail a run.

On the real analysis: PyTorch's AMP recipe with a scheduler stepped after `scaler.update()` is
ACL305's hint-level variant (b); a correct script of that shape must lint clean by default.
"""

import json

import pytest
from typer.testing import CliRunner

from linter.cli import app
from linter.config import Overrides, Resolver
from linter.explain import explain_markdown
from linter.text import lint_text

AMP_RECIPE = """\
import torch

model = Net().to("cuda")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=30)
scaler = torch.amp.GradScaler("cuda")
for epoch in range(epochs):
    for x, y in loader:
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
"""
HINT_ROW = 15  # `sched.step()`
EMA_AFTER_UPDATE = AMP_RECIPE.replace("        sched.step()\n", "        ema.update(model)\n")
# The same loop with a real error next to the hint: the unscaled clip (ACL104) stays an error.
WITH_ERROR = AMP_RECIPE.replace(
    "        scaler.step(opt)\n",
    "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n        scaler.step(opt)\n",
)


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args: str, stdin: str | None = None):
    return CliRunner().invoke(app, list(args), input=stdin)


def write(project, text: str) -> str:
    (project / "train.py").write_text(text)
    return "train.py"


@pytest.mark.parametrize("source", [AMP_RECIPE, EMA_AFTER_UPDATE], ids=["scheduler", "ema"])
def test_the_amp_recipe_lints_clean_by_default(project, source):
    path = write(project, source)
    result = run("--no-cache", path)
    assert (result.exit_code, result.stdout) == (0, "All checks passed!\n")
    for output_format in ("json", "github", "concise"):
        shown = run("--no-cache", "--output-format", output_format, path)
        assert shown.exit_code == 0
        assert "ACL305" not in shown.stdout


def test_hints_on_the_command_line_are_shown_and_never_fail(project):
    path = write(project, AMP_RECIPE)
    result = run("--no-cache", "--hints", "--output-format", "concise", path)
    assert result.exit_code == 0
    assert result.stdout.startswith(f"train.py:{HINT_ROW}:9: ACL305 hint: `sched.step()`")
    assert result.stdout.endswith("All checks passed! (1 hint above: hints never fail a run)\n")


def test_hints_are_exported_as_info_notice_and_note_never_as_errors(project):
    path = write(project, AMP_RECIPE)
    (found,) = json.loads(run("--no-cache", "--hints", "--output-format", "json", path).stdout)
    assert (found["code"], found["severity"], found["location"]["row"]) == (
        "ACL305",
        "info",
        HINT_ROW,
    )
    github = run("--no-cache", "--hints", "--output-format", "github", path)
    assert github.exit_code == 0
    assert github.stdout.startswith("::notice title=accel-lint (ACL305)")
    assert "::error" not in github.stdout
    sarif = json.loads(run("--no-cache", "--hints", "--output-format", "sarif", path).stdout)
    assert [r["level"] for r in sarif["runs"][0]["results"]] == ["note"]


def test_an_error_next_to_a_hint_fails_alone(project):
    path = write(project, WITH_ERROR)
    quiet = run("--no-cache", "--output-format", "concise", path)
    assert quiet.exit_code == 1
    assert [line.split(": ")[1].split()[0] for line in quiet.stdout.splitlines()[:-2]] == ["ACL104"]
    shown = run("--no-cache", "--hints", "--output-format", "concise", path)
    assert shown.exit_code == 1
    assert "ACL305 hint:" in shown.stdout
    assert "Found 1 error (and 1 hint).\n" in shown.stdout
    github = run("--no-cache", "--hints", "--output-format", "github", path).stdout.splitlines()
    assert [line.split(" ")[0] for line in github] == ["::error", "::notice"]


def test_config_turns_hints_on_and_the_command_line_wins(project):
    path = write(project, AMP_RECIPE)
    (project / "pyproject.toml").write_text("[tool.accel-lint]\nhints = true\n")
    assert "ACL305 hint:" in run("--no-cache", path).stdout
    assert run("--no-cache", "--no-hints", path).stdout == "All checks passed!\n"


def test_an_invalid_hints_value_is_a_usage_error(project):
    path = write(project, AMP_RECIPE)
    (project / "pyproject.toml").write_text('[tool.accel-lint]\nhints = "yes"\n')
    result = run("--no-cache", path)
    assert result.exit_code == 2
    assert "`hints` must be true or false" in result.stderr


def test_the_cache_keeps_hints_apart(project):
    path = write(project, AMP_RECIPE)
    assert run(path).stdout == "All checks passed!\n"
    assert "ACL305 hint:" in run("--hints", path).stdout  # not the cached "nothing"
    assert run(path).stdout == "All checks passed!\n"


def test_stdin_and_the_editor_path_follow_the_policy(project):
    result = run("--stdin-filename", "train.py", "-", stdin=AMP_RECIPE)
    assert (result.exit_code, result.stdout) == (0, "All checks passed!\n")
    hinted = run("--hints", "--stdin-filename", "train.py", "-", stdin=AMP_RECIPE)
    assert hinted.exit_code == 0 and "ACL305 hint:" in hinted.stdout
    # The language server and stdin share lint_text: off by default, on with the config.
    assert lint_text(AMP_RECIPE, project / "train.py", Resolver(Overrides())).diagnostics == []
    shown = lint_text(AMP_RECIPE, project / "train.py", Resolver(Overrides(hints=True)))
    assert [(d.code, d.start.line, d.severity) for d in shown.diagnostics] == [
        ("ACL305", HINT_ROW, "info")
    ]


def test_fixing_never_touches_a_hint(project):
    path = write(project, AMP_RECIPE)
    assert run("--no-cache", "--hints", "--fix", path).exit_code == 0
    assert (project / path).read_text() == AMP_RECIPE


@pytest.mark.parametrize("code", ["ACL305", "ACL401", "ACL501", "ACL504"])
def test_explain_says_the_hint_is_off_by_default(code):
    text = explain_markdown(code)
    assert "- Hint (info level, off by default: shown with `--hints`" in text


def test_the_help_names_the_option():
    assert "--hints / --no-hints" in run("--help").stdout


def test_the_summary_counts_errors_warnings_and_hints_apart(project):
    warning_only = "import torch\n\nscaler = torch.cuda.amp.GradScaler()\n"  # ACL203: a warning
    path = write(project, warning_only)
    result = run("--no-cache", "--output-format", "concise", path)
    assert result.exit_code == 1  # warnings fail a run like errors (ruff's exit code); hints never
    assert result.stdout.splitlines()[-2] == "Found 1 warning."
    mixed = write(
        project, WITH_ERROR.replace('torch.amp.GradScaler("cuda")', "torch.cuda.amp.GradScaler()")
    )
    shown = run("--no-cache", "--hints", "--output-format", "concise", mixed)
    assert "Found 1 error and 1 warning (and 1 hint).\n" in shown.stdout
