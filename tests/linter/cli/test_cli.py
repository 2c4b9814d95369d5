"""The command end to end (in-process, fake rules): exit codes, fixes, diff, selection, errors."""

import os
from pathlib import Path

BAD = (
    "import torch\nfor batch in dl:\n    loss = model(batch)\n    loss.backward()\n    opt.step()\n"
)
FIXED = BAD.replace("loss.backward()", "accelerator.backward(loss)")
CLIP = "for b in dl:\n    loss.backward()\n    clip_grad_norm_(p, 1.0)\n"


def test_clean_tree_exits_zero(project, fake_rules, invoke):
    (project / "train.py").write_text(FIXED)
    result = invoke()
    assert result.exit_code == 0, result.output
    assert "All checks passed!" in result.stdout


def test_finding_exits_one_with_location(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    result = invoke("--output-format", "concise")
    assert result.exit_code == 1
    assert "train.py:4:5: ACL101 [*] raw backward" in result.stdout
    assert "Found 1 error." in result.stdout


def test_exit_zero(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    assert invoke("--exit-zero").exit_code == 0


def test_prefilter_skips_files_that_mention_no_keyword(project, fake_rules, invoke):
    (project / "util.py").write_text("def add(a, b):\n    return a + b\n")
    (project / "broken.py").write_text("def (:\n")  # not parsed at all: cannot violate a rule
    (project / "train.py").write_text(FIXED)
    assert invoke().exit_code == 0
    assert fake_rules == ["train.py"]


def test_fix_writes_and_is_idempotent(project, fake_rules, invoke):
    script = project / "train.py"
    script.write_text(BAD)
    result = invoke("--fix")
    assert result.exit_code == 0, result.output
    assert script.read_text() == FIXED
    assert "Fixed 1 error." in result.stderr
    again = invoke("--fix", "--no-cache")
    assert again.exit_code == 0 and "Fixed" not in again.stderr
    assert script.read_text() == FIXED


def test_fix_keeps_crlf_and_bom(project, fake_rules, invoke):
    script = project / "train.py"
    script.write_bytes(b"\xef\xbb\xbf" + BAD.replace("\n", "\r\n").encode())
    assert invoke("--fix").exit_code == 0
    assert script.read_bytes() == b"\xef\xbb\xbf" + FIXED.replace("\n", "\r\n").encode()


def test_unsafe_fixes_need_both_flags(project, fake_rules, invoke):
    script = project / "train.py"
    script.write_text(CLIP)
    shown = invoke("--unsafe-fixes", "--output-format", "concise")
    assert shown.exit_code == 1 and script.read_text() == CLIP
    assert "ACL303 [*] clip per micro-step" in shown.stdout
    safe_only = invoke("--fix", "--no-cache")
    assert "clip_grad_norm_" in script.read_text() and "# clip" not in script.read_text()
    assert "ACL303 clip per micro-step" in safe_only.stdout  # remaining, no [*]
    assert "1 unsafe fix available" in safe_only.stdout
    result = invoke("--fix", "--unsafe-fixes", "--no-cache")
    assert result.exit_code == 0, result.output
    assert (
        script.read_text()
        == "for b in dl:\n    accelerator.backward(loss)\n    # clip_grad_norm_(p, 1.0)\n"
    )


def test_unsafe_fixes_from_config(project, fake_rules, invoke):
    (project / "pyproject.toml").write_text("[tool.accel-lint]\nunsafe-fixes = true\n")
    (project / "train.py").write_text(CLIP)
    assert invoke("--fix").exit_code == 0
    assert "# clip_grad_norm_" in (project / "train.py").read_text()


def test_diff_prints_and_writes_nothing(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    result = invoke("--diff")
    assert result.exit_code == 1
    assert (project / "train.py").read_text() == BAD
    assert "-    loss.backward()\n+    accelerator.backward(loss)\n" in result.stdout
    assert result.stdout.startswith("--- train.py\n+++ train.py\n")
    assert "Would fix 1 error." in result.stderr
    (project / "train.py").write_text(FIXED)
    assert invoke("--diff").exit_code == 0


def test_select_ignore_and_unknown_codes(project, fake_rules, invoke):
    (project / "train.py").write_text(CLIP)
    only_clip = invoke("--select", "ACL3", "--output-format", "concise")
    assert "ACL303" in only_clip.stdout and "ACL101" not in only_clip.stdout
    ignored = invoke("--ignore", "ACL1,ACL303", "--output-format", "concise")
    assert ignored.exit_code == 0
    unknown = invoke("--select", "ACL999")
    assert unknown.exit_code == 2 and "unknown rule selector" in unknown.stderr


def test_noqa_suppresses(project, fake_rules, invoke):
    (project / "train.py").write_text(
        BAD.replace("loss.backward()", "loss.backward()  # noqa: ACL101")
    )
    assert invoke().exit_code == 0


def test_per_file_ignores(project, fake_rules, invoke):
    (project / "pyproject.toml").write_text(
        '[tool.accel-lint.per-file-ignores]\n"scripts/*.py" = ["ACL101"]\n'
    )
    (project / "scripts").mkdir()
    (project / "scripts" / "a.py").write_text(BAD)
    (project / "b.py").write_text(BAD)
    result = invoke("--output-format", "concise")
    assert "b.py:4:5: ACL101" in result.stdout and "scripts" not in result.stdout


def test_syntax_error_is_acl000_and_the_run_continues(project, fake_rules, invoke):
    (project / "a_broken.py").write_text("loss.backward(\n")
    (project / "b_train.py").write_text(BAD)
    result = invoke("--output-format", "concise")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("a_broken.py:1:14: ACL000 SyntaxError: ")
    assert lines[1].startswith("b_train.py:4:5: ACL101")


def test_named_file_gets_acl000_even_when_the_prefilter_would_skip_it(project, invoke):
    (project / "util.py").write_text("def helper(:\n    pass\n")
    for _ in range(2):  # the second run goes through the cache
        result = invoke("--output-format", "concise", "util.py")
        assert result.exit_code == 1
        assert result.stdout.startswith("util.py:1:12: ACL000 SyntaxError: ")


def test_a_named_file_is_linted_even_when_the_prefilter_would_skip_it(project, invoke):
    """An evaluation script with no backward (ACL502) gets checked when named."""
    (project / "val.py").write_text(
        "import torch\n"
        "def validate(model, val_loader):\n"
        "    model.eval()\n"
        "    for x, y in val_loader:\n"
        "        out = model(x)\n"
    )
    named = invoke("--output-format", "concise", "--select", "ACL502", "val.py")
    assert "val.py:5:" in named.stdout and "ACL502" in named.stdout, named.output
    walked = invoke("--output-format", "concise", "--select", "ACL502", "--no-cache")
    assert walked.exit_code == 0 and "ACL502" not in walked.stdout


def test_a_walked_file_the_prefilter_skips_is_not_parsed(project, invoke):
    (project / "util.py").write_text("def helper(:\n    pass\n")
    result = invoke("--output-format", "concise")
    assert result.exit_code == 0 and "ACL000" not in result.stdout


def test_undecodable_and_missing_files_are_diagnostics(project, fake_rules, invoke):
    (project / "latin.py").write_bytes(b"x = '\xe9'  # loss.backward()\n")
    result = invoke("--output-format", "concise", "latin.py", "missing.py")
    assert result.exit_code == 1
    assert "latin.py:1:1: ACL000 cannot decode file" in result.stdout
    assert "missing.py:1:1: ACL000 cannot read file" in result.stdout
    assert "Traceback" not in result.output


def test_internal_error_names_the_file_and_exits_two(project, monkeypatch, invoke):
    from linter import analysis

    def explode(source, path, codes, cache=None):
        if "explode" in source:
            raise RuntimeError("rule bug")
        return []

    monkeypatch.setattr(analysis, "analyze_source", explode)
    (project / "a.py").write_text("explode()\nloss.backward()\n")
    (project / "b.py").write_text("loss.backward()\n")
    result = invoke()
    assert result.exit_code == 2
    assert "error: a.py: internal error: RuntimeError: rule bug" in result.stderr
    # a run that could not check a file never says everything passed
    assert "All checks passed" not in result.output
    assert "1 file could not be checked" in result.stdout


def test_invalid_config_exits_two(project, fake_rules, invoke):
    (project / "pyproject.toml").write_text("[tool.accel-lint]\nselect = 3\n")
    result = invoke()
    assert result.exit_code == 2 and "`select` must be a list of strings" in result.stderr


def test_statistics(project, fake_rules, invoke):
    (project / "train.py").write_text(CLIP + CLIP.replace("for b", "for c"))
    result = invoke("--statistics")
    assert result.stdout.splitlines()[:2] == [
        "2\tACL101\t[*] raw-backward",
        "2\tACL303\t[ ] per-microstep-clipping",
    ]
    assert "Found 4 errors." in result.stdout
    as_json = invoke("--statistics", "--output-format", "json")
    import json

    assert json.loads(as_json.stdout)[1] == {
        "code": "ACL303",
        "name": "per-microstep-clipping",
        "count": 2,
        "fixable": False,
        "fixable_count": 0,
    }


def test_explain_and_list_rules(invoke):
    from rules import ALL_RULES

    explained = invoke("--explain", "acl101")
    assert explained.exit_code == 0
    assert explained.stdout.startswith("# ACL101 (raw-backward)\n")
    assert ALL_RULES["ACL101"].docs.strip() in explained.stdout
    assert invoke("--explain", "ACL999").exit_code == 2
    runtime_lines = {
        code: next(
            line for line in invoke("--explain", code).stdout.splitlines() if "guard:" in line
        )
        for code in ("ACL101", "ACL201", "ACL601", "ACL311")
    }
    assert runtime_lines == {
        "ACL101": "- Runtime guard: raises `guard.GuardError` (ACCEL_GUARD=raise, the default) "
        "or warns (warn mode)",
        "ACL201": "- Runtime guard: warns, never raises in any mode",
        "ACL601": "- Runtime guard: raises where the damage is certain, warns where it may be "
        "intended (see the runtime signal)",
        "ACL311": "- Runtime guard: not detectable at runtime",
    }
    listed = invoke("--list-rules").stdout.splitlines()
    assert listed[0].split() == ["code", "name", "fix", "static", "runtime", "summary"]
    assert [line.split()[0] for line in listed[1:]] == list(ALL_RULES)


def test_version(invoke):
    import linter

    assert invoke("--version").stdout == f"accel-lint {linter.__version__}\n"


def test_relative_paths_are_shown_relative(project, fake_rules, invoke):
    (project / "sub").mkdir()
    (project / "sub" / "t.py").write_text(BAD)
    result = invoke("--output-format", "concise", str(project / "sub"))
    assert result.stdout.startswith(f"sub{os.sep}t.py:4:5:")
    assert Path("sub/t.py").exists()


def test_prefilter_words():
    from linter.runner import PREFILTER

    for text in [
        "loss.backward()",
        "scaler.scale(loss).backward (retain_graph=True)",
        "with torch.autocast('cuda'):",
        "scaler = GradScaler()",
        "clip_grad_norm_(p, 1)",
        "from accelerate import Accelerator",
        "with model.no_sync():",
        "opt.zero_grad()",
        "args.gradient_accumulation_steps",
        "@torch.cuda.amp.custom_fwd(cast_inputs=torch.float16)",  # ACL203 in a model file
        "from torch.cuda import amp",
        "@custom_bwd",
        "AdamW(params, weight_decay=cfg.wd * cfg.grad_accum)",  # ACL311 in an optimizer factory
        "sampler = DistributedSampler(ds)",  # ACL404 in a main without a backward
    ]:
        assert PREFILTER.search(text.encode()), text
    for text in [
        "# kept for backward compatibility",
        "def add(a, b):\n    return a + b\n",
        "AdamW(params, weight_decay=0.01)\naccuracy = 1",
    ]:
        assert not PREFILTER.search(text.encode()), text


def test_a_fix_that_breaks_the_file_is_never_written(project, monkeypatch, invoke):
    from linter import analysis
    from linter.types import Diagnostic, Edit, Fix, Position

    def breaking(source, path, codes):
        compile(source, path, "exec")  # SyntaxError here would mean broken code was analysed
        at, end = Position(1, 0), Position(1, 4)
        fix = Fix("safe", "break it", (Edit(at, end, "def ("),))
        return [Diagnostic("ACL101", "m", path, at, end, fix)]

    def analyze(source, path, codes, cache=None):
        try:
            return breaking(source, path, codes)
        except SyntaxError as exc:
            raise analysis.ParseFailure(exc.msg, exc.lineno or 1, 0) from None

    monkeypatch.setattr(analysis, "analyze_source", analyze)
    script = project / "train.py"
    script.write_text("loss.backward()\n")
    result = invoke("--fix")
    assert result.exit_code == 2
    assert script.read_text() == "loss.backward()\n"
    assert "error: train.py: a fix produced invalid syntax" in result.stderr


def test_codes_the_analysis_was_not_asked_for_are_dropped(project, monkeypatch, invoke):
    from linter import analysis
    from linter.types import Diagnostic, Position

    def chatty(source, path, codes, cache=None):
        at = Position(1, 0)
        return [Diagnostic(code, "m", path, at, at) for code in ("ACL101", "ACL303")]

    monkeypatch.setattr(analysis, "analyze_source", chatty)
    (project / "train.py").write_text("loss.backward()\n")
    result = invoke("--select", "ACL303", "--output-format", "concise")
    assert result.stdout.splitlines()[0] == "train.py:1:1: ACL303 m"
    assert "ACL101" not in result.stdout


def test_nested_config_applies_to_its_subtree(project, fake_rules, invoke):
    (project / "pyproject.toml").write_text('[tool.accel-lint]\nselect = ["ACL303"]\n')
    (project / "sub").mkdir()
    (project / "sub" / "accel-lint.toml").write_text('select = ["ACL101"]\n')
    (project / "top.py").write_text(CLIP)
    (project / "sub" / "inner.py").write_text(CLIP)
    lines = invoke("--output-format", "concise").stdout.splitlines()
    assert [line.split(": ")[1].split()[0] for line in lines[:2]] == ["ACL101", "ACL303"]
    assert lines[0].startswith(os.path.join("sub", "inner.py"))
    only = invoke("--config", "sub/accel-lint.toml", "--output-format", "concise").stdout
    assert "ACL303" not in only


def test_an_unwritable_file_is_an_error_not_a_crash(project, fake_rules, monkeypatch, invoke):
    import errno

    from linter import runner

    def read_only(path, data, expected=None):  # a read-only file system (root ignores chmod)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(runner, "write_atomic", read_only)
    (project / "other.py").write_text(BAD)
    (project / "train.py").write_text(FIXED)
    result = invoke("--fix", "--no-cache")
    assert result.exit_code == 2, result.output
    assert "error: other.py: cannot write fixes: Read-only file system" in result.stderr
    assert (project / "other.py").read_text() == BAD


def test_terminal_renderings_of_explain_and_list_rules(monkeypatch, capsys):
    """On a terminal --explain renders the markdown and --list-rules draws a table (via rich)."""
    from linter import command

    monkeypatch.setattr(command, "_colour", lambda stream: True)
    monkeypatch.setenv("COLUMNS", "200")
    command._explain("ACL101")
    explained = capsys.readouterr().out
    assert "ACL101 (raw-backward)" in explained and "## What it does" not in explained
    command._list_rules()
    table = capsys.readouterr().out
    assert "accel-lint rules" in table and "raw-backward" in table
