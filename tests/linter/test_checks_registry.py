"""`Rule.static` (what `--list-rules` and `--explain` say) matches the checks that exist."""

from __future__ import annotations

import pytest

from linter.checks import check_for
from rules import ALL_RULES, module_name


@pytest.mark.parametrize("code", sorted(ALL_RULES))
def test_static_flag_matches_a_check(code):
    has_check = check_for(module_name(code)) is not None
    assert ALL_RULES[code].static == has_check, (
        f"{code}: static={ALL_RULES[code].static}, check found: {has_check}"
    )


@pytest.mark.parametrize("code", sorted(c for c in ALL_RULES if ALL_RULES[c].static))
def test_every_check_states_what_it_receives(code):
    """`check(ctx: RuleContext)`: a contributor reads the rule API off the signature."""
    import inspect

    from linter.context import RuleContext

    check = check_for(module_name(code))
    hints = inspect.get_annotations(check, eval_str=True)
    assert hints == {"ctx": RuleContext, "return": None}
