"""A module's summary: its imports and top-level definitions, as small plain frozen data.

Read with Python's `ast` (a C parser: a module costs about a millisecond), cached by the
module's content hash. What a definition *does* to a training step is not decided here: the
context hands its text to the training-loop model, which reads it as it reads the file's own
functions, so the two can never disagree. A summary only says which definitions exist, where
(file and line), what they call, and whether they touch training at all (`relevant`).
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import re
from dataclasses import dataclass, replace
from functools import cached_property

# A definition worth handing to the model: it backpropagates, steps, scales, clips, syncs,
# wraps in DDP, reduces a loss, pads or ignores labels, or defines command-line defaults.
_RELEVANT = re.compile(
    r"backward\s*\(|\.step\s*\(|no_sync|GradScaler|\bscale\s*\(|unscale_|clip_grad|autocast"
    r"|DistributedDataParallel|\bDDP\b|add_argument|ignore_index|-100\b|reduction\s*="
    r"|cross_entropy|nll_loss|zero_grad|gradient_accumulation|accum"
)


@dataclass(frozen=True)
class Import:
    """`local` is the text the module uses: `misc` (import util.misc as misc), `util.misc`
    (import util.misc), `NativeScaler` (from util.misc import NativeScalerX as NativeScaler)."""

    local: str
    module: str  # absolute dotted name ("" only for an unresolvable relative import)
    name: str | None  # the imported name of a `from` import, None for `import`
    line: int
    end_line: int
    level: int = 0


@dataclass(frozen=True)
class Definition:
    name: str
    kind: str  # "function" | "class"
    first_line: int  # its first decorator's line, else `line`
    line: int  # the `def`/`class` line
    end_line: int
    calls: frozenset[str]  # dotted texts of the callees (`misc.ddp_sync`, `get_args_parser`)
    relevant: bool
    has_loop: bool


@dataclass(frozen=True)
class ModuleSummary:
    path: str
    digest: str  # of the module's bytes
    imports: tuple[Import, ...]
    definitions: tuple[Definition, ...]
    lines: tuple[str, ...]
    bound: frozenset[str] = frozenset()  # names its top level binds other than by importing
    error: str | None = None  # the module does not parse: nothing is learnt from it

    def definition(self, name: str) -> Definition | None:
        for found in self.definitions:
            if found.name == name:
                return found
        return None

    def text_of(self, definition: Definition) -> list[str]:
        return list(self.lines[definition.first_line - 1 : definition.end_line])

    @cached_property
    def key(self) -> str:
        """What importers' findings depend on: the definitions and imports, not the rest."""
        parts = [repr(self.imports), self.error or ""]
        for found in self.definitions:
            # `calls` sorted: a frozenset's repr follows string hashing, which differs per
            # process, and a key that changes every run invalidates every cached result.
            parts.append(repr(replace(found, calls=tuple(sorted(found.calls)))))
            parts.extend(self.text_of(found))
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def summarize(
    path: str, text: str, digest: str, package: str, tree: ast.Module | None = None
) -> ModuleSummary:
    """The summary of one module's text; `package` is the dotted package it lives in (for
    relative imports); `tree`, the text's `ast` when the caller has it (the screen's)."""
    lines = tuple(text.split("\n"))
    try:
        tree = ast.parse(text) if tree is None else tree
    except SyntaxError as error:
        problem = f"does not parse (line {error.lineno}: {error.msg})"
        return ModuleSummary(path, digest, (), (), lines, error=problem)
    except (ValueError, RecursionError, MemoryError) as error:
        problem = f"cannot be read ({type(error).__name__})"
        return ModuleSummary(path, digest, (), (), lines, error=problem)
    imports: list[Import] = []
    definitions: list[Definition] = []
    relevant_lines = _lines_of(text, _relevant_starts(text))
    bound: set[str] = set()
    for node in tree.body:
        bound.update(_bound_by(node))
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name
                imports.append(Import(local, alias.name, None, node.lineno, node.end_lineno))
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, package)
            for alias in node.names:
                if alias.name == "*":
                    continue
                local = alias.asname or alias.name
                end = node.end_lineno or node.lineno
                imports.append(Import(local, module, alias.name, node.lineno, end, node.level))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            definitions.append(_definition(node, lines, relevant_lines))
    definitions = _through_helpers(definitions)
    return ModuleSummary(path, digest, tuple(imports), tuple(definitions), lines, frozenset(bound))


def _through_helpers(definitions: list[Definition]) -> list[Definition]:
    """A definition that calls a relevant one of its module is relevant too (`get_args()`
    returning `get_args_parser().parse_args()`), to the depth the context follows."""
    from dataclasses import replace

    relevant = {d.name for d in definitions if d.relevant}
    return [
        d if d.relevant or not (d.calls & relevant) else replace(d, relevant=True)
        for d in definitions
    ]


# Each alternative of `_RELEVANT` begins with one of these words. Tried at every position of
# a module, the alternation was most of a summary's cost; a C search for the words finds the
# few places a match can start, and the pattern is tried there only (the same lines).
_RELEVANT_WORDS = (
    "backward", ".step", "no_sync", "GradScaler", "scale", "unscale_", "clip_grad", "autocast",
    "DistributedDataParallel", "DDP", "add_argument", "ignore_index", "-100", "reduction",
    "cross_entropy", "nll_loss", "zero_grad", "gradient_accumulation", "accum",
)  # fmt: skip


def _relevant_starts(text: str) -> list[int]:
    """Where `_RELEVANT` matches, in order."""
    found = []
    for word in _RELEVANT_WORDS:
        at = text.find(word)
        while at >= 0:
            if _RELEVANT.match(text, at):
                found.append(at)
            at = text.find(word, at + 1)
    return sorted(found)


def _lines_of(text: str, starts: list[int]) -> list[int]:
    """The line of each position (in order), counting newlines once over the text."""
    found, line, position = [], 1, 0
    for start in starts:
        line += text.count("\n", position, start)
        position = start
        found.append(line)
    return found


def _bound_by(node: ast.stmt) -> set[str]:
    """The names a top-level statement binds other than by an import (inside its `if`/`try`/
    `with` blocks too, not inside the functions and classes it defines)."""
    found, stack = set(), [node]
    while stack:
        sub = stack.pop()
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            found.add(sub.id)
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(sub.name)
            continue
        stack.extend(ast.iter_child_nodes(sub))
    return found


def _definition(node, lines: tuple[str, ...], relevant_lines: list[int]) -> Definition:
    """Read from the text, not by walking the tree (a walk of every definition of every
    imported module was most of the project's cost): what it calls, whether it loops."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    end = node.end_lineno or node.lineno
    body = "\n".join(lines[first - 1 : end])
    calls = frozenset(name[::-1] for name in _CALL_REVERSED.findall(body[::-1]))
    has_loop = _LOOP.search(body) is not None
    kind = "class" if isinstance(node, ast.ClassDef) else "function"
    at = bisect.bisect_left(relevant_lines, first)
    relevant = at < len(relevant_lines) and relevant_lines[at] <= end
    return Definition(node.name, kind, first, node.lineno, end, calls, relevant, has_loop)


# `(?<![\w.])([A-Za-z_][\w.]*)\s*\(` (a callee's dotted text) read over the reversed text:
# there the pattern starts with `(`, which a C search finds, where the original's first
# character class is tried at every position (seven times slower; the same callees).
_CALL_REVERSED = re.compile(r"\(\s*([\w.]*[A-Za-z_])(?![\w.])")
_LOOP = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:for|while)\b", re.M)


def _absolute(module: str | None, level: int, package: str) -> str:
    if level == 0:
        return module or ""
    base = package.split(".") if package else []
    if level - 1 > len(base):
        return ""
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])
