"""Module names to the project's own files, as Python would find them from the project root
(and `src/`), or from the importing script's own directory (a script's directory is first on
`sys.path`). A name that resolves to no file of the project is third-party or stdlib: never
followed.

Paths are plain strings joined with `os.path` and every answer is remembered: a run asks the
same few hundred questions thousands of times, and `pathlib` objects cost more than the
lookups they make."""

from __future__ import annotations

import os
from pathlib import Path


class Modules:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._root = str(root)
        src = os.path.join(self._root, "src")
        self._bases = [self._root] + ([src] if os.path.isdir(src) else [])
        self.bases = [Path(base) for base in self._bases]
        self._resolved: dict[tuple[str, str | None], str | None] = {}
        self._names: dict[str, str | None] = {}
        self._files: dict[str, bool] = {}
        self._heads: dict[tuple[str, str | None], bool] = {}

    def resolve(self, module: str, importer: str | None = None) -> str | None:
        """The file of `module` (a package's `__init__.py`), or None outside the project."""
        if not module:
            return None
        key = (module, os.path.dirname(importer) if importer else None)
        if key not in self._resolved:
            self._resolved[key] = self._resolve(module, key[1])
        return self._resolved[key]

    def _resolve(self, module: str, here: str | None) -> str | None:
        parts = module.split(".")
        bases = list(self._bases)
        if here is not None and here not in bases and self._inside(here):
            bases.insert(0, here)
        for base in bases:
            candidate = os.path.join(base, *parts)
            for path in (candidate + ".py", os.path.join(candidate, "__init__.py")):
                if self._is_file(path):
                    return path
        return None

    def may_hold(self, head: str, importer: str | None = None) -> bool:
        """Whether a module whose dotted name starts with `head` may be the project's: a
        package directory (a namespace package too) or a module of that name where
        `resolve` looks."""
        key = (head, os.path.dirname(importer) if importer else None)
        if key not in self._heads:
            bases = list(self._bases)
            if key[1] is not None and key[1] not in bases and self._inside(key[1]):
                bases.append(key[1])
            self._heads[key] = any(
                os.path.isdir(os.path.join(base, head))
                or self._is_file(os.path.join(base, head + ".py"))
                for base in bases
            )
        return self._heads[key]

    def forget(self) -> None:
        """Drop every answer (a module was created or deleted: a long-lived server's case)."""
        self._resolved.clear()
        self._files.clear()
        self._heads.clear()

    def _is_file(self, path: str) -> bool:
        known = self._files.get(path)
        if known is None:
            known = self._files[path] = os.path.isfile(path)
        return known

    def package_of(self, path: str) -> str:
        """The dotted package a file is in, relative to the deepest base holding it."""
        name = self.name_of(path)
        if name is None:
            return ""
        if os.path.basename(path) == "__init__.py":
            return name
        return name.rpartition(".")[0]

    def name_of(self, path: str) -> str | None:
        if path not in self._names:
            self._names[path] = self._name_of(os.path.abspath(path))
        return self._names[path]

    def _name_of(self, path: str) -> str | None:
        for base in sorted(self._bases, key=len, reverse=True):
            if not path.startswith(base + os.sep):
                continue
            parts = os.path.splitext(path[len(base) + 1 :])[0].split(os.sep)
            if parts and parts[-1] == "__init__":
                parts.pop()
            if parts and all(p.isidentifier() for p in parts):
                return ".".join(parts)
        return None

    def _inside(self, path: str) -> bool:
        return path == self._root or path.startswith(self._root + os.sep)
