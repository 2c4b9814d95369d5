"""`--output-format sarif`: a SARIF 2.1.0 log shaped like ruff's, rules taken from the catalogue.

In a notebook the region's lines are those of the cell, whose 1-based number is the result's
`properties.cell` (SARIF has no notion of cells; a property bag is its place for tool facts);
`properties.configuration` says which runs a configuration-dependent finding affects.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from linter import __version__
from linter.output import Context, column, placed
from linter.types import Diagnostic, Edit

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def _uri(path: str) -> str:
    return Path(os.path.abspath(path)).as_uri()


def _region(start, end) -> dict:
    return {
        "endColumn": column(end),
        "endLine": end.line,
        "startColumn": column(start),
        "startLine": start.line,
    }


def _replacement(edit: Edit) -> dict:
    replacement: dict = {"deletedRegion": _region(edit.start, edit.end)}
    if edit.content:
        replacement["insertedContent"] = {"text": edit.content}
    return replacement


def _level(code: str) -> str:
    from rules import ALL_RULES

    rule = ALL_RULES.get(code)
    return _LEVELS[rule.severity] if rule else "error"


def result(diagnostic: Diagnostic, cell: int | None = None) -> dict:
    artifact = {"uri": _uri(diagnostic.path)}
    entry: dict = {
        "level": _LEVELS[diagnostic.severity] if diagnostic.severity else _level(diagnostic.code),
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": artifact,
                    "region": _region(diagnostic.start, diagnostic.end),
                }
            }
        ],
        "message": {"text": diagnostic.message},
        "ruleId": diagnostic.code,
    }
    if diagnostic.fix is not None:
        changes = [{"artifactLocation": artifact, "replacements": []}]
        changes[0]["replacements"] = [_replacement(e) for e in diagnostic.fix.edits]
        entry["fixes"] = [
            {"artifactChanges": changes, "description": {"text": diagnostic.fix.message}}
        ]
    properties: dict = {}
    if cell is not None:
        properties["cell"] = cell
    if diagnostic.configuration is not None:
        properties["configuration"] = diagnostic.configuration.as_dict()
    if properties:
        entry["properties"] = properties
    return entry


def rule_descriptor(code: str) -> dict | None:
    from rules import ALL_RULES

    rule = ALL_RULES.get(code)
    if rule is None:
        return None
    return {
        "defaultConfiguration": {"enabled": True, "level": _LEVELS[rule.severity]},
        "fullDescription": {"text": rule.docs},
        "help": {"text": rule.summary},
        "id": rule.code,
        "properties": {"id": rule.code, "name": rule.name, "problem.severity": rule.severity},
        "shortDescription": {"text": rule.summary},
    }


def log(diagnostics: list[Diagnostic], context: Context | None = None) -> dict:
    context = context or Context()
    results = [result(shown, cell) for cell, shown in (placed(d, context) for d in diagnostics)]
    codes = sorted({d.code for d in diagnostics})
    rules = [r for r in map(rule_descriptor, codes) if r is not None]
    driver = {
        "name": "accel-lint",
        "rules": rules,
        "version": __version__,
    }
    return {
        "$schema": SCHEMA,
        "runs": [{"results": results, "tool": {"driver": driver}}],
        "version": "2.1.0",
    }


def render(diagnostics: list[Diagnostic], context: Context) -> str:
    return json.dumps(log(diagnostics, context), indent=2) + "\n"
