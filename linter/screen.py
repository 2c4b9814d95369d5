"""Screen a module with CPython's own parser before libcst sees it.

libcst's parser is superlinear on long chains (`a.b.b.b...`, `x + x + ...`: seconds at a thousand
links, minutes beyond) and overflows its native stack on very deep nesting (a segmentation fault
that would end the whole run, not just the file), and the model's visitors recurse once per level.
CPython builds its AST in linear time and reports its own limits as errors, so it measures the
nesting first: a module nested deeper than `MAX_NESTING` gets one ACL000 saying so and is not
analysed. Real code stays far below the limit.

A module larger than `MAX_BYTES` is not analysed either: libcst alone parses about 2.5 to 8 s
of CPU per megabyte (the more nodes per byte, the slower), so a 10 MB generated file would take
a minute or more (`bench/big_file.py` measures generated modules of several shapes).
The largest real file that mentions training among ~21,000 is 1.4 MB (torch's
`common_methods_invocations.py`).

A module CPython rejects with an ordinary syntax error is left to libcst: it may use syntax newer
than the running interpreter, which libcst parses.
"""

from __future__ import annotations

import ast

# Levels of nesting (the AST's depth, each operand of `a and b and ...` one level, as libcst nests
# them). The deepest of 19,782 real modules (torch, transformers, ~14,600 public training-script
# files) is 94 levels; libcst parses 400 in well under a second.
MAX_NESTING = 400
MAX_BYTES = 2 * 1024 * 1024
# CPython's own nesting limits, reached before its AST exists.
_CPYTHON_LIMITS = (
    "too many nested parentheses",
    "too many levels of indentation",
    "too many statically nested blocks",
)


def unanalysable(text: str, size: int, shown: str) -> tuple[str, int] | None:
    """Why a module of `size` bytes is not analysed (too large, too deep) and the line to
    report it at, or None."""
    if size > MAX_BYTES:
        return f"too large to analyse: {_mib(size)} (the limit is {_mib(MAX_BYTES)})", 1
    return nesting_problem(text, shown)


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


class Unanalysable(Exception):
    """A module the analysis must not be given (too large, too deep): one ACL000 at `line`."""

    def __init__(self, message: str, line: int = 1):
        super().__init__(message)
        self.message = message
        self.line = line


def nesting_problem(text: str, shown: str) -> tuple[str, int] | None:
    """Why `text` is too deeply nested to analyse and where, or None when it is fine (or when
    CPython rejects it for another reason)."""
    global _screened
    _screened = None
    if len(text) >= SCAN_FROM:  # a big text: its `ast` a piece at a time (linter.reduce)
        from linter import reduce

        found = reduce.scan(text, nesting_depth, parser_limit)
        if found is not None:  # else a piece does not parse: the whole text is screened below
            problem = scanned_problem(found)
            if problem is None:
                reduce.remember(text, found)
            return problem
    try:
        tree = compile(text, shown, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as error:
        return parser_limit(error)  # else libcst decides (newer syntax), and words the error
    except ValueError:
        return None  # e.g. a null byte: libcst reports it
    except (RecursionError, MemoryError):
        return GIVES_UP, 1
    problem = too_deep(tree)
    if problem is None:
        _screened = (text, tree)
    return problem


# From this size (characters) the screen and the analysis read a module's `ast` a piece at a
# time and analyse only what a rule can reach (`linter.reduce`): the whole tree would hold
# 300 to 400 MB for 2 MB of text.
SCAN_FROM = 256 * 1024


def scanned_problem(found) -> tuple[str, int] | None:
    """The screen's answer for a text read in pieces (a `linter.reduce.Scan`)."""
    if found.gave_up:
        return GIVES_UP, 1
    if found.limit is not None:
        return found.limit
    return _depth_problem(found.depth, found.line)


# The last text the screen passed and its `ast`: the analysis that follows needs the same tree
# (positions, big files' pieces), which would cost a second parse (a tenth of a lint).
_screened: tuple[str, ast.Module] | None = None


def screened(text: str) -> ast.Module | None:
    """The `ast` of `text` when it is the very text (the same object) the screen just passed;
    else None. Asked once: the tree is not kept after that."""
    global _screened
    last, _screened = _screened, None
    return last[1] if last is not None and last[0] is text else None


GIVES_UP = "too deeply nested to analyse: Python's own parser gives up on it"


def parser_limit(error: SyntaxError) -> tuple[str, int] | None:
    """The problem when CPython refused the text for its own nesting limits, else None."""
    if error.msg.startswith(_CPYTHON_LIMITS):
        return f"too deeply nested to analyse: {error.msg}", error.lineno or 1
    return None


def too_deep(tree: ast.AST) -> tuple[str, int] | None:
    """The problem when the (module or part of a module) tree nests beyond `MAX_NESTING`."""
    return _depth_problem(*nesting_depth(tree))


def _depth_problem(depth: int, line: int) -> tuple[str, int] | None:
    if depth > MAX_NESTING:
        return f"too deeply nested to analyse: {depth} levels (the limit is {MAX_NESTING})", line
    return None


def nesting_depth(tree: ast.AST) -> tuple[int, int]:
    """The deepest chain of nodes and the line of the statement it starts in, counted without
    recursion (the tree may be very deep)."""
    deepest, where = 0, 1
    stack = [(tree, 1, 1)]
    pop, push, node_type = stack.pop, stack.append, ast.AST
    while stack:
        node, depth, line = pop()
        if type(node) is ast.BoolOp:  # libcst nests `a and b and c` one operand per level
            depth += len(node.values) - 2
        if depth == 2 and isinstance(node, ast.stmt):
            line = node.lineno
        if depth > deepest:
            deepest, where = depth, line
        depth += 1
        # `ast.iter_child_nodes`, inlined: this visits every node of the module.
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, node_type):
                push((value, depth, line))
            elif type(value) is list:
                for item in value:
                    if isinstance(item, node_type):
                        push((item, depth, line))
    return deepest, where
