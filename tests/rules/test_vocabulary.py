"""One vocabulary in the rule docs (issue 25): the accumulation count is K, as in the messages.

The linter's and the guard's messages say "K=4" and "every K micro-steps"; a doc that says N for
the same count makes a reader wonder whether N and K are two numbers. World size is W.
"""

from __future__ import annotations

import re

import pytest

import rules
from rules._base import Rule

FENCED = re.compile(r"```.*?```", re.DOTALL)
# N meaning something other than the accumulation count ("N-D parallelism"): none in the docs
# today; a new one is named here rather than passing silently.
NOT_THE_COUNT = (re.compile(r"\bN-D\b"),)
N = re.compile(r"\bN\b")


def prose(rule: Rule) -> str:
    """What a reader sees as text: summary, hint and the docs without their fenced code blocks."""
    text = "\n".join((rule.summary, rule.hint, FENCED.sub("", rule.docs)))
    for allowed in NOT_THE_COUNT:
        text = allowed.sub("", text)
    return text


@pytest.mark.parametrize("code", sorted(rules.ALL_RULES))
def test_the_accumulation_count_is_k(code):
    text = prose(rules.get_rule(code))
    assert [line for line in text.splitlines() if N.search(line)] == []


@pytest.mark.parametrize("code", sorted(rules.ALL_RULES))
def test_the_update_step_has_one_name(code):
    """The step on which the optimizer updates is the "update step" (`Model.on_update_step`)."""
    text = prose(rules.get_rule(code))
    assert re.findall(r"\bsync steps?\b|optimizer-step branch", text) == []


def test_the_check_sees_the_docs():
    """Guards the check itself: an N in prose is caught, one inside a code block is not."""
    rule = rules.get_rule("ACL301")
    assert "K times" in prose(rule)
    assert N.search("gradients are N times too large")
    assert not N.search(FENCED.sub("", "```python\nloss / N\n```"))
    assert not N.search(NOT_THE_COUNT[0].sub("", "nor N-D parallelism"))
