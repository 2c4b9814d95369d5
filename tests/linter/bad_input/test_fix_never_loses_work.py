"""`--fix` never loses what is on disk: read-only files, files edited while the linter runs,
symbolic links (and loops of them) and Ctrl-C over many files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bad_input_scripts import FINDING, FIXED, SCRIPT

REPO = Path(__file__).resolve().parents[3]
LEFT = f"{FINDING}: under fp16 the loss would not be scaled"


def test_read_only_file_is_an_error_and_the_others_are_still_fixed(project, invoke):
    for name in ("a.py", "locked.py", "z.py"):
        (project / name).write_text(SCRIPT)
    (project / "locked.py").chmod(0o444)
    result = invoke(".", "--fix")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: locked.py: cannot write fixes: the file is read-only",
        "Fixed 2 errors.",
    ]
    assert result.stdout.splitlines()[0] == f"locked.py:8:5: {LEFT}"  # still there
    assert (project / "locked.py").read_text() == SCRIPT
    assert (project / "locked.py").stat().st_mode & 0o777 == 0o444
    assert (project / "a.py").read_text() == (project / "z.py").read_text() == FIXED


def _saved_while_checked(monkeypatch, module, name: str, path: Path, edited: bytes) -> None:
    """An editor saves `edited` at `path` while `module.name` (the analysis) runs."""
    analyse = getattr(module, name)

    def save_meanwhile(*args, **kwargs):
        path.write_bytes(edited)
        return analyse(*args, **kwargs)

    monkeypatch.setattr(module, name, save_meanwhile)


def test_a_file_edited_during_the_run_is_not_clobbered(project, invoke, monkeypatch):
    """Someone saves the file while it is being analysed: their text wins, the fix waits."""
    from linter import text

    (project / "train.py").write_text(SCRIPT)
    edited = SCRIPT + "print('saved by the editor')\n"
    _saved_while_checked(monkeypatch, text, "check_source", project / "train.py", edited.encode())
    result = invoke("train.py", "--fix")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: train.py: not fixed: the file changed on disk while it was being checked; run again"
    ]
    assert result.stdout.splitlines()[0] == f"train.py:8:5: {LEFT}"
    assert (project / "train.py").read_text() == edited


def test_symbolic_links_are_written_through_and_loops_are_reported(project, invoke):
    (project / "real.py").write_text(SCRIPT)
    (project / "link.py").symlink_to("real.py")  # the same file twice: linted once
    (project / "loop.py").symlink_to("loop.py")
    (project / "dangling.py").symlink_to("missing.py")
    (project / "pkg").mkdir()
    (project / "pkg" / "again").symlink_to("..")  # a directory loop: never followed
    result = invoke(".", "--fix")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[:2] == [
        "dangling.py:1:1: ACL000 cannot read file: No such file or directory",
        "loop.py:1:1: ACL000 cannot read file: Too many levels of symbolic links",
    ]
    assert result.stderr == "Fixed 1 error.\n"
    assert (project / "real.py").read_text() == FIXED
    assert os.readlink(project / "link.py") == "real.py"


def test_a_named_link_is_fixed_through_to_its_target(project, invoke):
    (project / "real.py").write_text(SCRIPT)
    (project / "link.py").symlink_to("real.py")
    result = invoke("link.py", "--fix")
    assert (result.exit_code, result.stderr) == (0, "Fixed 1 error.\n")
    assert (project / "link.py").is_symlink()
    assert (project / "real.py").read_text() == FIXED


def test_ctrl_c_during_a_fix_leaves_every_file_old_or_new(tmp_path):
    """SIGINT to the process group (as a terminal sends it) once the first file is fixed:
    the pool stops, each file holds its old or its fixed text, no temporary file is left."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    originals = {}
    for index in range(1000):  # seconds of fixing left when the first is written, on any machine
        path = tmp_path / f"train_{index:03d}.py"
        originals[path] = f"# script {index}\n{SCRIPT}"
        path.write_text(originals[path])
    command = [sys.executable, "-m", "linter.cli", str(tmp_path), "--fix", "--no-cache"]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if any(path.read_text() != text for path, text in originals.items()):
            break
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    fixed = {
        p: t.replace("loss.backward()", "accelerator.backward(loss)") for p, t in originals.items()
    }
    now = {path: path.read_text() for path in originals}
    assert all(now[p] in (originals[p], fixed[p]) for p in originals)
    assert 0 < sum(now[p] == fixed[p] for p in originals) < len(originals)  # stopped mid-run
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".py") == ["pyproject.toml"]
    assert process.returncode == 130
    assert stderr.decode().splitlines() == [
        "error: interrupted: every file holds either its old text or its fixed text"
    ]


def test_a_notebook_edited_during_the_run_is_not_clobbered(project, invoke, monkeypatch):
    """The same protection for a notebook: the editor's save wins over the cells' fix."""
    import linter.notebooks as notebooks

    notebook = REPO / "tests" / "linter" / "cli" / "notebooks" / "train.ipynb"
    (project / "train.ipynb").write_bytes(notebook.read_bytes())
    edited = notebook.read_bytes() + b"\n"  # saved again by an editor that ends with a newline
    target = project / "train.ipynb"
    _saved_while_checked(monkeypatch, notebooks, "lint_notebook_text", target, edited)
    result = invoke("train.ipynb", "--fix")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: train.ipynb: not fixed: the file changed on disk while it was being checked; "
        "run again"
    ]
    assert result.stdout.splitlines()[0].startswith("train.ipynb:cell 5:5:9: ACL301")
    assert (project / "train.ipynb").read_bytes() == edited
