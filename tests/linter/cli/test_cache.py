"""The result cache: warm runs skip analysis, edits and setting changes invalidate, corruption is
ignored, and --no-cache bypasses it."""

import os

BAD = "for batch in dl:\n    loss = model(batch)\n    loss.backward()\n"


def cache_files(project):
    return list((project / ".accel_lint_cache").glob("*.json"))


def test_warm_run_does_not_analyse_again(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    cold = invoke("--output-format", "concise")
    assert fake_rules == ["train.py"]
    warm = invoke("--output-format", "concise")
    assert fake_rules == ["train.py"]  # answered from the cache
    assert warm.stdout == cold.stdout and warm.exit_code == cold.exit_code == 1
    assert (project / ".accel_lint_cache" / "CACHEDIR.TAG").exists()


def test_warm_run_does_not_import_libcst(project):
    """A fully cached run never loads the parser (the point of caching)."""
    import subprocess
    import sys

    (project / "train.py").write_text(BAD.replace("loss.backward()", "accelerator.backward(loss)"))
    probe = (
        "import sys; from linter.cli import app\n"
        "try: app(['--output-format', 'concise'])\n"
        "except SystemExit: pass\n"
        "print('libcst' in sys.modules, 'rich' in sys.modules, 'torch' in sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True)
    warm = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    assert warm.stdout.splitlines()[-1] == "False False False"


def test_edit_invalidates(project, fake_rules, invoke):
    script = project / "train.py"
    script.write_text(BAD)
    invoke()
    script.write_text(BAD + "loss.backward()\n")
    result = invoke("--output-format", "concise")
    assert len(fake_rules) == 2
    assert "train.py:4:1: ACL101" in result.stdout


def test_same_content_new_mtime_is_a_hit(project, fake_rules, invoke):
    script = project / "train.py"
    script.write_text(BAD)
    invoke()
    os.utime(script, ns=(1, 1))
    invoke()
    assert fake_rules == ["train.py"]


def test_changed_selection_invalidates(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    invoke()
    assert invoke("--ignore", "ACL101").exit_code == 0
    assert len(fake_rules) == 2
    assert invoke().exit_code == 1
    assert len(fake_rules) == 3  # one entry per file: a changed selection re-analyses


def test_no_cache_bypasses(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    invoke("--no-cache")
    invoke("--no-cache")
    assert len(fake_rules) == 2
    assert not (project / ".accel_lint_cache").exists()


def test_corrupt_cache_is_ignored(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    invoke()
    (cache,) = cache_files(project)
    cache.write_text('{"' + str(project / "train.py") + '": [1, 2, 3, 4, [["bad"]]]}')
    assert invoke().exit_code == 1
    cache.write_text("not json at all")
    result = invoke("--output-format", "concise")
    assert result.exit_code == 1 and "ACL101" in result.stdout


def test_fix_after_a_cached_run_still_fixes(project, fake_rules, invoke):
    script = project / "train.py"
    script.write_text(BAD)
    invoke()
    assert invoke("--fix").exit_code == 0
    assert "accelerator.backward(loss)" in script.read_text()
    assert invoke().exit_code == 0


def test_tool_key_changes_with_the_rules_source(tmp_path, monkeypatch):
    import linter
    from linter import cache

    before = cache.tool_key()
    monkeypatch.setattr(linter, "__version__", "9.9.9")
    assert cache.tool_key() != before
