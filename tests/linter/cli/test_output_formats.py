"""Every --output-format on the same findings: exact text, ruff's JSON keys, valid SARIF."""

import json
import os

BAD = "for batch in dl:\n    loss = model(batch)\n    loss.backward()\n    clip_grad_norm_(p, 1)\n"
RUFF_JSON_KEYS = {
    "cell", "code", "end_location", "filename", "fix", "location", "message", "name", "noqa_row",
    "severity", "url",
    "configuration",  # accel-lint's own: which runs the finding affects
}  # fmt: skip


def lint(project, invoke, *args):
    (project / "train.py").write_text(BAD)
    return invoke("--no-cache", *args)


def test_full_shows_excerpt_caret_fix_preview_and_summary(project, fake_rules, invoke):
    result = lint(project, invoke)
    assert result.exit_code == 1
    assert result.stdout.startswith(
        "train.py:3:5: ACL101 [*] raw backward\n"
        "  |\n"
        "2 |     loss = model(batch)\n"
        "3 |     loss.backward()\n"
        "  |     ^^^^^^^^^^^^^^^\n"
        "4 |     clip_grad_norm_(p, 1)\n"
        "  |\n"
        "  = help: Use `accelerator.backward(loss)`\n"
        "  -     loss.backward()\n"
        "  +     accelerator.backward(loss)\n"
        "\n"
        "train.py:4:5: ACL303 clip per micro-step\n"
    )
    assert (
        "  = help: Comment out the clip (unsafe)\n"
        "  -     clip_grad_norm_(p, 1)\n"
        "  +     # clip_grad_norm_(p, 1)\n"
    ) in result.stdout
    assert result.stdout.endswith(
        "Found 2 errors.\n[*] 1 fixable with `--fix` (1 unsafe fix available with "
        "`--fix --unsafe-fixes`).\n"
    )
    assert "\x1b[" not in result.stdout  # not a terminal: no colour


def test_full_colour_only_on_a_terminal_without_no_color(monkeypatch):
    from linter import command

    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert command._colour(Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not command._colour(Tty())


def test_full_with_colour_has_ansi_codes_around_the_same_text():
    from linter.output import Context, full
    from linter.types import Diagnostic, Position

    diagnostic = Diagnostic("ACL101", "msg", "nowhere.py", Position(1, 0), Position(1, 3))
    plain = full.render([diagnostic], Context(colour=False))
    coloured = full.render([diagnostic], Context(colour=True))
    assert "\x1b[" in coloured
    import re

    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == plain


def test_concise(project, fake_rules, invoke):
    result = lint(project, invoke, "--output-format", "concise")
    assert result.stdout.splitlines()[:2] == [
        "train.py:3:5: ACL101 [*] raw backward",
        "train.py:4:5: ACL303 clip per micro-step",
    ]


def test_json_has_ruffs_keys_and_one_based_columns(project, fake_rules, invoke):
    result = lint(project, invoke, "--output-format", "json")
    items = json.loads(result.stdout)
    assert [set(item) for item in items] == [RUFF_JSON_KEYS, RUFF_JSON_KEYS]
    first = items[0]
    assert first["code"] == "ACL101" and first["name"] == "raw-backward"
    assert first["filename"] == os.path.join(str(project.resolve()), "train.py")
    assert first["location"] == {"row": 3, "column": 5}
    assert first["end_location"] == {"row": 3, "column": 20}
    assert first["noqa_row"] == 3 and first["url"] is None
    assert first["fix"] == {
        "applicability": "safe",
        "message": "Use `accelerator.backward(loss)`",
        "edits": [
            {
                "content": "accelerator.backward(loss)",
                "location": {"row": 3, "column": 5},
                "end_location": {"row": 3, "column": 20},
            }
        ],
    }
    assert items[1]["fix"]["applicability"] == "unsafe"


def test_json_empty_list_when_clean(project, fake_rules, invoke):
    (project / "train.py").write_text("x = 1\n")
    assert json.loads(invoke("--output-format", "json").stdout) == []


def test_github_annotations(project, fake_rules, invoke):
    result = lint(project, invoke, "--output-format", "github")
    path = os.path.join(str(project.resolve()), "train.py")
    assert result.stdout.splitlines()[0] == (
        f"::error title=accel-lint (ACL101),file={path},line=3,col=5,endLine=3,endColumn=20"
        "::ACL101 raw backward"
    )


def test_github_escapes_workflow_command_characters():
    from linter.output import github
    from linter.types import Diagnostic, Position

    at = Position(1, 0)
    line = github.line(Diagnostic("ACL101", "50% off\nnext", "a,b:c.py", at, at))
    assert line.endswith("::ACL101 50%25 off%0Anext")
    assert "a%2Cb%3Ac.py" in line


def test_sarif_log_is_valid_2_1_0(project, fake_rules, invoke):
    from rules import ALL_RULES

    log = json.loads(lint(project, invoke, "--output-format", "sarif").stdout)
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "accel-lint"
    assert [r["id"] for r in driver["rules"]] == ["ACL101", "ACL303"]
    assert driver["rules"][0]["fullDescription"]["text"] == ALL_RULES["ACL101"].docs
    result = run["results"][0]
    assert result["ruleId"] == "ACL101" and result["level"] == "error"
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == (project.resolve() / "train.py").as_uri()
    assert location["region"] == {"startLine": 3, "startColumn": 5, "endLine": 3, "endColumn": 20}
    replacement = result["fixes"][0]["artifactChanges"][0]["replacements"][0]
    assert replacement["insertedContent"] == {"text": "accelerator.backward(loss)"}


def test_a_hint_keeps_its_own_severity_in_json_sarif_and_the_cache():
    """ACL305's unchecked step after a GradScaler step is a hint of an error-level rule."""
    from linter.analysis import analyze_source
    from linter.cache import _decode_one, _encode
    from linter.output import json_format, sarif

    source = (
        "import torch\n"
        "scaler = torch.amp.GradScaler('cuda')\n"
        "for x, y in dl:\n"
        "    scaler.scale(crit(model(x), y)).backward()\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n"
        "    sched.step()\n"
        "    opt.zero_grad()\n"
    )
    (hint,) = analyze_source(source, "t.py", ["ACL305"])
    assert hint.severity == "info" and hint.message.startswith("hint:")
    assert json_format.as_dict(hint)["severity"] == "info"
    assert sarif.result(hint)["level"] == "note"
    assert _decode_one(_encode(hint), "t.py") == hint
