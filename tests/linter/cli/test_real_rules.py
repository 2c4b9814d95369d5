"""End to end on the real analysis (no fake): the machinery around the shipped rules."""

import json

import pytest
from typer.testing import CliRunner

from linter.cli import app

BAD = """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for x, y in dl:
    with accelerator.accumulate(model):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
"""
FIXED = BAD.replace("loss.backward()", "accelerator.backward(loss)")


@pytest.fixture
def invoke(project):
    def run(*args: str):
        return CliRunner().invoke(app, ["--no-cache", *args])

    return run


def test_real_acl101_reported_and_fixed(project, invoke):
    script = project / "train.py"
    script.write_text(BAD)
    found = json.loads(invoke("--output-format", "json").stdout)
    assert [(d["code"], d["location"]["row"], d["fix"]["applicability"]) for d in found] == [
        ("ACL101", 8, "safe")
    ]
    assert invoke("--fix").exit_code == 0
    assert script.read_text() == FIXED
    assert invoke("--fix").exit_code == 0 and script.read_text() == FIXED


def test_real_fix_keeps_crlf(project, invoke):
    script = project / "train.py"
    script.write_bytes(BAD.replace("\n", "\r\n").encode())
    assert invoke("--fix").exit_code == 0
    assert script.read_bytes() == FIXED.replace("\n", "\r\n").encode()


def test_real_rule_noqa_and_ignore(project, invoke):
    (project / "train.py").write_text(BAD.replace("loss.backward()", "loss.backward()  # noqa"))
    assert invoke().exit_code == 0
    (project / "train.py").write_text(BAD)
    assert invoke("--ignore", "ACL1").exit_code == 0
    assert invoke("--select", "ACL101").exit_code == 1


def test_show_loops_json_and_tree(project, invoke):
    (project / "train.py").write_text(BAD)
    described = json.loads(invoke("--show-loops", "train.py", "--output-format", "json").stdout)
    from linter.analysis import describe_loops

    assert described == json.loads(json.dumps(describe_loops(BAD, "train.py")))
    tree = invoke("--show-loops", "train.py")
    assert tree.exit_code == 0 and tree.stdout.startswith("train.py\n")
    broken = project / "broken.py"
    broken.write_text("for x in (:\n")
    assert invoke("--show-loops", "broken.py").exit_code == 1
    assert invoke("--show-loops", "missing.py").exit_code == 2
