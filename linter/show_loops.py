"""`--show-loops FILE`: what the linter understood about each training loop, as a tree or JSON.

The model's own description (`describe_loops`) is shown as it is, so this view never drifts from
what the rules see.
"""

from __future__ import annotations

import json


def describe(path: str) -> dict:
    """Raises SourceError for an unreadable file, NotebookError for an unreadable notebook and
    ParseFailure for invalid Python (in a notebook, at a position of its program)."""
    from linter.analysis import describe_loops
    from linter.source import decode, read_bytes

    text = decode(read_bytes(path)).text
    if not path.endswith(".ipynb"):
        return describe_loops(text, path)
    from linter.notebooks import program_of

    program = program_of(text)  # the code cells as one program, as the rules see them
    return in_cells(describe_loops(program.text, path), program.index)


def in_cells(value, index):
    """The description with each program `line` given as the `cell` and the line in it."""
    from linter.types import Position

    if isinstance(value, list):
        return [in_cells(item, index) for item in value]
    if not isinstance(value, dict):
        return value
    placed = {}
    for key, item in value.items():
        if key == "line" and isinstance(item, int):
            cell, position = index.locate(Position(item, 0))
            if cell is not None:
                placed["cell"], item = cell, position.line
        placed[key] = in_cells(item, index)
    return placed


def as_json(description: dict) -> str:
    return json.dumps(description, indent=2, default=str) + "\n"


def as_tree(description: dict, title: str):
    from rich.tree import Tree

    tree = Tree(f"[bold]{_escape(title)}[/bold]")
    _add(tree, description)
    return tree


def _add(node, value) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                _add(node.add(f"[cyan]{_escape(str(key))}[/cyan]"), item)
            else:
                node.add(f"[cyan]{_escape(str(key))}[/cyan]: {_escape(_scalar(item))}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, (dict, list)) and item:
                _add(node.add(_label(item, index)), item)
            else:
                node.add(_escape(_scalar(item)))
    else:
        node.add(_escape(_scalar(value)))


def _label(item, index: int) -> str:
    """A list entry's title from its own facts (`for` loop at line 5), else its index."""
    if not isinstance(item, dict):
        return f"[dim]{index}[/dim]"
    words = [str(item[k]) for k in ("kind", "name") if isinstance(item.get(k), (str, int))]
    if "cell" in item:
        words.append(f"(cell {item['cell']}, line {item['line']})")
    elif "line" in item:
        words.append(f"(line {item['line']})")
    return f"[bold]{_escape(' '.join(words))}[/bold]" if words else f"[dim]{index}[/dim]"


def _scalar(value) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
