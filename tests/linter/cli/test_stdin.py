"""`--stdin-filename PATH -` as editors call it, and `lint_text` (what the language server calls):
the config of the given path, reports on stdout, `--fix` prints the source and reports on stderr."""

import pytest

from linter.config import Overrides, Resolver
from linter.text import TextResult, lint_text

SOURCE = "for b in dl:\n    loss.backward()\n    clip_grad_norm_(p, 1.0)\n"
FIXED = "for b in dl:\n    accelerator.backward(loss)\n    clip_grad_norm_(p, 1.0)\n"


@pytest.fixture
def stdin(project):
    """Run the CLI in-process with `text` on stdin."""
    from typer.testing import CliRunner

    from linter.cli import app

    def run(text: str | bytes, *args: str):
        return CliRunner().invoke(app, list(args), input=text)

    return run


@pytest.fixture
def subproject(project):
    """`sub/` has its own config that ignores ACL303; no file is there."""
    (project / "sub").mkdir()
    (project / "sub" / "pyproject.toml").write_text('[tool.accel-lint]\nignore = ["ACL303"]\n')
    return project / "sub"


def test_reports_with_the_config_resolved_for_the_given_path(subproject, fake_rules, stdin):
    result = stdin(SOURCE, "--output-format", "concise", "--stdin-filename", "sub/train.py", "-")
    assert result.exit_code == 1
    assert result.stdout == (
        "sub/train.py:2:5: ACL101 [*] raw backward\nFound 1 error.\n[*] 1 fixable with `--fix`.\n"
    )
    top = stdin(SOURCE, "--output-format", "concise", "--stdin-filename", "train.py", "-")
    assert top.stdout.splitlines()[:2] == [
        "train.py:2:5: ACL101 [*] raw backward",
        "train.py:3:5: ACL303 clip per micro-step",
    ]


def test_the_full_format_quotes_the_text_from_stdin_not_the_file(project, fake_rules, stdin):
    (project / "train.py").write_text("# an older version on disk\n")
    result = stdin(SOURCE, "--stdin-filename", "train.py", "--select", "ACL101", "-")
    assert result.stdout.startswith(
        "train.py:2:5: ACL101 [*] raw backward\n"
        "  |\n"
        "1 | for b in dl:\n"
        "2 |     loss.backward()\n"
        "  |     ^^^^^^^^^^^^^^^\n"
        "3 |     clip_grad_norm_(p, 1.0)\n"
        "  |\n"
    )


def test_fix_prints_the_fixed_source_and_the_remaining_findings_on_stderr(
    subproject, fake_rules, stdin
):
    fixed = stdin(SOURCE, "--fix", "--output-format", "concise", "--stdin-filename", "train.py")
    assert fixed.exit_code == 1  # ACL303's fix is unsafe: it remains
    assert fixed.stdout == FIXED
    assert fixed.stderr == (
        "train.py:3:5: ACL303 clip per micro-step\n"
        "Found 1 error.\n"
        "No fixes available (1 unsafe fix available with `--fix --unsafe-fixes`).\n"
        "Fixed 1 error.\n"
    )
    clean = stdin(SOURCE, "--fix", "-q", "--stdin-filename", "sub/train.py", "-")
    assert (clean.exit_code, clean.stdout, clean.stderr) == (0, FIXED, "")
    unchanged = stdin(FIXED, "--fix", "--stdin-filename", "sub/train.py", "-")
    assert (unchanged.exit_code, unchanged.stdout) == (0, FIXED)


def test_fix_keeps_the_bytes_a_file_would_keep(project, fake_rules, stdin):
    data = b"\xef\xbb\xbf" + SOURCE.replace("\n", "\r\n").encode()
    result = stdin(data, "--fix", "--select", "ACL101", "--stdin-filename", "train.py", "-")
    assert result.stdout_bytes == b"\xef\xbb\xbf" + FIXED.replace("\n", "\r\n").encode()


def test_diff_on_stdin(project, fake_rules, stdin):
    result = stdin(SOURCE, "--diff", "--select", "ACL101", "--stdin-filename", "train.py", "-")
    assert result.exit_code == 1
    assert result.stdout == (
        "--- train.py\n+++ train.py\n@@ -1,3 +1,3 @@\n for b in dl:\n"
        "-    loss.backward()\n+    accelerator.backward(loss)\n     clip_grad_norm_(p, 1.0)\n"
    )
    assert result.stderr == "Would fix 1 error.\n"


def test_dash_alone_reads_stdin_and_a_syntax_error_is_one_acl000(project, fake_rules, stdin):
    result = stdin("for b in dl\n    loss.backward()\n", "--output-format", "concise", "-")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "-:1:12: ACL000 SyntaxError: expected ':'",
        "Found 1 error.",
    ]


def test_add_noqa_refuses_stdin(project, fake_rules, stdin):
    result = stdin(SOURCE, "--add-noqa", "--stdin-filename", "train.py", "-")
    assert result.exit_code == 2
    assert result.stderr == "error: --add-noqa cannot be used with standard input\n"


def test_lint_text_is_the_runners_analysis_for_one_text(subproject, fake_rules):
    resolver = Resolver(Overrides())
    found = lint_text(SOURCE, subproject / "train.py", resolver)
    assert isinstance(found, TextResult) and found.fixed is None
    assert [(d.code, d.path, d.start.line) for d in found.diagnostics] == [
        ("ACL101", "sub/train.py", 2)
    ]
    fixed = lint_text(SOURCE, "train.py", resolver, fix="unsafe")
    assert (
        fixed.fixed
        == "for b in dl:\n    accelerator.backward(loss)\n    # clip_grad_norm_(p, 1.0)\n"
    )
    assert (fixed.diagnostics, fixed.fixes_applied) == ([], 2)
    suppressed = lint_text(SOURCE.replace("()\n", "()  # noqa: ACL101\n", 1), "t.py", resolver)
    assert [d.code for d in suppressed.diagnostics] == ["ACL303"]
    broken = lint_text("for b in dl\n", "t.py", resolver, fix="safe")
    assert [(d.code, d.start.line) for d in broken.diagnostics] == [("ACL000", 1)]
    assert broken.fixed == "for b in dl\n"
