"""Turn `select` / `ignore` / `extend-select` selectors into the set of enabled codes, as ruff does.

A selector is a code or a prefix of one (`ACL`, `ACL3`, `ACL30`, `ACL301`). Selectors are applied
from least to most specific, so the most specific one wins; at equal specificity `ignore` wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# A file that cannot be read or parsed; always reported, like ruff's syntax errors.
PARSE_ERROR = "ACL000"


class SelectionError(ValueError):
    """A selector that matches no known code (a usage error: exit 2)."""


def normalise(selector: str) -> str:
    return selector.strip().upper()


def matching(selector: str, codes: Iterable[str]) -> set[str]:
    """The codes that `selector` names; raises SelectionError when it names none."""
    prefix = normalise(selector)
    found = {code for code in codes if code.startswith(prefix)} if prefix[:3] == "ACL" else set()
    if not found:
        raise SelectionError(f"unknown rule selector: `{selector}`")
    return found


def validate(selectors: Iterable[str], codes: Iterable[str]) -> None:
    known = list(codes)
    for selector in selectors:
        matching(selector, known)


def resolve(
    codes: Iterable[str],
    select: Sequence[str],
    ignore: Sequence[str] = (),
    extend_select: Sequence[str] = (),
) -> frozenset[str]:
    """The enabled codes among `codes` for the given selectors."""
    known = list(codes)
    steps = [(normalise(s), True) for s in (*select, *extend_select)]
    steps += [(normalise(s), False) for s in ignore]
    # Stable sort: by specificity, and at equal specificity selects before ignores.
    steps.sort(key=lambda step: (len(step[0]), not step[1]))
    enabled: set[str] = set()
    for selector, add in steps:
        chosen = matching(selector, known)
        enabled = enabled | chosen if add else enabled - chosen
    return frozenset(enabled)
