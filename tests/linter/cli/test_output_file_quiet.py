"""`--output-file PATH` writes the report there (never in colour); `--quiet` prints the findings
and nothing else (no summary, no "Fixed", no notes)."""

import json

BAD = "for b in dl:\n    loss.backward()\n    clip_grad_norm_(p, 1.0)\n"
CONCISE = "train.py:2:5: ACL101 [*] raw backward\ntrain.py:3:5: ACL303 clip per micro-step\n"


def test_output_file_gets_the_report_and_stdout_stays_empty(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    result = invoke("--no-cache", "--output-format", "json", "-o", "reports/lint.json")
    assert (result.exit_code, result.stdout) == (1, "")
    report = json.loads((project / "reports" / "lint.json").read_text())
    assert [(d["code"], d["location"]["row"]) for d in report] == [("ACL101", 2), ("ACL303", 3)]
    concise = invoke("--no-cache", "--output-format", "concise", "--output-file", "out.txt")
    assert (project / "out.txt").read_text() == (
        CONCISE + "Found 2 errors.\n[*] 1 fixable with `--fix` "
        "(1 unsafe fix available with `--fix --unsafe-fixes`).\n"
    )
    assert concise.stdout == ""


def test_colour_is_for_a_terminal_never_for_an_output_file(tmp_path, monkeypatch):
    from linter.output.printer import Printer

    class Terminal:
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert Printer().context(False, [], stream=Terminal()).colour
    assert not Printer(output_file=tmp_path / "r.txt").context(False, [], stream=Terminal()).colour
    monkeypatch.setenv("NO_COLOR", "1")
    assert not Printer().context(False, [], stream=Terminal()).colour


def test_an_unwritable_output_file_is_a_usage_error(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    (project / "taken").mkdir()
    result = invoke("--no-cache", "--output-file", "taken")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: cannot write taken: Is a directory")


def test_quiet_prints_only_the_findings(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    concise = invoke("--no-cache", "-q", "--output-format", "concise")
    assert (concise.exit_code, concise.stdout, concise.stderr) == (1, CONCISE, "")
    full = invoke("--no-cache", "--quiet", "--select", "ACL101")
    assert full.stdout.endswith("  +     accelerator.backward(loss)\n\n")
    assert "Found" not in full.stdout
    fixed = invoke("--no-cache", "--quiet", "--fix", "--output-format", "concise")
    assert (fixed.stdout, fixed.stderr) == ("train.py:3:5: ACL303 clip per micro-step\n", "")
    clean = invoke("--no-cache", "--quiet", "--select", "ACL101")
    assert (clean.exit_code, clean.stdout, clean.stderr) == (0, "", "")


def test_quiet_statistics_drop_the_summary(project, fake_rules, invoke):
    (project / "train.py").write_text(BAD)
    result = invoke("--no-cache", "--quiet", "--statistics")
    assert result.stdout == "1\tACL101\t[*] raw-backward\n1\tACL303\t[ ] per-microstep-clipping\n"
