"""`--output-format json`: a list of objects with ruff's keys and one more; ruff tooling reads it.

Keys: cell, code, configuration, end_location, filename (absolute), fix, location, message,
name, noqa_row, severity, url. `configuration` is accel-lint's own: null for a finding that does
not depend on the script's configuration, else `{condition, default_affected, knobs}`.
Locations are `{row, column}` with 1-based columns. In a notebook, as in ruff,
`cell` is the cell's 1-based number and every row (locations, edits, `noqa_row`) is in that cell.
"""

from __future__ import annotations

import json
import os

from linter.output import Context, column, placed, rule_name, rule_severity
from linter.types import Diagnostic, Position


def location(position: Position) -> dict:
    return {"column": column(position), "row": position.line}


def as_dict(diagnostic: Diagnostic, cell: int | None = None) -> dict:
    fix = None
    if diagnostic.fix is not None:
        fix = {
            "applicability": diagnostic.fix.applicability,
            "edits": [
                {
                    "content": edit.content,
                    "end_location": location(edit.end),
                    "location": location(edit.start),
                }
                for edit in diagnostic.fix.edits
            ],
            "message": diagnostic.fix.message,
        }
    return {
        "cell": cell,
        "code": diagnostic.code,
        "configuration": (
            diagnostic.configuration.as_dict() if diagnostic.configuration is not None else None
        ),
        "end_location": location(diagnostic.end),
        "filename": os.path.abspath(diagnostic.path),
        "fix": fix,
        "location": location(diagnostic.start),
        "message": diagnostic.message,
        "name": rule_name(diagnostic.code),
        "noqa_row": diagnostic.start.line,
        "severity": diagnostic.severity or rule_severity(diagnostic.code),
        "url": None,
    }


def render(diagnostics: list[Diagnostic], context: Context) -> str:
    items = [as_dict(shown, cell) for cell, shown in (placed(d, context) for d in diagnostics)]
    return json.dumps(items, indent=2) + "\n"
