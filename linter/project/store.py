"""What project analysis keeps on disk between runs, in the results cache's directory.

- The importer index: each project file's import words with its size and mtime, so a run asks
  the file system for sizes, not contents (reading and screening diffusers' 45 MB costs 0.3 s;
  its 2,089 stats, 20 ms). One `marshal` file, written by the run that changed it.
- Module summaries by content: the `ast` reading of a module is kept under a hash of its
  path, content digest and package, without its text (the file is read again to use it and
  its digest checked first). One small file each, written where the summary is made, so the
  workers of a process pool add theirs with no merging; a file is written whole or not at all.

`marshal` holds only plain values (no code is loaded from it), as the compiled-code cache does.
A missing, corrupt or foreign file is a miss, never an error.
"""

from __future__ import annotations

import hashlib
import marshal
import os
from dataclasses import fields
from pathlib import Path

from linter.project.summary import Definition, Import, ModuleSummary

Words = tuple[str, ...]


class Store:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._index_file = directory / "imports.marshal"
        self._words: dict[str, tuple[int, int, Words]] | None = None
        self._dirty = False

    # the importer index ---------------------------------------------------------------------
    def words(self, path: str, stat: os.stat_result) -> Words | None:
        """The import words stored for `path`, if its size and mtime are those stored."""
        entry = self._index().get(path)
        if entry is not None and (entry[0], entry[1]) == (stat.st_mtime_ns, stat.st_size):
            return entry[2]
        return None

    def keep_words(self, path: str, stat: os.stat_result, words: Words) -> None:
        self._index()[path] = (stat.st_mtime_ns, stat.st_size, words)
        self._dirty = True

    def _index(self) -> dict[str, tuple[int, int, Words]]:
        if self._words is None:
            self._words = _load(self._index_file, dict) or {}
        return self._words

    def save(self) -> None:
        if self._dirty:
            _write(self._index_file, self._index())
            self._dirty = False

    # summaries ------------------------------------------------------------------------------
    def summary(self, path: str, digest: str, package: str, text: str) -> ModuleSummary | None:
        """The stored summary of this content at this path, its lines taken from `text`."""
        row = _load(self._summary_file(path, digest, package), tuple)
        if row is None:
            return None
        try:
            stored_path, stored_digest, imports, definitions, bound, error = row
            if (stored_path, stored_digest) != (path, digest):
                return None
            return ModuleSummary(
                path,
                digest,
                tuple(Import(*item) for item in imports),
                tuple(Definition(*item) for item in definitions),
                tuple(text.split("\n")),
                frozenset(bound),
                error,
            )
        except (TypeError, ValueError):
            return None

    def keep(self, summary: ModuleSummary, package: str) -> None:
        row = (
            summary.path,
            summary.digest,
            tuple(_row(item) for item in summary.imports),
            tuple(_row(item) for item in summary.definitions),
            tuple(sorted(summary.bound)),
            summary.error,
        )
        _write(self._summary_file(summary.path, summary.digest, package), row)

    def _summary_file(self, path: str, digest: str, package: str) -> Path:
        name = hashlib.sha256(f"{path}\0{digest}\0{package}".encode()).hexdigest()[:32]
        return self.directory / "summaries" / f"{name}.marshal"


def _row(item) -> tuple:
    return tuple(getattr(item, f.name) for f in fields(item))


def _load(file: Path, kind: type):
    try:
        with open(file, "rb") as handle:
            value = marshal.load(handle)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return value if isinstance(value, kind) else None


def _write(file: Path, value) -> None:
    """Whole or not at all: a temporary file renamed over the old one; a failure is a miss."""
    try:
        data = marshal.dumps(value)
    except ValueError:  # a value marshal cannot hold: nothing is kept
        return
    temporary = file.with_name(f"{file.name}.{os.getpid()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(data)
        os.replace(temporary, file)
    except OSError:
        try:
            os.remove(temporary)
        except OSError:
            pass
