"""IPython syntax in code cells: masked by placeholders for the analysis, restored untouched after.

A line magic (`%timeit step()`), a shell line (`!pip install x`, `files = !ls`), help (`model?`,
`??model`) and an automagic (`pip install x`, `ls -l`: a magic's name without `%`, on a line that is
not Python by itself) are not Python; each such line (with its backslash
continuations) becomes a placeholder statement with the same number of lines, so every other line
keeps its number and column. A cell magic whose body is Python (`%%time`, `%%capture` ...) masks
only its first line; any other cell magic (`%%bash`, `%%writefile`) makes the cell not Python.
Only lines where a statement starts are considered (the tokenizer, fed line by line, says
where): a `%` inside brackets is Python's modulo.
"""

from __future__ import annotations

import ast
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
)
# IPython's automagics most seen in notebooks (the magic's name without its `%`).
_AUTOMAGIC = re.compile(
    r"(?:cat|cd|clear|conda|cp|env|history|less|load_ext|ls|man|matplotlib|mkdir|more|mv|pip"
    r"|pwd|reload_ext|rm|rmdir|run|set_env|who|whos)\s+\S"
)
_PLACEHOLDER = re.compile(r"^(?P<indent>[ \t]*)(?:pass  )?# accel-lint: ipython (?P<key>\d+)\+?$")


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
    masker = _Masker(lines, start, masks)
    try:  # one pass of the tokenizer, fed line by line: it knows where statements start
        for token in tokenize.generate_tokens(masker.readline):
            masker.saw(token)
    except (tokenize.TokenError, SyntaxError, ValueError):
        pass  # invalid Python: the parser will say where; the rest is masked line by line
    return "\n".join(masker.rest())


class _Masker:
    """Feeds a cell's lines to the tokenizer, masking an IPython line met at a statement start."""

    def __init__(self, lines: list[str], start: int, masks: Masks):
        self.lines, self.index, self.masks = lines, start, masks
        self.out = lines[:start]
        self.queue: list[str] = []  # lines taken, not yet handed to the tokenizer
        self.depth = 0  # open brackets
        self.last: int | None = None  # the type of the last token seen

    def readline(self) -> str:
        if not self.queue:
            if self.index >= len(self.lines):
                return ""
            self.queue = self._take(statement_start=self._at_statement_start())
            self.out += self.queue
        return self.queue.pop(0) + "\n"

    def _take(self, statement_start: bool) -> list[str]:
        line = self.lines[self.index]
        if statement_start and _is_ipython(line.lstrip()):
            end = _continued(self.lines, self.index)
            taken, self.index = self.lines[self.index : end], end
            return self.masks.placeholder(taken)
        self.index += 1
        return [line]

    def saw(self, token: tokenize.TokenInfo) -> None:
        if token.type == tokenize.OP and token.string in "([{":
            self.depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            self.depth = max(0, self.depth - 1)
        self.last = token.type

    def _at_statement_start(self) -> bool:
        """After a NEWLINE, or a blank or comment line outside brackets (never inside a string
        or after a backslash: the tokenizer then asks for a line before ending one)."""
        if self.last in (None, tokenize.NEWLINE):
            return True
        return self.last == tokenize.NL and self.depth == 0

    def rest(self) -> list[str]:
        """Every line: those the tokenizer did not reach (it stopped at an error) masked alone."""
        while self.index < len(self.lines):
            self.out += self._take(statement_start=True)
        return self.out


def _is_ipython(line: str) -> bool:
    if _IPYTHON_LINE.match(line):
        return True
    return _AUTOMAGIC.match(line) is not None and not _parses(line)


def _parses(line: str) -> bool:
    try:
        compile(line, "<cell>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _continued(lines: list[str], index: int) -> int:
    """The index after an IPython line and its backslash continuations."""
    end = index + 1
    while lines[end - 1].endswith("\\") and end < len(lines):
        end += 1
    return end


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _reindent(original: list[str], indent: str) -> list[str]:
    """The original lines, shifted as a whole when a fix changed the first line's indent."""
    old = _indent(original[0])
    if indent == old:
        return original
    return [indent + line[len(old) :] if line.startswith(old) else line for line in original]
