"""`--statistics`: how many diagnostics of each code, most frequent first (like ruff)."""

from __future__ import annotations

import json
from collections import Counter

from linter.output import Context, fixable, rule_name
from linter.types import Diagnostic


def rows(diagnostics: list[Diagnostic], context: Context) -> list[dict]:
    counts = Counter(d.code for d in diagnostics)
    fixable_counts = Counter(d.code for d in diagnostics if fixable(d, context))
    ordered = sorted(counts, key=lambda code: (-counts[code], code))
    return [
        {
            "code": code,
            "name": rule_name(code),
            "count": counts[code],
            "fixable": fixable_counts[code] == counts[code],
            "fixable_count": fixable_counts[code],
        }
        for code in ordered
    ]


def _marker(row: dict) -> str:
    return "[*]" if row["fixable"] else "[ ]"


def render(diagnostics: list[Diagnostic], context: Context, as_json: bool = False) -> str:
    table = rows(diagnostics, context)
    if as_json:
        return json.dumps(table, indent=2) + "\n"
    if not table:
        return ""
    width = max(len(str(row["count"])) for row in table)
    lines = [
        f"{row['count']:>{width}}\t{row['code']}\t{_marker(row)} {row['name']}" for row in table
    ]
    return "\n".join(lines) + "\n"
