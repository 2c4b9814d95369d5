"""Every output format says which runs a configuration-dependent finding affects, the cache
keeps it, and the severity policy lowers a latent error to a warning (never to a hint)."""

from __future__ import annotations

import json

from linter.output import Context, concise, full, github, json_format, sarif, summary
from linter.types import Configuration, Diagnostic, Position, latent_severity

LATENT = Configuration(
    False, "with --gradient_accumulation_steps > 1 (default 1)", ("gradient_accumulation_steps",)
)
DEFAULT = Configuration(
    True, "with --gradient_accumulation_steps > 1 (default 4)", ("gradient_accumulation_steps",)
)
MESSAGE = "loss is backpropagated undivided under a manual accumulation gate"


def finding(configuration, severity=None) -> Diagnostic:
    severity = latent_severity(configuration, severity)
    at, end = Position(3, 4), Position(3, 19)
    return Diagnostic("ACL301", MESSAGE, "nowhere.py", at, end, None, (), severity, configuration)


def test_latent_error_is_a_warning_default_affected_keeps_its_level():
    assert finding(LATENT).severity == "warning"
    assert finding(DEFAULT).severity is None  # the rule's own: ACL301 is an error
    assert finding(None).severity is None


def test_a_latent_warning_stays_a_warning_and_a_hint_never_absorbs_it():
    assert latent_severity(LATENT, "warning") == "warning"
    assert latent_severity(LATENT, None) == "warning"
    assert latent_severity(LATENT, "info") == "info"  # a check's own hint stays a hint
    assert latent_severity(DEFAULT, "info") == "info"


def test_summary_counts_a_latent_error_as_a_warning():
    text = summary([finding(LATENT), finding(DEFAULT)], Context())
    assert text.splitlines()[0] == "Found 1 error and 1 warning."


def test_full_has_a_config_line():
    text = full.render([finding(LATENT), finding(DEFAULT), finding(None)], Context(quiet=True))
    assert text.count("= config:") == 2
    assert (
        " = config: latent: only with --gradient_accumulation_steps > 1 (default 1); "
        "the default configuration is not affected\n"
    ) in text
    assert (
        " = config: the default configuration is affected "
        "(with --gradient_accumulation_steps > 1 (default 4))\n"
    ) in text


def test_concise_has_a_suffix():
    lines = concise.render([finding(LATENT), finding(DEFAULT), finding(None)], Context())
    assert lines.splitlines() == [
        f"nowhere.py:3:5: ACL301 {MESSAGE} "
        "[latent: with --gradient_accumulation_steps > 1 (default 1)]",
        f"nowhere.py:3:5: ACL301 {MESSAGE} "
        "[default config: with --gradient_accumulation_steps > 1 (default 4)]",
        f"nowhere.py:3:5: ACL301 {MESSAGE}",
    ]


def test_json_has_a_structured_field_null_when_independent():
    items = json.loads(json_format.render([finding(LATENT), finding(None)], Context()))
    assert items[0]["configuration"] == {
        "condition": "with --gradient_accumulation_steps > 1 (default 1)",
        "default_affected": False,
        "knobs": ["gradient_accumulation_steps"],
    }
    assert items[0]["severity"] == "warning"
    assert items[1]["configuration"] is None and items[1]["severity"] == "error"


def test_sarif_properties_and_level():
    log = sarif.log([finding(LATENT), finding(None)])
    latent, plain = log["runs"][0]["results"]
    assert latent["level"] == "warning"
    assert latent["properties"]["configuration"]["default_affected"] is False
    assert plain["level"] == "error" and "properties" not in plain


def test_github_annotation_says_it():
    line = github.line(finding(LATENT))
    assert line.startswith("::warning title=accel-lint (ACL301)")
    assert line.endswith(
        f"::ACL301 {MESSAGE} (latent: only with --gradient_accumulation_steps > 1 "
        "(default 1); the default configuration is not affected)"
    )


def test_language_server_message_severity_and_data():
    from lsprotocol import types
    from pygls.workspace import PositionCodec

    from linter.server.convert import Lines, to_lsp

    lines = Lines("a\nb\n    loss.backward()\n", PositionCodec())
    shown = to_lsp(finding(LATENT), lines)
    assert shown.severity == types.DiagnosticSeverity.Warning
    assert shown.message.splitlines() == [
        MESSAGE,
        "latent: only with --gradient_accumulation_steps > 1 (default 1); "
        "the default configuration is not affected",
    ]
    assert shown.data == {"configuration": LATENT.as_dict()}
    assert to_lsp(finding(None), lines).data is None


def test_cache_round_trips_the_configuration():
    from linter.cache import _decode, _encode

    items = [finding(LATENT), finding(DEFAULT), finding(None)]
    encoded = json.loads(json.dumps([_encode(d) for d in items]))
    assert _decode(encoded, "nowhere.py") == items


def test_explain_states_the_policy_for_every_rule():
    from linter.explain import CONFIGURATION_POLICY, explain_markdown

    for code in ("ACL101", "ACL301", "ACL504"):
        assert explain_markdown(code).endswith("\n\n" + CONFIGURATION_POLICY)
    assert "an error becomes a\nwarning" in CONFIGURATION_POLICY
    assert "never hold latent findings" in CONFIGURATION_POLICY


def test_show_loops_shows_the_configuration_space_and_ks_setting(tmp_path):
    from linter.analysis import describe_loops

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "bad.yaml").write_text("lr: [1\n")
    source = (
        "import argparse\n"
        "import yaml\n"
        "parser = argparse.ArgumentParser()\n"
        'parser.add_argument("--grad-accum", type=int, default=1)\n'
        'parser.add_argument("--dtype", default="bf16", choices=["fp16", "bf16"])\n'
        "args = parser.parse_args()\n"
        'extra = yaml.safe_load(open("configs/bad.yaml"))\n'
        "for i, (x, y) in enumerate(loader):\n"
        "    crit(model(x), y).backward()\n"
        "    if (i + 1) % args.grad_accum == 0:\n"
        "        opt.step()\n"
        "        opt.zero_grad()\n"
    )
    path = str(tmp_path / "train.py")
    described = describe_loops(source, path)
    space = described["configuration"]
    assert space["knobs"] == [
        {
            "name": "grad_accum",
            "spelling": "--grad-accum",
            "default": 1,
            "choices": None,
            "source": "argparse",
            "line": 4,
        },
        {
            "name": "dtype",
            "spelling": "--dtype",
            "default": "bf16",
            "choices": ["fp16", "bf16"],
            "source": "argparse",
            "line": 5,
        },
    ]
    (note,) = space["notes"]
    assert note.startswith("configs/bad.yaml: does not parse as YAML (")
    (loop,) = described["loops"]
    assert loop["accumulation"]["setting"] == "with --grad-accum > 1 (default 1)"
