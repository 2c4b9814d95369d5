"""Module names to the project's own files, as Python would find them from the project root
(and `src/`), or from the importing script's own directory (a script's directory is first on
`sys.path`). A name that resolves to no file of the project is third-party or stdlib: never
followed."""

from __future__ import annotations

import os
from pathlib import Path


class Modules:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bases = [root] + ([root / "src"] if (root / "src").is_dir() else [])
        self._resolved: dict[tuple[str, str | None], str | None] = {}

    def resolve(self, module: str, importer: str | None = None) -> str | None:
        """The file of `module` (a package's `__init__.py`), or None outside the project."""
        if not module:
            return None
        key = (module, os.path.dirname(importer) if importer else None)
        if key not in self._resolved:
            self._resolved[key] = self._resolve(module, importer)
        return self._resolved[key]

    def _resolve(self, module: str, importer: str | None) -> str | None:
        parts = module.split(".")
        bases = list(self.bases)
        if importer is not None:
            here = Path(importer).parent
            if here not in bases and self._inside(here):
                bases.insert(0, here)
        for base in bases:
            candidate = base.joinpath(*parts)
            for path in (candidate.with_name(parts[-1] + ".py"), candidate / "__init__.py"):
                if path.is_file():
                    return str(path)
        return None

    def package_of(self, path: str) -> str:
        """The dotted package a file is in, relative to the deepest base holding it."""
        name = self.name_of(path)
        if name is None:
            return ""
        if os.path.basename(path) == "__init__.py":
            return name
        return name.rpartition(".")[0]

    def name_of(self, path: str) -> str | None:
        file = Path(path)
        for base in sorted(self.bases, key=lambda b: len(b.parts), reverse=True):
            try:
                relative = file.relative_to(base)
            except ValueError:
                continue
            parts = list(relative.with_suffix("").parts)
            if parts and parts[-1] == "__init__":
                parts.pop()
            if parts and all(p.isidentifier() for p in parts):
                return ".".join(parts)
        return None

    def _inside(self, path: Path) -> bool:
        try:
            path.relative_to(self.root)
        except ValueError:
            return False
        return True
