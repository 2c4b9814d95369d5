"""Selectors as in ruff: codes or prefixes, most specific wins, ignore wins a tie."""

import pytest

from linter.selection import SelectionError, resolve

CODES = ["ACL101", "ACL102", "ACL201", "ACL301", "ACL302", "ACL303", "ACL311"]


def test_prefix_selects_family():
    assert resolve(CODES, ["ACL3"]) == {"ACL301", "ACL302", "ACL303", "ACL311"}


def test_more_specific_ignore_beats_broad_select():
    assert resolve(CODES, ["ACL"], ["ACL30"]) == {"ACL101", "ACL102", "ACL201", "ACL311"}


def test_more_specific_select_beats_broad_ignore():
    assert resolve(CODES, ["ACL301"], ["ACL3"]) == {"ACL301"}
    assert resolve(CODES, ["ACL", "ACL303"], ["ACL3"]) == {"ACL101", "ACL102", "ACL201", "ACL303"}


def test_ignore_wins_at_equal_specificity():
    assert resolve(CODES, ["ACL301"], ["ACL301"]) == set()


def test_extend_select_adds_to_select():
    assert resolve(CODES, ["ACL1"], [], ["ACL201"]) == {"ACL101", "ACL102", "ACL201"}


def test_selectors_are_case_insensitive():
    assert resolve(CODES, ["acl2"]) == {"ACL201"}


@pytest.mark.parametrize("selector", ["ACL9", "E501", "ACL1011", ""])
def test_unknown_selector_is_an_error(selector):
    with pytest.raises(SelectionError):
        resolve(CODES, [selector])
