"""Settings: `[tool.accel-lint]` in pyproject.toml (or `accel-lint.toml` / `.accel-lint.toml`).

Each linted file uses the closest config file above it (like ruff), unless `--config PATH` names
one for every file. Command-line options are layered on top: `--select` replaces `select`,
`--ignore` and `--extend-select` add to theirs. `exclude` patterns (gitignore syntax, relative to
the config file's directory) extend the built-in excludes instead of replacing them.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from linter import selection

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

CONFIG_NAMES = (".accel-lint.toml", "accel-lint.toml", "pyproject.toml")
DEFAULT_EXCLUDES = (
    ".accel_lint_cache", ".bzr", ".direnv", ".eggs", ".git", ".hg", ".mypy_cache", ".nox",
    ".pytest_cache", ".ruff_cache", ".svn", ".tox", ".venv", "__pypackages__", "_build",
    "buck-out", "build", "dist", "node_modules", "site-packages", "venv",
)  # fmt: skip
_KEYS = {
    "select", "ignore", "extend-select", "exclude", "per-file-ignores", "unsafe-fixes", "hints",
}  # fmt: skip


class ConfigError(ValueError):
    """An unreadable or invalid config (a usage error: exit 2)."""


@dataclass(frozen=True)
class Overrides:
    """What the command line says; None means "not given"."""

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    unsafe_fixes: bool | None = None
    hints: bool | None = None


@dataclass(frozen=True)
class Settings:
    """The resolved settings that apply to the files under one config file."""

    root: Path  # globs in `exclude` and `per-file-ignores` are relative to it
    source: Path | None  # the config file, None for the defaults
    codes: frozenset[str]
    exclude: tuple[str, ...] = DEFAULT_EXCLUDES
    per_file_ignores: tuple[tuple[str, frozenset[str]], ...] = ()
    unsafe_fixes: bool = False
    # Hint-level (info) findings are reported only when asked for, and never fail a run.
    hints: bool = False
    _matchers: dict = field(default_factory=dict, compare=False, repr=False)

    def codes_for(self, path: Path) -> frozenset[str]:
        """The enabled codes for one file, after `per-file-ignores`."""
        if not self.per_file_ignores:
            return self.codes
        codes = self.codes
        relative = _relative(path, self.root)
        for glob, ignored in self.per_file_ignores:
            matcher = self._matcher(glob)
            if matcher.match_file(relative) or matcher.match_file(path.name):
                codes = codes - ignored
        return codes

    def exclude_spec(self):
        """A gitignore-style matcher for `exclude` (pathspec is imported only when walking)."""
        return self._matcher("\n".join(self.exclude))

    def _matcher(self, patterns: str):
        if patterns not in self._matchers:
            import pathspec

            self._matchers[patterns] = pathspec.GitIgnoreSpec.from_lines(patterns.splitlines())
        return self._matchers[patterns]


def _relative(path: Path, root: Path) -> str:
    try:
        return Path(os.path.abspath(path)).relative_to(root).as_posix()
    except ValueError:
        return path.name


def read_table(path: Path) -> dict | None:
    """The accel-lint table of a config file; None for a pyproject.toml without one."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}{_quoted_line(path, exc)}") from None
    if path.name != "pyproject.toml":
        return data
    tool = data.get("tool")
    table = tool.get("accel-lint") if isinstance(tool, dict) else None
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{path}: `tool.accel-lint` must be a table")
    return table


def _quoted_line(path: Path, error) -> str:
    """The offending line of a TOML file, so the message shows the key."""
    lineno = getattr(error, "lineno", None)  # Python >= 3.14; else parsed from the message
    if lineno is None:
        found = re.search(r"at line (\d+)", str(error))
        lineno = int(found.group(1)) if found else None
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        return f": `{lines[lineno - 1].strip()}`" if lineno else ""
    except (OSError, IndexError):
        return ""


def _strings(path: Path, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: `{key}` must be a list of strings, not {value!r}")
    return tuple(value)


def _selectors(where, key: str, value: object, known) -> tuple[str, ...]:
    """One key's list of selectors, each checked against the known codes (errors name the key)."""
    selectors = _strings(where, key, value)
    for selector in selectors:
        try:
            selection.matching(selector, known)
        except selection.SelectionError as exc:
            raise ConfigError(f"{where}: `{key}`: {exc}") from None
    return selectors


def _unknown_keys(where, table: dict) -> None:
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        import difflib  # a misspelt key only

        close = difflib.get_close_matches(unknown[0], sorted(_KEYS), n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        names = ", ".join(f"`{k}`" for k in unknown)
        raise ConfigError(f"{where}: unknown key(s): {names}{hint}")


def validate_overrides(cli: Overrides) -> None:
    """Selectors given on the command line, checked before any config file is read."""
    from rules import ALL_RULES

    for option, selectors in (
        ("--select", cli.select or ()),
        ("--ignore", cli.ignore),
        ("--extend-select", cli.extend_select),
    ):
        for selector in selectors:
            try:
                selection.matching(selector, ALL_RULES)
            except selection.SelectionError as exc:
                raise ConfigError(f"{option}: {exc}") from None


def build(table: dict, source: Path | None, root: Path, cli: Overrides) -> Settings:
    """Validate one config table and resolve it with the command-line overrides."""
    from rules import ALL_RULES

    where = source or Path("<command line>")
    _unknown_keys(where, table)
    select = _selectors(where, "select", table.get("select", ["ACL"]), ALL_RULES)
    ignore = _selectors(where, "ignore", table.get("ignore", []), ALL_RULES)
    extend = _selectors(where, "extend-select", table.get("extend-select", []), ALL_RULES)
    exclude = _strings(where, "exclude", table.get("exclude", []))
    unsafe = _flag(where, table, "unsafe-fixes")
    hints = _flag(where, table, "hints")
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise ConfigError(f"{where}: `per-file-ignores` must be a table of glob = [codes]")
    per_file = []
    for glob, value in pfi.items():
        ignored = _selectors(where, f'per-file-ignores."{glob}"', value, ALL_RULES)
        codes = frozenset(c for s in ignored for c in selection.matching(s, ALL_RULES))
        per_file.append((glob, codes))
    codes = selection.resolve(
        ALL_RULES,
        cli.select if cli.select is not None else select,
        ignore + cli.ignore,
        extend + cli.extend_select,
    )
    return Settings(
        root=Path(os.path.abspath(root)),
        source=source,
        codes=codes,
        exclude=DEFAULT_EXCLUDES + exclude,
        per_file_ignores=tuple(per_file),
        unsafe_fixes=cli.unsafe_fixes if cli.unsafe_fixes is not None else unsafe,
        hints=cli.hints if cli.hints is not None else hints,
    )


def _flag(where, table: dict, key: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: `{key}` must be true or false, not {value!r}")
    return value


class Resolver:
    """Finds each file's settings: the closest config file above it, memoised per directory."""

    def __init__(self, cli: Overrides, config_path: Path | None = None, cwd: Path | None = None):
        self.cli = cli
        self.cwd = Path(os.path.abspath(cwd or Path.cwd()))
        self._by_dir: dict[Path, Settings] = {}
        self._fixed: Settings | None = None
        validate_overrides(cli)
        if config_path is not None:
            if not config_path.is_file():
                raise ConfigError(f"config file not found: {config_path}")
            table = read_table(config_path) or {}
            self._fixed = build(table, config_path, Path(os.path.abspath(config_path)).parent, cli)
        self.default = build({}, None, self.cwd, cli)
        self.project = self.for_directory(self.cwd)  # fail early on an invalid config

    def for_path(self, path: Path) -> Settings:
        directory = path if path.is_dir() else path.parent
        return self.for_directory(Path(os.path.abspath(directory)))

    def for_directory(self, directory: Path) -> Settings:
        if self._fixed is not None:
            return self._fixed
        if directory in self._by_dir:
            return self._by_dir[directory]
        settings = self._own(directory)
        if settings is None:
            parent = directory.parent
            settings = self.default if parent == directory else self.for_directory(parent)
        self._by_dir[directory] = settings
        return settings

    def _own(self, directory: Path) -> Settings | None:
        for name in CONFIG_NAMES:
            candidate = directory / name
            if candidate.is_file():
                table = read_table(candidate)
                if table is not None:
                    return build(table, candidate, directory, self.cli)
        return None
