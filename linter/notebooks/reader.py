"""Read a notebook's JSON with the standard library; write back only the cell sources that changed.

The linter is installed by pre-commit into small environments, so it reads notebooks the way ruff
does, as plain JSON, rather than through nbformat (which brings jsonschema and traitlets). The JSON
is walked with the standard library's own decoder (`raw_decode`, `scanstring`) so each cell's
`source` value is known by its offsets in the file: a fix splices new values into the original
text, and outputs, execution counts, metadata and formatting stay byte-for-byte as they were.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from json.decoder import scanstring

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_LINE = re.compile(r"[^\n]*\n|[^\n]+$")


class NotebookError(Exception):
    """The file is not a notebook the linter can read; `line`/`column` locate a JSON error."""

    def __init__(self, message: str, line: int = 1, column: int = 0):
        super().__init__(message)
        self.line = line
        self.column = column


class _Shape(Exception):
    """The JSON is valid but not shaped like a notebook (or the walk met something unexpected)."""


@dataclass(frozen=True)
class Cell:
    number: int  # 1-based position among all the notebook's cells (ruff's `cell`)
    kind: str  # "code", "markdown", "raw"
    source: str
    span: tuple[int, int]  # offsets of the `source` value in the notebook's text


@dataclass(frozen=True)
class Notebook:
    text: str
    cells: tuple[Cell, ...]
    language: str | None  # metadata.language_info.name (or the kernelspec's language)

    @property
    def code_cells(self) -> list[Cell]:
        return [cell for cell in self.cells if cell.kind == "code"]


def parse(text: str) -> Notebook:
    """The notebook in `text`; raises NotebookError with a reason a user can act on."""
    try:
        return _parse(text)
    except (ValueError, _Shape) as walk_error:
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise NotebookError(f"not valid JSON: {exc.msg}", exc.lineno, exc.colno - 1) from None
        raise NotebookError(f"not a Jupyter notebook: {walk_error}") from None


def _parse(text: str) -> Notebook:
    top: dict[str, object] = {}
    cells: list[Cell] = []

    def member(key: str, start: int) -> int:
        if key == "cells":
            top["cells"] = True
            return _array(text, start, lambda at: _cell(text, at, cells))
        top[key], end = _DECODER.raw_decode(text, start)
        return end

    end = _object(text, _skip(text, 0), member)
    if text[end:].strip():
        raise _Shape("extra data after the notebook")
    if "cells" not in top and "worksheets" in top:
        raise _Shape("nbformat 3 notebooks are not supported (upgrade with `jupyter nbconvert`)")
    if "cells" not in top:
        raise _Shape("no `cells` list")
    return Notebook(text, tuple(cells), _language(top.get("metadata")))


def _language(metadata: object) -> str | None:
    if not isinstance(metadata, dict):
        return None
    info = metadata.get("language_info")
    if isinstance(info, dict) and isinstance(info.get("name"), str):
        return info["name"]
    kernel = metadata.get("kernelspec")
    if isinstance(kernel, dict) and isinstance(kernel.get("language"), str):
        return kernel["language"]
    return None


def _cell(text: str, start: int, cells: list[Cell]) -> int:
    fields: dict[str, tuple[object, int, int]] = {}

    def member(key: str, at: int) -> int:
        value, end = _DECODER.raw_decode(text, at)
        fields[key] = (value, at, end)
        return end

    end = _object(text, start, member)
    kind = fields.get("cell_type", (None,))[0]
    if not isinstance(kind, str) or "source" not in fields:
        raise _Shape(f"cell {len(cells) + 1} has no `cell_type` or no `source`")
    source, value_start, value_end = fields["source"]
    if isinstance(source, list) and all(isinstance(line, str) for line in source):
        source = "".join(source)
    if not isinstance(source, str):
        raise _Shape(f"cell {len(cells) + 1}: `source` is not text")
    cells.append(Cell(len(cells) + 1, kind, source, (value_start, value_end)))
    return end


def _skip(text: str, at: int) -> int:
    return _WHITESPACE.match(text, at).end()


def _expect(text: str, at: int, char: str) -> int:
    at = _skip(text, at)
    if not text.startswith(char, at):
        raise _Shape(f"expected `{char}` at offset {at}")
    return at + 1


def _object(text: str, at: int, member: Callable[[str, int], int]) -> int:
    """Walk the object at `at`; `member(key, value_start)` returns the offset after the value."""
    at = _expect(text, at, "{")
    if text.startswith("}", _skip(text, at)):
        return _skip(text, at) + 1
    while True:
        key, at = scanstring(text, _expect(text, at, '"'))
        at = _skip(text, _expect(text, at, ":"))
        at = _skip(text, member(key, at))
        if not text.startswith(",", at):
            return _expect(text, at, "}")
        at += 1


def _array(text: str, at: int, item: Callable[[int], int]) -> int:
    at = _expect(text, at, "[")
    if text.startswith("]", _skip(text, at)):
        return _skip(text, at) + 1
    while True:
        at = _skip(text, item(_skip(text, at)))
        if not text.startswith(",", at):
            return _expect(text, at, "]")
        at += 1


def replace_sources(notebook: Notebook, sources: Mapping[int, str]) -> str:
    """The notebook's text with the given cells' sources replaced, every other byte kept."""
    text = notebook.text
    by_number = {cell.number: cell for cell in notebook.cells}
    ascii_only = text.isascii() and "\\u" in text
    for number in sorted(sources, reverse=True):
        cell = by_number[number]
        start, end = cell.span
        value = _source_value(sources[number], text[start:end], ascii_only)
        text = text[:start] + value + text[end:]
    return text


def _source_value(source: str, old: str, ascii_only: bool) -> str:
    """The JSON for a new `source`, laid out as the old value was (a string or a list of lines)."""
    if old.startswith('"'):
        return json.dumps(source, ensure_ascii=ascii_only)
    items = [json.dumps(line, ensure_ascii=ascii_only) for line in _LINE.findall(source)]
    if not items:
        return "[]"
    if "\n" not in old:
        return "[" + ", ".join(items) + "]"
    indent, closing = _list_layout(old)
    return "[\n" + ",\n".join(indent + item for item in items) + "\n" + closing + "]"


def _list_layout(old: str) -> tuple[str, str]:
    """The indentation of a multi-line list's items and of its closing bracket."""
    closing = old[old.rfind("\n") + 1 : -1]
    first = _WHITESPACE.match(old, 1).group()
    if "\n" in first and old[1 + len(first)] != "]":
        return first[first.rfind("\n") + 1 :], closing
    return closing + (closing[:1] or " "), closing  # an empty list spread over lines
