"""Big files: analyse only the top-level statements a rule can reach.

A 2 MB generated module (protobuf descriptors, a model zoo, lookup tables, one traced function)
with a training loop at its end costs libcst and the model 10 to 30 s and half a gigabyte, and
Python's `ast` of the whole text alone holds 300 to 400 MB. From `screen.SCAN_FROM` characters on,
the text is read with `ast` a piece at a time (`scan`: each piece's tree is dropped once its
top-level statements are summarised), and the analysis is given a reduced text (`reduce`): the
statements that mention the rules' vocabulary, every statement binding a name those use (to a
fixpoint), their callers, and the module-level statements acting on what is kept. Every other
statement's lines are emptied, so the kept code keeps its lines and columns and every finding's
position holds in the original text. Fixes are mapped back by `Reduction.checked`: an edit that
touches an emptied line, or writes a name only the emptied code knows, is withheld.

Files under the threshold are analysed whole, exactly as before. The design and its numbers are
in `linter/model/README.md`.
"""

from __future__ import annotations

import ast
import enum
import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, replace

from linter.types import Diagnostic, Edit

# Characters of text parsed by `ast` at once: its tree holds ~200 bytes per character.
PIECE = 64 * 1024

# Lines as Python's tokenizer counts them (str.splitlines also splits at form feeds and others).
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
# A line that may start a statement at its indentation: not blank, a comment, a closing bracket
# or a clause that continues the statement before it. A wrong guess only makes a piece that does
# not parse (an open bracket, string or decorator at its end), which is then grown.
_CONTINUES = re.compile(r"[\s#)\]}]|(?:else|elif|except|finally)\b")
_DEFINITION = re.compile(r"(?:async[ \t]+def|def|class)[ \t]")
# The names a statement's text may use: identifiers not after a dot (attribute names are never
# module bindings). Strings and comments count too: keeping more is only slower.
_WORD = re.compile(r"(?<![.\w])[^\W\d]\w*")
_GLOBAL = re.compile(r"\bglobal[ \t]+([\w \t,]+)")
# What a rule can start from, as words of a statement's text (attribute names, strings and
# comments included; any case): training, precision, accumulation, distribution, evaluation,
# checkpoints, devices. A statement holding none of them is kept only when kept code needs it.
_VOCABULARY = re.compile(
    r"^(?:amp|grad|step|eval|train|half|dist|cuda|rank|ddp|reduce|loss\w*"
    r"|_?(?:val|valid|validation|validate|eval|evaluate|evaluation|test|dev)"
    r"(?:_\w*|s|loader|dataloader|dl|set|data|dataset|ds)?)$"
    r"|backward|autocast|scaler|clip_grad|zero_grad|no_grad|enable_grad|set_grad_enabled"
    r"|inference_mode|requires_grad|accelerat|no_sync|accumulat|sampler|set_epoch|loader"
    r"|custom_[fb]wd|weight_decay|optimi[sz]er|sched|warmup|num_training_steps|gather"
    r"|all_reduce|metric|accuracy|state_dict|checkpoint|save_state|prepare|deepspeed|fabric"
    r"|lightning|fsdp|fullyshard|fully_shard|distributed|world_size|local_rank|set_device"
    r"|init_process_group|float16|fp16|bf16|mixed_precision|criterion|trainer"
    r"|trainingarguments|guard",
    re.IGNORECASE,
)
# Facts the model reads from anywhere in the module (`eval_modes.mode_matters`: dropout or
# batch norm in the text; `losses`: a masking or padding keyword or name, or `-100`, anywhere
# in the tree): the first statement showing each is kept, so that the reduced text tells the
# same. Matched on words, as the vocabulary.
_ANYWHERE = (
    re.compile(r"dropout|batch_?norm", re.IGNORECASE),
    re.compile(
        r"^(?:ignore_index|label_pad_token_id|ignore_pad_token_for_loss|padding|padding_value"
        r"|pad_sequence|DataCollator\w+)$"
    ),
)
_MINUS_100 = re.compile(r"-\s*100\b")
# Lower-case parts, one of which every word matching the vocabulary or `_ANYWHERE` holds:
# found with `str.find` (a regex alternation tried at every character is 10 times slower).
_ANCHORS = (
    "backward", "autocast", "scaler", "grad", "inference_mode", "accelerat", "no_sync",
    "accumulat", "sampler", "set_epoch", "loader", "custom_", "weight_decay", "optimi", "sched",
    "warmup", "num_training_steps", "gather", "all_reduce", "metric", "accuracy", "state_dict",
    "checkpoint", "save_state", "prepare", "deepspeed", "fabric", "lightning", "fsdp",
    "fullyshard", "fully_shard", "distributed", "world_size", "local_rank", "set_device",
    "init_process_group", "fp16", "bf16", "float16", "mixed_precision", "criterion", "trainer",
    "trainingarguments", "guard", "amp", "step", "eval", "train", "half", "dist", "cuda", "rank",
    "ddp", "reduce", "loss", "val", "test", "dev", "dropout", "batchnorm", "batch_norm",
    "ignore_index", "label_pad_token_id", "ignore_pad_token_for_loss", "padding",
    "pad_sequence", "datacollator",
)  # fmt: skip


class Kind(enum.Enum):
    """How a top-level statement can matter to the kept code."""

    IMPORT = "import"  # always kept: cheap, and fixes place their imports among them
    DEFINITION = "definition"  # binds names only (def, class, `NAME = ...`): kept when used
    EFFECT = "effect"  # acts (a call, `x.a = 1`, a loop): kept when it touches kept names


@dataclass(frozen=True)
class Statement:
    """One top-level statement as the scan saw it (lines are 1-based, inclusive)."""

    first: int  # decorators included
    last: int
    kind: Kind
    binds: frozenset[str]


@dataclass(frozen=True)
class Scan:
    """The top-level statements of a text, and what the screen needs to judge its nesting
    (`linter.screen.scanned_problem`; this module does not import the screen, which calls it)."""

    statements: list[Statement]
    depth: int  # the deepest piece's, as `measure` counts it in the whole tree
    line: int  # where that chain starts
    limit: tuple[str, int] | None = None  # CPython's own nesting limit, met in a piece
    gave_up: bool = False  # CPython ran out of recursion or memory on a piece


Measure = Callable[[ast.AST], tuple[int, int]]  # a tree's nesting depth and the line it starts
Limit = Callable[[SyntaxError], "tuple[str, int] | None"]  # CPython's nesting limit, if that


class _Unscannable(Exception):
    """The pieces do not parse (a syntax error, or a cut `ast` would not take): the caller
    treats the whole text as before."""


def scan(text: str, measure: Measure, limit: Limit) -> Scan | None:
    """The top-level statements of `text`, read by `ast` a piece at a time, with the nesting
    the screen would measure in the whole tree; None where the pieces do not parse.

    The collector is paused: each piece's tree is freed by reference counting (it holds no
    cycles), and collections triggered by its allocations would only walk it again."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        return _Scanner(_LINES.findall(text), measure, limit).run()
    except _Unscannable:
        return None
    finally:
        if enabled:
            gc.enable()


class _Scanner:
    """Cuts at lines that may start a top-level statement; a piece that does not parse alone
    (the cut was inside a string, brackets or a decorated definition) is grown until it does."""

    def __init__(self, lines: list[str], measure: Measure, limit: Limit) -> None:
        self.lines, self.measure, self.limit = lines, measure, limit
        self.offsets = [0]
        for line in lines:
            self.offsets.append(self.offsets[-1] + len(line))
        self.statements: list[Statement] = []
        self.depth, self.deepest_line = 0, 1

    def run(self) -> Scan:
        starts = [0] + [i for i, line in enumerate(self.lines) if i and _starts(line, "")]
        bounds = [*starts, len(self.lines)]
        index = 0
        try:
            while index < len(starts):
                index = self._piece(bounds, index)
        except (RecursionError, MemoryError):
            return Scan([], 0, 1, gave_up=True)
        except _Limit as limit:
            return Scan([], 0, 1, limit=limit.problem)
        return Scan(self.statements, self.depth, self.deepest_line)

    def _piece(self, bounds: list[int], index: int) -> int:
        """Parse the piece starting at `bounds[index]`; returns the next piece's index."""
        first, stop = bounds[index], index + 1
        while stop < len(bounds) - 1 and self.lines[bounds[stop - 1]].startswith("@"):
            stop += 1  # a decorator belongs to the statement after it
        if self._size(first, bounds[stop]) > PIECE and self._definition(first, bounds[stop]):
            return stop
        end = stop  # whole statements up to a piece, a bigger one left to a piece of its own
        while end < len(bounds) - 1 and self._size(first, bounds[end]) < PIECE:
            if self._size(bounds[end], bounds[end + 1]) > PIECE:
                break
            end += 1
        while True:
            tree = self._parse(first, bounds[end])
            if tree is not None:
                self._record(tree.body, first)
                return end
            if end == len(bounds) - 1:
                raise _Unscannable  # a real syntax error: the whole text is judged as before
            end = self._grown(bounds, first, end + 1, 2 * self._size(first, bounds[end]))

    def _size(self, first: int, end: int) -> int:
        return self.offsets[end] - self.offsets[first]

    def _grown(self, bounds: list[int], first: int, end: int, size: int) -> int:
        """The first index from `end` on whose bound holds `size` characters from `first`
        (the last one if none): growing geometrically keeps the retries linear in all."""
        while end < len(bounds) - 1 and self._size(first, bounds[end]) < size:
            end += 1
        return end

    def _parse(self, first: int, end: int, stand_in: str = "") -> ast.Module | None:
        """The tree of lines `first` to `end` (after `stand_in`), its depth measured; None when
        they do not parse alone."""
        text = stand_in + "".join(self.lines[first:end])
        shift = first - (1 if stand_in else 0)  # the piece's line 1 is the stand-in's
        try:
            tree = compile(text, "<piece>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        except SyntaxError as error:
            problem = self.limit(error)
            if problem is not None:
                raise _Limit((problem[0], (error.lineno or 1) + shift)) from None
            return None
        except ValueError:
            raise _Unscannable from None  # a null byte: libcst words it
        depth, line = self.measure(tree)
        if depth > self.depth:
            self.depth, self.deepest_line = depth, line + shift
        return tree

    def _record(self, body: list[ast.stmt], shift: int) -> None:
        for node in body:
            decorators = getattr(node, "decorator_list", ())
            first = min([node.lineno] + [d.lineno for d in decorators]) + shift
            last = (node.end_lineno or node.lineno) + shift
            kind, binds = _summary(node, self.lines, first, last)
            self.statements.append(Statement(first, last, kind, binds))

    def _definition(self, first: int, last: int) -> bool:
        """Lines `first` to `last`, a `def` or `class` bigger than a piece (one generated
        function of thousands of statements), read a run of its body at a time inside a
        stand-in definition at the same nesting. False (nothing recorded) where the text is
        not such a definition or does not parse that way."""
        lines = self.lines
        header = next((i for i in range(first, last) if not lines[i].startswith("@")), last)
        match = _DEFINITION.match(lines[header]) if header < last else None
        if match is None:
            return False
        colon = next((i for i in range(header, min(last, header + 100)) if _colon(lines[i])), None)
        if colon is None:
            return False
        body = next((i for i in range(colon + 1, last) if _code(lines[i])), None)
        if body is None:
            return False
        indent = lines[body][: len(lines[body]) - len(lines[body].lstrip(" \t"))]
        if not indent:
            return False
        cuts = [i for i in range(body + 1, last) if _starts(lines[i], indent)]
        keyword = match.group().split()[0]
        stand_in = {"async": "async def _():\n", "def": "def _():\n"}.get(keyword, "class _:\n")
        return self._body_pieces(first, [*cuts, last], stand_in)

    def _body_pieces(self, first: int, cuts: list[int], stand_in: str) -> bool:
        """The definition from line `first`, parsed in pieces that end at some of `cuts` (the
        last is its end): the first with the header, the others in `stand_in`. Recorded as
        one statement; False where a piece does not parse alone."""
        start, end, head, last_line = first, 0, None, first
        while start < cuts[-1]:
            end = self._grown(cuts, start, end, PIECE)
            while True:
                tree = self._parse(start, cuts[end], "" if head is None else stand_in)
                if tree is not None:
                    break
                if end == len(cuts) - 1:
                    return False
                end = self._grown(cuts, start, end + 1, 2 * self._size(start, cuts[end]))
            node = tree.body[0] if len(tree.body) == 1 else None
            if not isinstance(node, _DEFINITIONS):
                return False
            if head is None:
                head, last_line = node, (node.end_lineno or node.lineno) + start
            else:
                last_line = (node.end_lineno or node.lineno) + start - 1
            start, end = cuts[end], end + 1
        decorators = getattr(head, "decorator_list", ())
        first_line = min([head.lineno] + [d.lineno for d in decorators]) + first
        binds = frozenset({head.name} | _globals(self.lines, first_line, last_line))
        self.statements.append(Statement(first_line, last_line, Kind.DEFINITION, binds))
        return True


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class _Limit(Exception):
    """CPython's own nesting limit, met in a piece."""

    def __init__(self, problem: tuple[str, int]) -> None:
        super().__init__(problem[0])
        self.problem = problem


def _starts(line: str, indent: str) -> bool:
    """Whether `line` may start a statement at exactly `indent`."""
    if not line.startswith(indent):
        return False
    rest = line[len(indent) :]
    return bool(rest) and _CONTINUES.match(rest) is None


def _colon(line: str) -> bool:
    """Whether the line (a definition's header) ends with its colon, comment aside."""
    return line.split("#", 1)[0].rstrip().endswith(":")


def _code(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _globals(lines: list[str], first: int, last: int) -> set[str]:
    """Names a definition's text declares `global` (an over-approximation: any such line)."""
    names: set[str] = set()
    for line in lines[first - 1 : last]:
        if "global" in line:
            for match in _GLOBAL.finditer(line):
                names.update(n.strip() for n in match.group(1).split(",") if n.strip())
    return names


def _summary(node: ast.stmt, lines: list[str], first: int, last: int):
    """The statement's kind and the module names it may bind."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return Kind.IMPORT, frozenset(_imported(node))
    if isinstance(node, _DEFINITIONS):
        return Kind.DEFINITION, frozenset({node.name} | _globals(lines, first, last))
    targets = _plain_targets(node)
    if targets is not None:
        return Kind.DEFINITION, frozenset(targets)
    return Kind.EFFECT, frozenset(_stored(node) | _globals(lines, first, last))


def _imported(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {a.asname or a.name for a in node.names if a.name != "*"}


def _plain_targets(node: ast.stmt) -> set[str] | None:
    """The names an assignment to names only binds; None for anything else (`x.a = 1` acts on
    `x`, so it is an effect)."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    elif type(node).__name__ == "TypeAlias":
        targets = [node.name]
    else:
        return None
    names: set[str] = set()
    stack = list(targets)
    while stack:
        target = stack.pop()
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            stack.extend(target.elts)
        elif isinstance(target, ast.Starred):
            stack.append(target.value)
        else:
            return None
    return names


def _stored(node: ast.AST) -> set[str]:
    """Every name stored or deleted anywhere in the statement, and the names its nested
    definitions and imports bind (more than the module binds: keeping more is only slower)."""
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load):
            names.add(child.id)
        elif isinstance(child, _DEFINITIONS):
            names.add(child.name)
        elif isinstance(child, (ast.Import, ast.ImportFrom)):
            names |= _imported(child)
        elif isinstance(child, ast.ExceptHandler) and child.name:
            names.add(child.name)
    return names


@dataclass(frozen=True)
class Reduction:
    """The text the analysis reads instead of a big module's, and how to map fixes back."""

    text: str  # the original with every dropped statement's lines emptied (endings kept)
    original: str
    skipped: int  # top-level statements dropped
    dropped: tuple[tuple[int, int], ...]  # their line ranges (1-based, inclusive), in order
    spans: tuple[tuple[int, int], ...]  # their character ranges in `original`, in order

    def checked(self, diagnostics: list[Diagnostic]) -> list[Diagnostic]:
        """The findings with each fix that would change or depend on dropped code withheld
        (the finding itself stays): applied to the original text, every kept fix does exactly
        what it does in the reduced text."""
        return [
            d if d.fix is None or self._keeps(d.fix.edits) else replace(d, fix=None)
            for d in diagnostics
        ]

    def _keeps(self, edits: tuple[Edit, ...]) -> bool:
        names = {name for edit in edits for name in _WORD.findall(edit.content)}
        return not any(self._touches(edit) for edit in edits) and not any(
            self._dropped_only(name) for name in names
        )

    def _touches(self, edit: Edit) -> bool:
        """Whether the edit changes, or inserts inside, a dropped statement's lines. An
        insertion at the start of a dropped statement lands between two statements in both
        texts, so it is kept."""
        start, end = edit.start, edit.end
        if start == end:
            found = self._range_of(start.line)
            return found is not None and (start.column > 0 or found[0] != start.line)
        last = end.line - 1 if end.column == 0 else end.line
        index = bisect_right(self.dropped, (last, _AFTER)) - 1
        return index >= 0 and self.dropped[index][1] >= start.line

    def _range_of(self, line: int) -> tuple[int, int] | None:
        index = bisect_right(self.dropped, (line, _AFTER)) - 1
        if index >= 0 and self.dropped[index][0] <= line <= self.dropped[index][1]:
            return self.dropped[index]
        return None

    def _dropped_only(self, name: str) -> bool:
        """Whether `name` occurs in dropped code and nowhere else: a fix writing it (a new
        variable, an import) could collide with code the analysis did not read."""
        starts = [start for start, _ in self.spans]
        inside = outside = False
        for position in _occurrences(self.original, name):
            index = bisect_right(starts, position) - 1
            if index >= 0 and position < self.spans[index][1]:
                inside = True
            else:
                outside = True
        return inside and not outside


_AFTER = float("inf")  # sorts after every column: (line, _AFTER) follows every range on `line`


def _occurrences(text: str, name: str, spans: tuple[int, int] | None = None):
    """Where `name` stands as a whole word in `text` (within `spans` when given), not after a
    dot (an attribute of that name binds or reads nothing at module level)."""
    start, end = spans if spans is not None else (0, len(text))
    size = len(name)
    position = text.find(name, start, end)
    while position >= 0:
        after = position + size
        before = text[position - 1] if position else " "
        if not (_is_word(before) or before == ".") and not (
            after < len(text) and _is_word(text[after])
        ):
            yield position
        position = text.find(name, after, end)


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def reduce(text: str, statements: list[Statement]) -> Reduction | None:
    """The reduced text of a module whose top-level statements are `statements`; None when
    every statement is kept (the text is then analysed as it is)."""
    lines = _LINES.findall(text)
    groups = _groups(statements)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    spans = [(offsets[g[0].first - 1], offsets[g[-1].last]) for g in groups]
    roots, witnesses = _classified(text, spans)
    selection = _Selection(text, spans, groups)
    kept = selection.kept(roots)
    for witness in witnesses:
        if not kept[witness]:
            roots[witness] = True
            kept = selection.kept(roots)
    if all(kept):
        return None
    dropped = []
    for group, span, keep in zip(groups, spans, kept, strict=True):
        if keep:
            continue
        dropped.append((group[0].first, group[-1].last, span))
        for index in range(group[0].first - 1, group[-1].last):
            line = lines[index]
            lines[index] = line[len(line.rstrip("\r\n")) :]
    skipped = sum(len(g) for g, keep in zip(groups, kept, strict=True) if not keep)
    ranges = tuple((first, last) for first, last, _ in dropped)
    places = tuple(span for _, _, span in dropped)
    return Reduction("".join(lines), text, skipped, ranges, places)


def _groups(statements: list[Statement]) -> list[list[Statement]]:
    """Statements sharing a line (`a = 1; b = 2`) are kept or dropped together."""
    groups: list[list[Statement]] = []
    for statement in statements:
        if groups and statement.first <= groups[-1][-1].last:
            groups[-1].append(statement)
        else:
            groups.append([statement])
    return groups


def _classified(text: str, spans: list[tuple[int, int]]) -> tuple[list[bool], list[int]]:
    """Which groups mention the rules' vocabulary, and the first group showing each fact of
    `_ANYWHERE` (each distinct word is matched once)."""
    lowered = text.lower()
    roots = [False] * len(spans)
    if len(lowered) != len(text):  # a character whose lower case is longer: all count
        return [True] * len(spans), []
    starts = [start for start, _ in spans]
    firsts: list[int | None] = [None] * len(_ANYWHERE)
    known: dict[str, int] = {}
    for anchor in _ANCHORS:
        position = lowered.find(anchor)
        while position >= 0:
            left, right = position, position + len(anchor)
            while left and _is_word(text[left - 1]):
                left -= 1
            while right < len(text) and _is_word(text[right]):
                right += 1
            index = bisect_right(starts, position) - 1
            if index >= 0 and position < spans[index][1]:
                word = text[left:right]
                flags = known.get(word)
                if flags is None:
                    flags = known[word] = _flags(word)
                roots[index] = roots[index] or bool(flags & 1)
                for bit in range(len(_ANYWHERE)):
                    if flags & (2 << bit) and (firsts[bit] is None or index < firsts[bit]):
                        firsts[bit] = index
            position = lowered.find(anchor, right)
    for match in _MINUS_100.finditer(text):
        index = bisect_right(starts, match.start()) - 1
        if index >= 0 and match.start() < spans[index][1]:
            firsts.append(index)
            break
    return roots, [first for first in firsts if first is not None]


def _flags(word: str) -> int:
    """Bit 0: a vocabulary word; bit 1 + i: the word shows `_ANYWHERE[i]`."""
    flags = int(_VOCABULARY.search(word) is not None)
    for bit, pattern in enumerate(_ANYWHERE):
        if pattern.search(word):
            flags |= 2 << bit
    return flags


class _Selection:
    """Which groups the analysis needs: the roots (the rules' vocabulary), every group binding
    a name a kept group uses, every group using a name a root binds (a caller, to a fixpoint)
    and every effect on a name a kept group binds. A group's names are read from its text
    only once it is kept; a name's users by searching the text for it."""

    def __init__(self, text: str, spans: list[tuple[int, int]], groups) -> None:
        self.text, self.spans, self.groups = text, spans, groups
        self.starts = [start for start, _ in spans]
        self.binders: dict[str, list[int]] = {}
        for index, group in enumerate(groups):
            for statement in group:
                for name in statement.binds:
                    self.binders.setdefault(name, []).append(index)
        self.effects = [any(s.kind is Kind.EFFECT for s in g) for g in groups]
        self._users: dict[str, list[int]] = {}
        self._uses: dict[int, frozenset[str]] = {}

    def kept(self, roots: list[bool]) -> list[bool]:
        kept = [all(s.kind is Kind.IMPORT for s in g) for g in self.groups]
        todo = [(index, True) for index, root in enumerate(roots) if root and not kept[index]]
        for index, _ in todo:
            kept[index] = True
        while todo:
            index, root = todo.pop()
            found = [(b, False) for name in self.uses(index) for b in self.binders.get(name, ())]
            for statement in self.groups[index]:
                if statement.kind is not Kind.IMPORT:
                    for name in statement.binds:
                        found += [(u, root) for u in self.users(name) if root or self.effects[u]]
            for other, as_root in found:
                if not kept[other]:
                    kept[other] = True
                    todo.append((other, as_root))
        return kept

    def uses(self, index: int) -> frozenset[str]:
        found = self._uses.get(index)
        if found is None:
            start, end = self.spans[index]
            found = self._uses[index] = frozenset(_WORD.findall(self.text, start, end))
        return found

    def users(self, name: str) -> list[int]:
        found = self._users.get(name)
        if found is None:
            found = []
            for position in _occurrences(self.text, name):
                index = bisect_right(self.starts, position) - 1
                if index >= 0 and position < self.spans[index][1]:
                    if not found or found[-1] != index:
                        found.append(index)
            self._users[name] = found
        return found


# The last text the screen scanned: the analysis that follows reads the same statements.
_last: tuple[str, Scan] | None = None


def remember(text: str, found: Scan) -> None:
    """Keep the screen's scan of `text` for the analysis (one text at a time)."""
    global _last
    _last = (text, found)


def scanned(text: str) -> Scan | None:
    """The screen's scan when it just scanned this very text (the same object), else None.
    Asked once: the statements are not kept after that."""
    global _last
    last, _last = _last, None
    return last[1] if last is not None and last[0] is text else None
