"""`--add-noqa`: every finding suppressed where it starts, existing directives merged, formatting
and encoding kept, a second run adds nothing; notebooks change only in the touched cell."""

import shutil
from pathlib import Path

import nbformat

SOURCE = (
    "for b in dl:\n"
    "    loss.backward()\n"
    "    clip_grad_norm_(p, 1.0)  # keep the norm small\n"
    "    loss.backward(); clip_grad_norm_(q, 2.0)  # noqa: ACL999\n"
    '    note = """loss.backward()\n'
    '    """\n'
)
EXPECTED = (
    "for b in dl:\n"
    "    loss.backward()  # noqa: ACL101\n"
    "    clip_grad_norm_(p, 1.0)  # keep the norm small  # noqa: ACL303\n"
    "    loss.backward(); clip_grad_norm_(q, 2.0)  # noqa: ACL999, ACL101, ACL303\n"
    '    note = """loss.backward()\n'
    '    """\n'
)


def test_adds_merges_and_is_idempotent(project, fake_rules, invoke):
    script = project / "train.py"
    script.write_text(SOURCE)
    result = invoke("--no-cache", "--add-noqa")
    assert result.exit_code == 0, result.output
    assert script.read_text() == EXPECTED
    assert result.stderr == (
        "Added 3 noqa directives.\nwarning: 1 finding(s) are on lines that cannot take a comment\n"
    )
    again = invoke("--no-cache", "--add-noqa")
    assert script.read_text() == EXPECTED
    assert again.stderr.startswith("Added 0 noqa directives.\n")
    check = invoke("--no-cache", "--output-format", "concise")
    assert check.stdout.splitlines()[0] == "train.py:5:15: ACL101 [*] raw backward"  # in a string


def test_keeps_crlf_and_bom_and_a_bare_directive_needs_nothing(project, fake_rules, invoke):
    script = project / "train.py"
    source = "for b in dl:\n    loss.backward()\n    loss.backward()  # NOQA\n"
    script.write_bytes(b"\xef\xbb\xbf" + source.replace("\n", "\r\n").encode())
    assert invoke("--no-cache", "--add-noqa").stderr == "Added 1 noqa directive.\n"
    expected = "for b in dl:\n    loss.backward()  # noqa: ACL101\n    loss.backward()  # NOQA\n"
    assert script.read_bytes() == b"\xef\xbb\xbf" + expected.replace("\n", "\r\n").encode()


def test_a_file_with_a_syntax_error_is_left_alone(project, fake_rules, invoke):
    script = project / "train.py"
    script.write_text("loss.backward(\n")
    result = invoke("--no-cache", "--add-noqa", "train.py")
    assert (result.exit_code, result.stderr) == (0, "Added 0 noqa directives.\n")
    assert script.read_text() == "loss.backward(\n"


def test_add_noqa_with_fix_is_a_usage_error(project, fake_rules, invoke):
    result = invoke("--add-noqa", "--fix")
    assert result.exit_code == 2
    assert result.stderr == "error: --add-noqa cannot be combined with --fix or --diff\n"


def test_a_notebook_gets_the_directive_in_its_cell_only(project, invoke):
    notebook = project / "train.ipynb"
    shutil.copyfile(Path(__file__).parent / "notebooks" / "train.ipynb", notebook)
    original = notebook.read_bytes()
    result = invoke("--no-cache", "--add-noqa", "-q")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")
    before = b'    "        F.mse_loss(model(x), y).backward()\\n",\n'
    after = b'    "        F.mse_loss(model(x), y).backward()  # noqa: ACL301\\n",\n'
    assert notebook.read_bytes() == original.replace(before, after)
    nbformat.validate(nbformat.read(notebook, as_version=4))
    check = invoke("--no-cache", "train.ipynb")
    assert (check.exit_code, check.stdout) == (0, "All checks passed!\n")
