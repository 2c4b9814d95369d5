"""What the server lints: snapshots of open documents, linted with their project's config.

A snapshot is the text of one document at one version; every result keeps the snapshot it came
from, so a result is published (or used for a code action) only while it still describes the
document the editor shows. The resolver is rebuilt when a config file changes, so an edited
`[tool.accel-lint]` applies to the next lint without restarting the server.

A document on disk is read in its project, as the command line reads it (the definitions it
uses from the project's other modules, as saved); `reads` says which documents to lint again
when another module is saved or changes on disk. ACCEL_LINT_NO_PROJECT=1: each alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from linter.types import Diagnostic


@dataclass(frozen=True)
class Snapshot:
    uri: str
    version: int | None
    text: str
    path: Path  # where the text claims to live: its config is the one found from there

    def same_as(self, other: Snapshot | None) -> bool:
        return other is not None and (other.version, other.text) == (self.version, self.text)


@dataclass(frozen=True)
class Linted:
    snapshot: Snapshot
    diagnostics: list[Diagnostic]
    unsafe_fixes: bool  # the project's `unsafe-fixes`: unsafe quick fixes are offered only then


class Linter:
    """Lints snapshots; used from one worker thread, so the resolver needs no lock."""

    def __init__(self, root: Path):
        self.root = root
        self._resolver = None
        self._parses = None  # the libcst statements of the versions linted so far
        self.projects = None  # the documents' projects (linter.project.Projects), once enabled

    def enable_projects(self) -> None:
        """Read documents in their projects from now on (unless ACCEL_LINT_NO_PROJECT=1)."""
        from linter import project

        if os.environ.get("ACCEL_LINT_NO_PROJECT"):
            return
        self.projects = project.Projects([])
        project.enable(self.projects)

    def changed(self, path: Path) -> None:
        """A module changed on disk: what the projects know of it is read again."""
        if self.projects is not None:
            self.projects.changed(os.path.abspath(path))

    def reads(self, path: Path, changed: Path) -> bool:
        """Whether the document at `path` draws on the module `changed` (lint it again)."""
        if self.projects is None or os.path.abspath(path) == os.path.abspath(changed):
            return False
        return self.projects.reads(os.path.abspath(path), os.path.abspath(changed))

    def parse_cache(self):
        if self._parses is None:
            from linter.incremental import ParseCache

            self._parses = ParseCache()
        return self._parses

    def config_changed(self) -> None:
        self._resolver = None

    def resolver(self):
        if self._resolver is None:
            from linter.config import Overrides, Resolver

            self._resolver = Resolver(Overrides(), cwd=self.root)
        return self._resolver

    def lint(self, snapshot: Snapshot) -> Linted:
        """The findings left after `# noqa` (raises ConfigError for an invalid config)."""
        from linter.text import lint_text

        resolver = self.resolver()
        if self.projects is not None and snapshot.path.is_file():
            self.projects.include(os.path.abspath(snapshot.path), self.root)
        result = lint_text(snapshot.text, snapshot.path, resolver, cache=self.parse_cache())
        unsafe = resolver.for_path(snapshot.path).unsafe_fixes
        return Linted(snapshot, result.diagnostics, unsafe)

    def fix_all(self, snapshot: Snapshot, unsafe: bool) -> str:
        """The text with every applicable fix applied (the original when a fix misbehaves)."""
        from linter.text import lint_text

        choice = "unsafe" if unsafe else "safe"
        result = lint_text(snapshot.text, snapshot.path, self.resolver(), choice)
        if result.error or result.fixed is None:
            return snapshot.text
        return result.fixed


def lintable(path: Path, language_id: str | None) -> bool:
    """Python sources only (a `.ipynb` opened as text is the notebook's JSON)."""
    if path.suffix in (".py", ".pyi"):
        return True
    return path.suffix != ".ipynb" and language_id in (None, "python")


def default_root() -> Path:
    return Path(os.getcwd())
