"""IPython syntax in code cells: masked by placeholders for the analysis, restored untouched after.

A line magic (`%timeit step()`), a shell line (`!pip install x`, `files = !ls`), help (`model?`,
`??model`) and an automagic `pip install` are not Python; each such line (with its backslash
continuations) becomes a placeholder statement with the same number of lines, so every other line
keeps its number and column. A cell magic whose body is Python (`%%time`, `%%capture` ...) masks
only its first line; any other cell magic (`%%bash`, `%%writefile`) makes the cell not Python.
Only lines at the start of a statement are considered: a `%` inside brackets is Python's modulo.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

# Cell magics that run their body as Python in the notebook's own namespace.
TRANSPARENT_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug"})
_CELL_MAGIC = re.compile(r"%%(\w+)")
_IPYTHON_LINE = re.compile(
    r"[!%?]"  # a magic, a shell command, help before a name
    r"|[A-Za-z_][\w.]*\?{1,2}\s*$"  # help after a name: model? / model.forward??
    r"|[A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*\s*=\s*[!%]"  # files = !ls
    r"|(?:pip|conda|mamba)\s+(?:install|uninstall)\b"  # automagic
)
_PLACEHOLDER = re.compile(r"^(?P<indent>[ \t]*)(?:pass  )?# accel-lint: ipython (?P<key>\d+)\+?$")
_NEEDS_TOKENIZER = re.compile(r"[\"'(\[{\\]")


@dataclass
class Masks:
    """The original lines behind each placeholder, by key (shared by all cells of a notebook)."""

    lines: dict[int, list[str]] = field(default_factory=dict)

    def placeholder(self, original: list[str]) -> list[str]:
        key = len(self.lines)
        self.lines[key] = original
        indent = _indent(original[0])
        first = f"{indent}pass  # accel-lint: ipython {key}"
        return [first] + [f"{indent}# accel-lint: ipython {key}+" for _ in original[1:]]

    def restore(self, text: str, keys: set[int]) -> str | None:
        """`text` with the original IPython lines back (re-indented if a fix moved them); None
        unless exactly the placeholders `keys` are there once each (a fix lost or copied one)."""
        out: list[str] = []
        seen: set[int] = set()
        for line in text.split("\n"):
            match = _PLACEHOLDER.match(line)
            if match is None:
                out.append(line)
                continue
            key = int(match.group("key"))
            if line.endswith("+"):
                continue  # a continuation: its text comes back with the first line
            if key in seen or key not in keys:
                return None
            seen.add(key)
            out += _reindent(self.lines[key], match.group("indent"))
        return "\n".join(out) if seen == keys else None

    def keys_in(self, text: str) -> set[int]:
        """The placeholders in a masked text."""
        found = (_PLACEHOLDER.match(line) for line in text.split("\n"))
        return {int(m.group("key")) for m in found if m and not m.group().endswith("+")}


def mask_cell(source: str, masks: Masks) -> str | None:
    """The cell as Python with its IPython lines masked; None for a cell that is not Python."""
    lines = source.split("\n")
    start = 0
    magic = _CELL_MAGIC.match(lines[0])
    if magic is not None:
        if magic.group(1) not in TRANSPARENT_CELL_MAGICS:
            return None
        lines[0:1] = masks.placeholder([lines[0]])
        start = 1
    out = lines[:start]
    pending: list[str] = []
    index = start
    while index < len(lines):
        line = lines[index]
        if not pending and _IPYTHON_LINE.match(line.lstrip()):
            end = _continued(lines, index)
            out += masks.placeholder(lines[index:end])
            index = end
            continue
        out.append(line)
        pending.append(line)
        if _complete(pending):
            pending = []
        index += 1
    return "\n".join(out)


def _continued(lines: list[str], index: int) -> int:
    """The index after an IPython line and its backslash continuations."""
    end = index + 1
    while lines[end - 1].endswith("\\") and end < len(lines):
        end += 1
    return end


def _complete(lines: list[str]) -> bool:
    """Whether these lines end a statement (no open bracket, string or backslash)."""
    if len(lines) == 1 and not _NEEDS_TOKENIZER.search(lines[0]):
        return True
    readline = io.StringIO("\n".join(lines) + "\n").readline
    try:
        for _ in tokenize.generate_tokens(readline):
            pass
    except tokenize.TokenError:
        return False
    except (SyntaxError, ValueError):
        return True  # invalid Python: the parser will say so; do not swallow later lines
    return True


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _reindent(original: list[str], indent: str) -> list[str]:
    """The original lines, shifted as a whole when a fix changed the first line's indent."""
    old = _indent(original[0])
    if indent == old:
        return original
    return [indent + line[len(old) :] if line.startswith(old) else line for line in original]
