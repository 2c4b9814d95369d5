"""`--show-loops` inside a project: each fact learnt from another module says where it came
from (that module's file and line), and the description lists what the context held."""

from __future__ import annotations

from linter.project.context import Context


def placed(value, context: Context):
    """The model's description of the combined text in the file's terms, plus `project`."""
    found = _placed(value, context)
    if isinstance(found, dict):
        found["project"] = {"from_other_modules": list(context.facts)}
        if context.notes:
            found["project"]["notes"] = list(context.notes)
    return found


def _placed(value, context: Context):
    if isinstance(value, list):
        return [_placed(item, context) for item in value]
    if isinstance(value, str):
        return context.words(value)
    if not isinstance(value, dict):
        return value
    out = {}
    where = None
    line = value.get("line")
    if isinstance(line, int) and not isinstance(line, bool):
        where = context.locate(line)
    for key, item in value.items():
        if where is not None and key == "line":
            out["file"], out["line"] = where
        elif where is not None and key == "file":
            continue
        else:
            out[key] = _placed(item, context)
    return out
