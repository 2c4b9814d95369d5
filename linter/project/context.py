"""A file's context in its project: the other modules' definitions its training step uses.

Two directions, both bounded:
- what the file imports from the project (`from util.misc import NativeScaler`, `import
  util.misc as misc` then `misc.ddp_sync(...)`, `from .losses import masked_loss`): the
  definitions it names, and the same module's definitions those call (depth 2);
- who calls the file's own loop functions from another module of the project (`main.py`
  calling `engine.train_one_epoch(model, ...)` after `model = DDP(model)`): those callers,
  with what they import from the project in turn.

The context is appended after the file as plain Python; the file's own text keeps every
position (a module attribute `misc.ddp_sync` is read as the same-length `misc_ddp_sync`, the
name the appended copy gets). Nothing found in the context is reported: findings and fixes stay
in the file, and a message that names a line of the context names the other file instead.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from linter.project.resolve import Modules
from linter.project.store import Store
from linter.project.summary import Definition, ModuleSummary, summarize

MAX_MODULE_BYTES = 1_000_000  # a bigger module is not read (generated code, data)
MAX_PROJECT_FILES = 20_000  # files the importer index reads at most
MAX_CALLERS = 4  # modules whose calls of the file's functions are followed
MAX_CONTEXT_LINES = 1_500  # lines appended at most
MAX_DEFINITION_LINES = 400  # a longer definition (a whole pipeline class) stays opaque
# an argparse function is long and flat (one add_argument after another) and holds the
# configuration's defaults: read whole up to this length
MAX_PARSER_LINES = 1_200
MAX_DEPTH = 2  # a definition's own helpers are followed once
HEADER = "# ---- accel-lint: project context (other modules; never reported) ----"
_SKIP_DIRS = {
    ".git", ".hg", ".venv", "venv", "env", "node_modules", "__pycache__", "build", "dist",
    "site-packages", ".tox", ".nox", ".mypy_cache", ".ruff_cache", ".accel_lint_cache",
}  # fmt: skip


@dataclass(frozen=True)
class Origin:
    start: int  # first line of the chunk in the combined text
    end: int
    path: str  # the other module, as shown (relative to the project root)
    line: int  # its line for `start`
    name: str  # the name the definition has in the combined text
    caller: bool = False  # a function of another module that calls the file's functions
    loop: bool = False  # the definition holds a loop of its own (its module's run judges it)


@dataclass
class Context:
    """The combined text and how to map what the model says about it back to the file."""

    text: str
    base: int  # lines of the file itself; a line above this is in the context
    origins: list[Origin] = field(default_factory=list)
    renames: dict[str, str] = field(default_factory=dict)  # name in the text -> as written
    facts: list[dict] = field(default_factory=list)
    deps: list[tuple[str, str, str]] = field(default_factory=list)  # path, digest, summary key
    notes: list[str] = field(default_factory=list)

    def locate(self, line: int) -> tuple[str, int] | None:
        """The other module's file and line for a line of the context (None in the file)."""
        origin = self.origin(line)
        return None if origin is None else (origin.path, origin.line + line - origin.start)

    def origin(self, line: int) -> Origin | None:
        for origin in self.origins:
            if origin.start <= line <= origin.end:
                return origin
        return None

    def use_of(self, name: str) -> tuple[int, int, int] | None:
        """Where the file first calls (else names) a definition of the context: (line, start
        column, end column), the place a finding inside that definition is reported."""
        lines = self.text.split("\n")[: self.base]
        for pattern in (rf"(?<![\w.]){re.escape(name)}\s*\(", rf"(?<![\w.]){re.escape(name)}\b"):
            for number, text in enumerate(lines, start=1):
                match = re.search(pattern, text)
                if match and not text.lstrip().startswith(("#", "import ", "from ")):
                    return number, match.start(), match.start() + len(name)
        return None

    def names(self, text: str) -> str:
        """Code of the combined text with the context's names as the file wrote them."""
        for new, old in self.renames.items():
            if new in text:
                text = re.sub(rf"\b{re.escape(new)}\b", old, text)
        return text

    def words(self, text: str) -> str:
        """A message of the combined text in the file's words: the context's lines as
        `file:line`, its names as the file wrote them."""
        text = self.names(text)

        def place(match: re.Match) -> str:
            found = self.locate(int(match.group(2)))
            return match.group(0) if found is None else f"{found[0]}:{found[1]}"

        return re.sub(r"\b(line) (\d+)\b", place, text)

    @property
    def key(self) -> str:
        """The hash of the summaries used: part of the file's cache key."""
        digest = hashlib.sha256()
        for path, _, summary_key in sorted(self.deps):
            digest.update(f"{path}\0{summary_key}\0".encode())
        return digest.hexdigest()[:16]


class Project:
    """One project's modules, summarised once per content (a run, or a server session).

    `store` (the results cache's directory, when the run has one) keeps the importer index
    and the summaries between runs."""

    def __init__(self, root: Path, store: Store | None = None) -> None:
        self.root = root
        self.modules = Modules(root)
        self.store = store
        self._summaries: dict[str, tuple[tuple[int, int], ModuleSummary | None]] = {}
        self._by_digest: dict[str, ModuleSummary] = {}
        self._importers: dict[str, list[str]] | None = None
        self._words: dict[str, tuple[str, ...]] = {}  # path -> its import words (the index's)
        self.notes: list[str] = []
        # the files this run lints: one that does not parse has its own ACL000, so no note too
        self.linted: frozenset[str] = frozenset()
        # path -> the other modules its last context consulted: (path, summary key, mtime,
        # size), or (path, "") for one that could not be read
        self.used: dict[str, list[tuple]] = {}

    # summaries --------------------------------------------------------------------------
    def summary(self, path: str) -> ModuleSummary | None:
        """The module's summary (None: unreadable or too large, with a note)."""
        try:
            stat = os.stat(path)
        except OSError:
            return None
        known = self._summaries.get(path)
        if known is not None and known[0] == (stat.st_mtime_ns, stat.st_size):
            return known[1]
        found = None
        if stat.st_size > MAX_MODULE_BYTES:
            self.notes.append(f"{self.shown(path)}: not read for the project (over 1 MB)")
        else:
            from linter.source import SourceError, decode

            try:
                found = self.summary_of(path, decode(Path(path).read_bytes()).text)
            except (OSError, SourceError) as error:
                self.notes.append(f"{self.shown(path)}: not read for the project ({error})")
        self._summaries[path] = ((stat.st_mtime_ns, stat.st_size), found)
        return found

    def summary_of(self, path: str, text: str) -> ModuleSummary:
        """The summary of `text` as the module at `path`: from memory, the store, or `ast`
        (the screen's tree of this very text when it has one: the file being linted)."""
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        found = self._by_digest.get(digest)
        if found is None or found.path != path:
            package = self.modules.package_of(path)
            found = self.store.summary(path, digest, package, text) if self.store else None
            if found is None:
                found = summarize(path, text, digest, package, _screen_tree(text))
                if self.store is not None:
                    self.store.keep(found, package)
            self._by_digest[digest] = found
            if found.error and path not in self.linted:
                self.notes.append(f"{self.shown(path)}: {found.error}; nothing learnt from it")
        return found

    def dependency(self, path: str) -> tuple:
        """What a file's cached findings record of a module its context consulted: its
        summary key, and its mtime and size (unchanged, the key holds without reading it)."""
        found = self.summary(path)
        known = self._summaries.get(path)
        if found is None or known is None:
            return (path, "")
        return (path, found.key, *known[0])

    def shown(self, path: str) -> str:
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return path

    # who imports a module ------------------------------------------------------------------
    def importers(self, last: str) -> list[str]:
        """Project files with an import statement naming `last` (a module's last component)."""
        return self._index().get(last, [])

    def prepare(self) -> None:
        """Build the importer index now (before a process pool forks, so workers share it)."""
        self._index()

    def _index(self) -> dict[str, list[str]]:
        """Import word -> the files whose import statements hold it. Built once per run from
        each file's import words: kept in the store by size and mtime, else read from the
        file's bytes (a C search for `import`, no parse)."""
        if self._importers is None:
            index: dict[str, list[str]] = {}
            self._words = {}
            for path, stat in self._files():
                words = self.store.words(path, stat) if self.store else None
                if words is None:
                    words = self._words_of(path, stat)
                self._words[path] = words
                for word in words:
                    index.setdefault(word, []).append(path)
            self._importers = index
            if self.store is not None:
                self.store.save()
        return self._importers

    def _words_of(self, path: str, stat: os.stat_result) -> tuple[str, ...]:
        words = _imported_words(path, stat.st_size)
        if self.store is not None:
            self.store.keep_words(path, stat, words)
        return words

    def _files(self):
        """(path, stat) of the project's `.py` files, at most MAX_PROJECT_FILES."""
        count = 0
        for directory, dirs, files in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                count += 1
                if count > MAX_PROJECT_FILES:
                    self.notes.append(
                        f"project: only the first {MAX_PROJECT_FILES} files were searched "
                        "for callers"
                    )
                    return
                path = os.path.join(directory, name)
                try:
                    yield path, os.stat(path)
                except OSError:
                    continue

    def changed(self, path: str) -> None:
        """A file changed, appeared or went on disk (the language server's saves and watched
        files): its entries in the importer index are made again, module lookups afresh."""
        self.modules.forget()
        self._summaries.pop(path, None)
        if (
            self._importers is None
            or not path.endswith(".py")
            or not _inside(Path(path), self.root)
        ):
            return
        old = self._words.pop(path, ())
        try:
            new = self._words_of(path, os.stat(path))
        except OSError:
            new = ()
        for word in set(old) - set(new):
            self._importers[word] = [p for p in self._importers[word] if p != path]
        for word in set(new) - set(old):
            self._importers.setdefault(word, []).append(path)
        if new:
            self._words[path] = new

    def imports(self, importer: str, path: str) -> bool:
        """Whether `importer`'s import statements may name the module at `path` (its last
        component among their words): a new caller of the file's functions, maybe."""
        name = self.modules.name_of(path)
        self._index()
        return bool(name) and name.rsplit(".", 1)[-1] in self._words.get(importer, ())

    # the context of one file -------------------------------------------------------------
    def context(self, path: str, text: str) -> Context | None:
        """The file's context, or None when the project adds nothing to it."""
        if (
            not _inside(Path(path), self.root)
            or not _trains(text)
            or not self._may_read(path, text)
        ):
            self.used[path] = []
            return None
        builder = _Builder(self, path, text)
        found = builder.build()
        self.used[path] = sorted(self.dependency(p) for p in builder.consulted)
        return found

    def _may_read(self, path: str, text: str) -> bool:
        """A raw-text screen before `ast`: whether the file imports a module that may be one of
        the project's, or another file of the project imports it (a caller, maybe). Neither:
        the project has nothing for it, and its own summary (an `ast` parse, a tenth of a
        keystroke's answer in the editor) is not made."""
        name = self.modules.name_of(path)
        if name and any(other != path for other in self.importers(name.rsplit(".", 1)[-1])):
            return True
        heads = _import_heads(text)
        return heads is None or any(self.modules.may_hold(head, path) for head in heads)

    def still_valid(self, deps) -> bool:
        """Whether the modules a cached result consulted still summarise the same."""
        for dep in deps:
            path, key = dep[0], dep[1]
            if len(dep) == 4 and _stat_of(path) == (dep[2], dep[3]):
                continue
            found = self.summary(path)
            if (found.key if found is not None else "") != key:
                return False
        return True


class Projects:
    """The projects of one run: each linted path in its own (`root.find_roots`), as ruff and
    pyright place each file under its nearest configuration. Answers as one `Project` does,
    each question asked of the project holding the file."""

    def __init__(self, roots: list[Path], store: Store | None = None) -> None:
        # deepest first: a nested project (a marker below another) holds its own files
        ordered = sorted(set(roots), key=lambda r: len(r.parts), reverse=True)
        self.store = store
        self.projects = [Project(root, store) for root in ordered]
        self._roots: dict[str, Path | None] = {}  # a document's directory -> its root
        self.used: dict[str, list[tuple]] = {}
        for found in self.projects:
            found.used = self.used

    def of(self, path: str) -> Project | None:
        for found in self.projects:
            if _inside(Path(path), found.root):
                return found
        return None

    def include(self, path: str, workspace: Path | None = None) -> Project | None:
        """The project of `path`, made on first sight (the language server's documents): its
        marked root, else the workspace holding it; None for a file outside both."""
        from linter.project.root import marked_root

        directory = os.path.dirname(os.path.abspath(path))
        if directory not in self._roots:
            root = marked_root(Path(directory))
            if root is None and workspace is not None and _inside(Path(directory), workspace):
                root = workspace
            self._roots[directory] = root
        root = self._roots[directory]
        if root is None:
            return None
        for found in self.projects:
            if found.root == root:
                return found
        found = Project(root, self.store)
        found.used, found.linted = self.used, self.linted
        self.projects.append(found)
        self.projects.sort(key=lambda p: len(p.root.parts), reverse=True)
        return found

    def reads(self, path: str, changed: str) -> bool:
        """Whether the last context of `path` read the module `changed`, or `changed` now
        imports `path`'s module (it may call the file's functions)."""
        if any(dep[0] == changed for dep in self.used.get(path, ())):
            return True
        found = self.of(path)
        return found is not None and found is self.of(changed) and found.imports(changed, path)

    @property
    def notes(self) -> list[str]:
        return [note for found in self.projects for note in found.notes]

    @notes.setter
    def notes(self, value: list[str]) -> None:
        """Only cleared (the runner takes the notes of each file)."""
        for found in self.projects:
            found.notes = list(value)

    @property
    def linted(self) -> frozenset[str]:
        return frozenset().union(*(found.linted for found in self.projects))

    @linted.setter
    def linted(self, value: frozenset[str]) -> None:
        for found in self.projects:
            found.linted = value

    def context(self, path: str, text: str) -> Context | None:
        found = self.of(path)
        if found is None:
            self.used[path] = []
            return None
        return found.context(path, text)

    def still_valid(self, deps) -> bool:
        for dep in deps:
            found = self.of(dep[0])
            if found is None or not found.still_valid([dep]):
                return False
        return True

    def prepare(self) -> None:
        for found in self.projects:
            found.prepare()

    def changed(self, path: str) -> None:
        for found in self.projects:
            found.changed(path)


def _stat_of(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


# A file that trains: the facts of other modules are about a training step. A pipeline that
# only samples (its scheduler's `.step(...)` in a loop) gains nothing from them but their cost.
_TRAINS = re.compile(
    r"backward\s*\(|zero_grad|no_sync|GradScaler|clip_grad|accumulat|scaler\s*\("
    r"|DistributedSampler|DistributedDataParallel|\bDDP\s*\("
)
# Words one of which every match of `_TRAINS` holds: searched first, by `in` (a C search ten
# times faster than the pattern's alternation over a whole file).
_TRAINS_WORDS = ("backward", "zero_grad", "no_sync", "GradScaler", "clip_grad", "accumulat",
                 "scaler", "DistributedSampler", "DistributedDataParallel", "DDP")  # fmt: skip


def _trains(text: str) -> bool:
    return any(word in text for word in _TRAINS_WORDS) and _TRAINS.search(text) is not None


_CALLED = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\s*\(")
# An import statement's line, matched where a C search found the word `import` in it.
_IMPORT_LINE = re.compile(rb"[ \t]*(?:from[ \t][^\n]*?[ \t]import\b|import\b)[^\n]*")
_WORD = re.compile(rb"\w+")


_IMPORT_STATEMENT = re.compile(
    r"(?:^|;)[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import\b|import[ \t]+([^\n#;]*))", re.M
)
_CONTINUED_FROM = re.compile(r"^[ \t]*from[ \t][^\n]*\\$", re.M)


def _import_heads(text: str) -> set[str] | None:
    """The first components of the modules a text imports (`util` for `from util.misc import
    x`, `import util.misc as m`); None when that cannot be told from the lines (a relative
    import, a `from` continued with a backslash)."""
    if "\\\n" in text and _CONTINUED_FROM.search(text):
        return None
    heads = set()
    for source, names in _IMPORT_STATEMENT.findall(text):
        if source:
            if source.startswith("."):
                return None
            heads.add(source.split(".", 1)[0])
            continue
        for name in names.replace("(", " ").replace(")", " ").replace("\\", " ").split(","):
            head = name.split(".", 1)[0].split()
            if head:
                heads.add(head[0])
    return heads


def _imported_words(path: str, size: int) -> tuple[str, ...]:
    """The import words of a project file (none for one too large or unreadable)."""
    if size > MAX_MODULE_BYTES:
        return ()
    data = _read(path)
    return () if data is None else tuple(sorted(_imported(data)))


def _imported(data: bytes) -> set[str]:
    """The words of a module's import statements (modules and names, parenthesised lists
    over several lines included). A line is looked at only where `import` occurs in it."""
    words: set[bytes] = set()
    position, size = 0, len(data)
    while (found := data.find(b"import", position)) >= 0:
        start = data.rfind(b"\n", 0, found) + 1
        end = data.find(b"\n", found)
        end = size if end < 0 else end
        line = _IMPORT_LINE.match(data, start, end)
        if line is not None:
            if b"(" in line.group() and b")" not in line.group():
                close = data.find(b")", end)
                end = size if close < 0 else close
            words.update(_WORD.findall(data, start, end))
        position = end + 1
    return {word.decode("ascii", "ignore") for word in words}


def _screen_tree(text: str):
    """The `ast` the screen made of this very text (the file being linted), left in place
    for the analysis, which takes it next; None for any other text."""
    from linter import screen

    last = getattr(screen, "_screened", None)
    return last[1] if last is not None and last[0] is text else None


def _read(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


class _Builder:
    def __init__(self, project: Project, path: str, text: str) -> None:
        self.project = project
        self.modules = project.modules
        self.path = path
        self.text = text
        self.own = project.summary_of(path, text)
        self.taken: set[str] = set(self.own.bound)  # an imported name is replaced, not taken
        self.imported = {imp.local.split(".", 1)[0] for imp in self.own.imports}
        self.chunks: list[tuple[list[str], str, int, str, bool, bool]] = []  # see Origin
        self.import_lines: dict[str, tuple[str, int, list[str]]] = {}  # local -> path, line, text
        self.rewrites: dict[str, str] = {}  # `misc.ddp_sync` -> `misc_ddp_sync`
        self.context = Context("", 0)
        self.seen: set[tuple[str, str]] = set()
        self.consulted: set[str] = set()  # the other modules read
        self.entered: set[str] | None = None  # what the file's `with` statements call
        self.lines = 0

    def build(self) -> Context | None:
        if self.own.error:
            return None
        self._imports()
        self._callers()
        if not self.chunks:
            return None
        return self._assemble()

    # what the file imports ------------------------------------------------------------------
    def _imports(self) -> None:
        for imp in self.own.imports:
            if imp.name is None:
                target = self.modules.resolve(imp.module, self.path)
                if target is not None:
                    self._module_alias(imp.local, target)
                continue
            target = self.modules.resolve(imp.module, self.path)
            summary, found = self._find(self._summary(target), imp.name)
            if found is not None:
                why = f"`{imp.local}` imported from {self.project.shown(summary.path)}"
                self._add(summary, found, imp.local, why)
                continue
            sub = self.modules.resolve(f"{imp.module}.{imp.name}" if imp.module else imp.name)
            if sub is not None:  # from util import misc
                self._module_alias(imp.local, sub)

    def _module_alias(self, local: str, target: str) -> None:
        if target == self.path:
            return
        summary = self._summary(target)
        if summary is None:
            return
        pattern = re.compile(rf"(?<![\w.]){re.escape(local)}\.(\w+)\b")
        for attr in sorted(set(pattern.findall(self.text))):
            where, found = self._find(summary, attr)
            if found is None:
                continue
            written = f"{local}.{attr}"
            name = written.replace(".", "_")  # as long as what it replaces
            if re.search(rf"\b{re.escape(name)}\b", self.text) or name in self.taken:
                continue
            why = f"`{written}` from {self.project.shown(where.path)}"
            if self._add(where, found, name, why, written):
                self.rewrites[written] = name

    # who calls the file's functions -------------------------------------------------------
    def _callers(self) -> None:
        name = self.modules.name_of(self.path)
        wanted = {
            d.name
            for d in self.own.definitions
            if d.kind == "function" and d.has_loop and d.relevant  # a training loop, maybe
        }
        if not name or not wanted:
            return
        last = name.rsplit(".", 1)[-1]
        followed = 0
        names = [n.encode() for n in wanted]
        for other in self.project.importers(last):
            if other == self.path or followed >= MAX_CALLERS:
                continue
            data = _read(other)
            if data is not None and not any(n in data for n in names):
                continue  # names none of the file's loop functions: no parse of it
            summary = self._summary(other)
            if summary is None:
                continue
            callees = self._callees_in(summary, other, wanted)
            if not callees:
                continue
            followed += 1
            for found in summary.definitions:
                if found.kind != "function" or not (found.calls & callees.keys()):
                    continue
                lines = summary.text_of(found)
                for written, own_name in callees.items():
                    if written != own_name:
                        pattern = rf"(?<![\w.]){re.escape(written)}(?=\s*\()"
                        lines = [re.sub(pattern, own_name, line) for line in lines]
                new = f"_accel_lint_caller_{len(self.chunks)}"
                called = ", ".join(sorted(set(callees.values()) & _called(found, callees)))
                why = f"`{found.name}` in {self.project.shown(other)} calls `{called}`"
                if self._add(summary, found, new, why, found.name, lines=lines, caller=True):
                    self._main_block(summary, found.name, new)
                self._dependencies(summary, other, "\n".join(lines))

    def _main_block(self, summary: ModuleSummary, caller: str, new: str) -> None:
        """The caller module's `if __name__ == "__main__":` block that calls it (`args =
        get_args_parser().parse_args(); main(args)`) and the parser it builds: where the
        configuration that the file's loop reads (`args.accum_iter`) comes from."""
        block = _main_block_of(summary.lines)
        call = re.compile(rf"(?<![\w.]){re.escape(caller)}(?=\s*\()")
        if block is None or not any(call.search(line) for line in block[1]):
            return
        first, lines = block
        if self.lines + len(lines) > MAX_CONTEXT_LINES:
            self.context.notes.append("project context full: a `__main__` block was not read")
            return
        lines = [call.sub(new, line) for line in lines]
        self.chunks.append((lines, summary.path, first, "", True, False))
        self.lines += len(lines) + 1
        text = "\n".join(lines)
        shown = self.project.shown(summary.path)
        for name in sorted(set(_CALLED.findall(text))):
            helper = summary.definition(name)
            if helper is not None and helper.relevant and name != caller:
                self._add(summary, helper, name, f"`{name}` called where {shown} starts")
        self._dependencies(summary, summary.path, text)

    def _callees_in(self, summary: ModuleSummary, other: str, wanted: set[str]) -> dict:
        """How `other` writes calls of the file's functions: callee text -> own name."""
        found = {}
        for imp in summary.imports:
            if imp.name is not None:
                if self.modules.resolve(imp.module, other) == self.path and imp.name in wanted:
                    found[imp.local] = imp.name
                    continue
                sub = f"{imp.module}.{imp.name}" if imp.module else imp.name
                if self.modules.resolve(sub, other) != self.path:
                    continue
            elif self.modules.resolve(imp.module, other) != self.path:
                continue
            for own_name in wanted:
                found[f"{imp.local}.{own_name}"] = own_name
        return found

    def _dependencies(self, summary: ModuleSummary, path: str, text: str) -> None:
        """What a caller uses from its own project imports (its scaler class, its DDP helper)."""
        for imp in summary.imports:
            if imp.name is None or not re.search(rf"\b{re.escape(imp.local)}\b", text):
                continue
            target = self.modules.resolve(imp.module, path)
            if target is None or target == self.path:
                continue
            other, found = self._find(self._summary(target), imp.name)
            if found is not None and found.relevant:
                why = f"`{imp.local}` imported from {self.project.shown(other.path)}"
                self._add(other, found, imp.local, why)

    # adding a definition ------------------------------------------------------------------
    def _add(
        self,
        summary: ModuleSummary,
        found: Definition,
        name: str,
        why: str,
        written: str | None = None,
        lines: list[str] | None = None,
        depth: int = 1,
        caller: bool = False,
    ) -> bool:
        if (summary.path, found.name) in self.seen:
            return True
        if not (caller or found.relevant or self._entered(found, written or name, depth)):
            return False
        if name in self.taken:
            return False
        lines = summary.text_of(found) if lines is None else lines
        limit = MAX_PARSER_LINES if _builds_a_parser(found) else MAX_DEFINITION_LINES
        if len(lines) > limit:
            self.context.notes.append(f"{why}: over {limit} lines, not read")
            return False
        if self.lines + len(lines) > MAX_CONTEXT_LINES:
            self.context.notes.append(f"project context full: {why} was not read")
            return False
        self.seen.add((summary.path, found.name))
        self.taken.add(name)
        at = found.line - found.first_line
        keyword = "class" if found.kind == "class" else "def"
        lines = list(lines)
        lines[at] = re.sub(
            rf"\b{keyword}\s+{re.escape(found.name)}\b", f"{keyword} {name}", lines[at], count=1
        )
        self.chunks.append((lines, summary.path, found.first_line, name, caller, found.has_loop))
        self.lines += len(lines) + 1
        if written is not None and name != written:
            self.context.renames[name] = written
        shown = self.project.shown(summary.path)
        self.context.facts.append(
            {"fact": why, "definition": found.name, "kind": found.kind, "file": shown,
             "line": found.line}
        )  # fmt: skip
        self.context.deps.append((summary.path, summary.digest, summary.key))
        self._third_party(summary, "\n".join(lines))
        if depth < MAX_DEPTH:
            for callee in sorted(found.calls):
                helper = summary.definition(callee) if "." not in callee else None
                if helper is not None and helper.relevant and helper.name != found.name:
                    self._add(summary, helper, callee, f"`{callee}` used by `{found.name}` in "
                              f"{shown}", depth=depth + 1)  # fmt: skip
        return True

    def _entered(self, found: Definition, written: str, depth: int) -> bool:
        """A short definition the file enters as a context (`with misc.ddp_sync(model, s):`)
        is read even when it names nothing of training: one that only yields enters nothing,
        and that is a fact. Any other call of a definition that names nothing the model knows
        stays opaque, as the rules treat an unknown call (a gradient scaling helper whose body
        calls further out is not proven harmless by reading half of it)."""
        if depth != 1 or found.end_line - found.first_line >= SHORT:
            return False
        if self.entered is None:
            lines = re.findall(r"^[ \t]*(?:async[ \t]+)?with\b[^\n]*", self.text, re.M)
            self.entered = {name for line in lines for name in _CALLED.findall(line)}
        return written in self.entered

    def _third_party(self, summary: ModuleSummary, text: str) -> None:
        """The other module's imports of libraries that the copied text uses (`DDP`, `amp`),
        unless the file binds the same name: the model qualifies names through imports."""
        for imp in summary.imports:
            head = imp.local.split(".", 1)[0]
            if imp.module == "__future__" or head in self.taken or head in self.imported:
                continue
            if head in self.import_lines:
                continue
            if not re.search(rf"\b{re.escape(head)}\b", text):
                continue
            if self.modules.resolve(imp.module, summary.path) is not None or imp.level:
                continue
            if imp.name is None:
                line = f"import {imp.module} as {imp.local}" if imp.local != imp.module else (
                    f"import {imp.module}")  # fmt: skip
            else:
                line = f"from {imp.module} import {imp.name} as {imp.local}"
            self.import_lines[head] = (summary.path, imp.line, [line])

    def _find(self, summary: ModuleSummary | None, name: str, hops: int = 3):
        """(module, definition) of `name` in a module, through the imports that re-export it
        (a package's `__init__.py` importing it from a submodule); (None, None) if absent."""
        if summary is None:
            return None, None
        found = summary.definition(name)
        if found is not None:
            return summary, found
        for imp in summary.imports if hops else ():
            if imp.local == name and imp.name is not None:
                target = self.modules.resolve(imp.module, summary.path)
                return self._find(self._summary(target), imp.name, hops - 1)
        return None, None

    def _summary(self, path: str | None) -> ModuleSummary | None:
        if path is None or path == self.path:
            return None
        found = self.project.summary(path)
        self.consulted.add(path)
        return None if found is None or found.error else found

    # the combined text ---------------------------------------------------------------------
    def _assemble(self) -> Context:
        text = self.text
        for written, name in self.rewrites.items():
            text = re.sub(rf"(?<![\w.]){re.escape(written)}\b", name, text)
        prefix = text if text.endswith("\n") else text + "\n"
        context = self.context
        context.base = prefix.count("\n")
        lines = [HEADER]
        for path, first, copied in self.import_lines.values():
            start = context.base + len(lines) + 1
            context.origins.append(Origin(start, start, self.project.shown(path), first, ""))
            lines.extend(copied)
        for copied, path, first, name, caller, loop in self.chunks:
            start = context.base + len(lines) + 1
            end = start + len(copied) - 1
            shown = self.project.shown(path)
            context.origins.append(Origin(start, end, shown, first, name, caller, loop))
            lines.extend(copied)
            lines.append("")
        context.text = prefix + "\n".join(lines) + "\n"
        return context


SHORT = 40  # lines


_MAIN_TEST = re.compile(r"""if\s+__name__\s*==\s*["']__main__["']\s*:""")
MAX_MAIN_BLOCK_LINES = 60


def _main_block_of(lines: tuple[str, ...]) -> tuple[int, list[str]] | None:
    """(first line, lines) of a module's top-level `if __name__ == "__main__":` block."""
    for at, line in enumerate(lines):
        if not line.startswith("if") or not _MAIN_TEST.match(line):
            continue
        end = at + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][:1] in " \t#"):
            end += 1
        if end - at > MAX_MAIN_BLOCK_LINES:
            return None
        return at + 1, list(lines[at:end])
    return None


def _builds_a_parser(found: Definition) -> bool:
    """A function that adds command-line options and runs no loop (`parse_args()`)."""
    return (
        found.kind == "function"
        and not found.has_loop
        and any(call.endswith(".add_argument") for call in found.calls)
    )


def _called(found: Definition, callees: dict[str, str]) -> set[str]:
    return {callees[c] for c in found.calls if c in callees}
