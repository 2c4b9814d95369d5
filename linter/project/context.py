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
from linter.project.summary import Definition, ModuleSummary, summarize

MAX_MODULE_BYTES = 1_000_000  # a bigger module is not read (generated code, data)
MAX_PROJECT_FILES = 20_000  # files the importer index reads at most
MAX_CALLERS = 4  # modules whose calls of the file's functions are followed
MAX_CONTEXT_LINES = 1_500  # lines appended at most
MAX_DEFINITION_LINES = 400  # a longer definition (a whole pipeline class) stays opaque
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
    """One project's modules, summarised once per content (a run, or a server session)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules = Modules(root)
        self._summaries: dict[str, tuple[tuple[int, int], ModuleSummary | None]] = {}
        self._by_digest: dict[str, ModuleSummary] = {}
        self._importers: dict[str, list[str]] | None = None
        self._bytes: list[tuple[str, bytes]] | None = None  # every project file, once read
        self._by_path: dict[str, bytes] = {}
        self.notes: list[str] = []
        # the files this run lints: one that does not parse has its own ACL000, so no note too
        self.linted: frozenset[str] = frozenset()
        # path -> the other modules its last context consulted: (path, summary key)
        self.used: dict[str, list[tuple[str, str]]] = {}

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
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        found = self._by_digest.get(digest)
        if found is None or found.path != path:
            found = summarize(path, text, digest, self.modules.package_of(path))
            self._by_digest[digest] = found
            if found.error and path not in self.linted:
                self.notes.append(f"{self.shown(path)}: {found.error}; nothing learnt from it")
        return found

    def shown(self, path: str) -> str:
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return path

    # who imports a module ------------------------------------------------------------------
    def importers(self, last: str) -> list[str]:
        """Project files with an import statement naming `last` (a module's last component).

        One file's question scans the project's bytes for the word (a C search, ~15 ms on
        diffusers' 45 MB) and reads the import lines of the few files holding it; a run over
        many files builds the index of every import line once instead (`prepare`)."""
        if self._importers is not None:
            return self._importers.get(last, [])
        word = last.encode()
        return [path for path, data in self._sources() if word in data and last in _imported(data)]

    def prepare(self) -> None:
        """Build the importer index now (before a process pool forks, so workers share it)."""
        if self._importers is None:
            index: dict[str, list[str]] = {}
            for path, data in self._sources():
                for word in _imported(data):
                    index.setdefault(word, []).append(path)
            self._importers = index

    def _sources(self) -> list[tuple[str, bytes]]:
        if self._bytes is None:
            self._bytes = list(self._read_all())
            self._by_path = dict(self._bytes)
        return self._bytes

    def source(self, path: str) -> bytes | None:
        """A project file's bytes as the importer search read them."""
        return self._by_path.get(path)

    def _read_all(self):
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
                    if os.path.getsize(path) <= MAX_MODULE_BYTES:
                        yield path, Path(path).read_bytes()
                except OSError:
                    continue

    # the context of one file -------------------------------------------------------------
    def context(self, path: str, text: str) -> Context | None:
        """The file's context, or None when the project adds nothing to it."""
        if not _inside(Path(path), self.root) or not _TRAINS.search(text):
            self.used[path] = []
            return None
        builder = _Builder(self, path, text)
        found = builder.build()
        self.used[path] = sorted(builder.consulted.items())
        return found

    def still_valid(self, deps) -> bool:
        """Whether the modules a cached result consulted still summarise the same."""
        for path, key in deps:
            found = self.summary(path)
            if (found.key if found is not None else "") != key:
                return False
        return True


# A file that trains: the facts of other modules are about a training step. A pipeline that
# only samples (its scheduler's `.step(...)` in a loop) gains nothing from them but their cost.
_TRAINS = re.compile(
    r"backward\s*\(|zero_grad|no_sync|GradScaler|clip_grad|accumulat|scaler\s*\("
    r"|DistributedSampler|DistributedDataParallel|\bDDP\s*\("
)
_CALLED = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\s*\(")
_IMPORTED = re.compile(rb"^[ \t]*(?:from|import)[ \t][^\n]*(?:\([^)]*\))?", re.M)


def _imported(data: bytes) -> set[str]:
    """The words of a module's import statements (modules and names, parenthesised lists
    included)."""
    words: set[str] = set()
    for line in _IMPORTED.findall(data):
        words.update(re.findall(r"\w+", line.decode("ascii", "ignore")))
    return words


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
        self.consulted: dict[str, str] = {}  # path -> summary key
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
            data = self.project.source(other)
            if data is not None and not any(n in data for n in names):
                continue  # names none of the file's loop functions
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
                self._add(summary, found, new, why, found.name, lines=lines, caller=True)
                self._dependencies(summary, other, "\n".join(lines))

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
        if len(lines) > MAX_DEFINITION_LINES:
            self.context.notes.append(f"{why}: over {MAX_DEFINITION_LINES} lines, not read")
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
        self.consulted[path] = found.key if found is not None else ""
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


def _called(found: Definition, callees: dict[str, str]) -> set[str]:
    return {callees[c] for c in found.calls if c in callees}
