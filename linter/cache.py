"""Remember each file's diagnostics so unchanged files are neither parsed nor analysed again.

A result is valid for (file content hash, enabled codes, tool version), the version including a hash
of the linter's and the rules' source files. To skip even reading unchanged files, the index also
keeps each path's size and mtime: when both match, the content hash stored with them is trusted.
Everything lives in one JSON file per tool version; a corrupt or unreadable cache is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from linter.types import Configuration, Diagnostic, Edit, Fix, Position

_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# accel-lint cache directory\n"


def tool_key() -> str:
    """The package version plus a hash of every linter/rules source file."""
    import linter
    import rules
    from linter import __version__

    digest = hashlib.sha256(__version__.encode())
    for package in (linter, rules):
        base = Path(package.__file__).parent
        for path in sorted(base.rglob("*.py")):
            digest.update(path.relative_to(base).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


ANY_CODES = "*"  # a result that holds whatever rules are enabled (a file the prefilter skips)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def codes_key(codes: frozenset[str], hints: bool = False, project: bool = False) -> str:
    """What the cached findings depend on besides the text: the codes, whether hints show,
    and whether the file was read in its project."""
    selected = ",".join(sorted(codes)) + (";hints" if hints else "")
    selected += ";project" if project else ""
    return hashlib.sha256(selected.encode()).hexdigest()[:16]


def default_directory(project_root: Path) -> Path:
    """`$ACCEL_LINT_CACHE_DIR`, else `.accel_lint_cache/` in the project root."""
    override = os.environ.get("ACCEL_LINT_CACHE_DIR")
    return Path(override) if override else project_root / ".accel_lint_cache"


def _fallback_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accel-lint"


class Cache:
    """path -> [mtime_ns, size, content digest, codes key, diagnostics] for one tool version."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.file = directory / f"{tool_key()}.json"
        self.entries: dict[str, list] = self._load()
        self.dirty = False

    @property
    def project_directory(self) -> Path:
        """Where project analysis keeps its importer index and module summaries (one
        directory per tool version, as the results file)."""
        return self.directory / f"project-{self.file.stem}"

    def _load(self) -> dict[str, list]:
        try:
            with open(self.file, encoding="utf-8") as handle:
                data = json.load(handle)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def by_stat(self, path: str, stat: os.stat_result, codes: str, shown: str):
        """The cached result when the file's size and mtime are unchanged (no read needed)."""
        entry = self._entry(path, codes)
        if entry and entry[0] == stat.st_mtime_ns and entry[1] == stat.st_size:
            return _decode(entry[4], shown)
        return None

    def by_content(self, path: str, digest: str, codes: str, shown: str):
        entry = self._entry(path, codes)
        if entry and entry[2] == digest:
            return _decode(entry[4], shown)
        return None

    def _entry(self, path: str, codes: str) -> list | None:
        entry = self.entries.get(path)
        valid = isinstance(entry, list) and len(entry) in (5, 6) and isinstance(entry[4], list)
        if not valid or entry[3] not in (codes, ANY_CODES):
            return None
        return entry if _dependencies_hold(entry[5] if len(entry) == 6 else []) else None

    def deps_of(self, path: str) -> list:
        entry = self.entries.get(path)
        return entry[5] if isinstance(entry, list) and len(entry) == 6 else []

    def store(
        self, path, stat, digest: str, codes: str, diagnostics: list[Diagnostic], deps=()
    ) -> None:
        """`deps`: (path, summary key) of the project modules the findings were drawn from;
        the entry holds while each still summarises the same (a change in `util/misc.py`
        re-lints the files that read it, and nothing else)."""
        encoded = [_encode(d) for d in diagnostics]
        entry = [stat.st_mtime_ns, stat.st_size, digest, codes, encoded, [list(d) for d in deps]]
        self.entries[path] = entry
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        for directory in (self.directory, _fallback_directory()):
            try:
                self._write(directory)
                return
            except OSError:
                continue

    def _write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        tag = directory / "CACHEDIR.TAG"
        if not tag.exists():
            tag.write_text(_TAG)
            (directory / ".gitignore").write_text("*\n")
        target = directory / self.file.name
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.entries, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, target)


def _dependencies_hold(deps) -> bool:
    if not deps:
        return True
    from linter import project

    current = project.current()
    try:
        return current is not None and current.still_valid([tuple(d) for d in deps])
    except (TypeError, ValueError):
        return False  # a corrupt entry is a miss


def _encode(d: Diagnostic) -> list:
    fix = None
    if d.fix is not None:
        edits = [[*_pos(e.start), *_pos(e.end), e.content] for e in d.fix.edits]
        fix = [d.fix.applicability, d.fix.message, edits]
    configuration = None
    if d.configuration is not None:
        c = d.configuration
        configuration = [c.affects_default, c.condition, list(c.knobs)]
    return [
        d.code,
        d.message,
        *_pos(d.start),
        *_pos(d.end),
        fix,
        list(d.notes),
        d.severity,
        configuration,
    ]


def _pos(position: Position) -> tuple[int, int]:
    return position.line, position.column


def _decode(items: list, path: str) -> list[Diagnostic] | None:
    try:
        return [_decode_one(item, path) for item in items]
    except (TypeError, ValueError, IndexError):
        return None  # a corrupt entry is a miss


def _decode_one(item: list, path: str) -> Diagnostic:
    code, message, sl, sc, el, ec, fix, notes, severity, configuration = item
    decoded = None
    if fix is not None:
        applicability, fix_message, edits = fix
        decoded = Fix(
            applicability,
            fix_message,
            tuple(Edit(Position(a, b), Position(c, d), content) for a, b, c, d, content in edits),
        )
    start, end = Position(sl, sc), Position(el, ec)
    config = None
    if configuration is not None:
        affects_default, condition, knobs = configuration
        config = Configuration(bool(affects_default), str(condition), tuple(knobs))
    return Diagnostic(code, message, path, start, end, decoded, tuple(notes), severity, config)
