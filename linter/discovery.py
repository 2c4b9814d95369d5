"""Find the files to lint (.py, .ipynb): walk directories honouring `.gitignore`, `exclude`.

Files and directories named on the command line are always linted (like ruff without
`force-exclude`); `exclude` and `.gitignore` apply to what a directory walk finds below them.
`.gitignore` files are read in every walked directory and in the walk root's parents up to the
repository root; the deepest match wins, so nested files and `!negations` behave as in git.
Walks find `.py` files and Jupyter notebooks (`.ipynb`), as ruff does. A walk does not follow
symbolic links to directories (so a link loop cannot trap it); a linked file is linted once, under
the first name found, and a broken or looping link is reported as unreadable.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from linter.config import Resolver, Settings


@dataclass
class Discovered:
    files: list[tuple[Path, Settings]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def discover(paths: list[Path], resolver: Resolver) -> Discovered:
    """Every file to lint, each with its settings, in a stable order without duplicates."""
    found = Discovered()
    seen: set[Path] = set()
    for path in paths:
        if path.is_dir():
            candidates = _walk(path, resolver)
        else:  # a named file (or a missing one: reading it reports the problem)
            candidates = iter([(path, resolver.for_path(path))])
        for file, settings in candidates:
            key = Path(os.path.realpath(file))  # a symbolic link and its target: one file
            if key not in seen:
                seen.add(key)
                found.files.append((file, settings))
    return found


class _Ignores:
    """The `.gitignore` specs that apply in one directory, outermost first."""

    def __init__(self, specs: list[tuple[Path, object]]):
        self.specs = specs

    def entering(self, directory: Path) -> _Ignores:
        spec = _load_gitignore(directory)
        return _Ignores(self.specs + [(directory, spec)]) if spec is not None else self

    def ignored(self, path: Path, is_dir: bool) -> bool:
        for base, spec in reversed(self.specs):
            decision = _own_match(spec, path.relative_to(base).as_posix(), is_dir)
            if decision is not None:
                return decision
        return False


def _load_gitignore(directory: Path):
    gitignore = directory / ".gitignore"
    if not gitignore.is_file():
        return None
    import pathspec

    try:
        lines = gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _outer_ignores(root: Path) -> _Ignores:
    """The `.gitignore` files of the walk root's parents, up to the repository's top."""
    parents = []
    for parent in root.parents:
        parents.append(parent)
        if (parent / ".git").exists():
            break
    else:
        parents = []  # not in a repository: only the walked tree's own files apply
    ignores = _Ignores([])
    for parent in reversed(parents):
        ignores = ignores.entering(parent)
    return ignores


def _walk(root: Path, resolver: Resolver) -> Iterator[tuple[Path, Settings]]:
    absolute = Path(os.path.abspath(root))
    yield from _walk_dir(root, absolute, _outer_ignores(absolute), resolver)


def _walk_dir(shown: Path, absolute: Path, ignores: _Ignores, resolver: Resolver):
    ignores = ignores.entering(absolute)
    settings = resolver.for_directory(absolute)
    exclude = settings.exclude_spec()
    try:
        entries = sorted(os.scandir(absolute), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        is_dir = entry.is_dir(follow_symlinks=False)
        if not is_dir and not entry.name.endswith((".py", ".ipynb")):
            continue
        path = absolute / entry.name
        if _excluded(exclude, path, settings.root, is_dir) or ignores.ignored(path, is_dir):
            continue
        if is_dir:
            if entry.name != ".git":
                yield from _walk_dir(shown / entry.name, path, ignores, resolver)
        else:
            yield shown / entry.name, settings


def _excluded(spec, path: Path, root: Path, is_dir: bool) -> bool:
    try:
        relative = path.relative_to(root).as_posix()
    except ValueError:
        relative = path.name
    return bool(_own_match(spec, relative, is_dir))


def _own_match(spec, relative: str, is_dir: bool) -> bool | None:
    """The spec's decision for this entry itself (None: no pattern applies).

    Only patterns that match the entry's own name count, not ones that match because a parent
    directory matches: the walk reaches a matched parent only when the user named it (or a
    directory inside it), and then, as in ruff, its contents are linted.
    """
    path = relative + ("/" if is_dir else "")
    if not spec.check_file(path).include:
        return spec.check_file(path).include
    decision = None
    for pattern in spec.patterns:
        if pattern.include is None:
            continue
        result = pattern.match_file(path)
        if result is not None and result.match.end() == len(path):
            decision = pattern.include
    return decision
