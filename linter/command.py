"""What one `accel-lint` invocation does with its parsed options, whoever parsed them.

`linter.cli.main` parses the common invocations itself and `linter.typer_app` the rest (help,
usage errors); both call `lint` here, so neither imports the other. Heavy modules (rich, libcst,
the analysis) are imported only by the paths that need them.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path

from linter import __version__
from linter.types import failing


class OutputFormat(str, Enum):
    full = "full"
    concise = "concise"
    json = "json"
    github = "github"
    sarif = "sarif"


class Exit(Exception):
    """Leave with this exit code (typer's `Exit`, without importing typer)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def echo(message: str, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    stream.write(f"{message}\n")
    stream.flush()


def _fail(message: str) -> Exit:
    echo(f"error: {message}", err=True)
    return Exit(2)


def _selectors(values: list[str] | None) -> tuple[str, ...]:
    return tuple(s for value in values or () for s in value.replace(" ", ",").split(",") if s)


def _colour(stream) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR")


def _print_rich(renderable) -> None:
    from rich.console import Console

    Console(highlight=False).print(renderable)


def _explain(code: str) -> None:
    from linter.explain import UnknownCode, explain_markdown

    try:
        text = explain_markdown(code)
    except UnknownCode as exc:
        raise _fail(str(exc)) from None
    if _colour(sys.stdout):
        from rich.markdown import Markdown

        _print_rich(Markdown(text))
    else:
        sys.stdout.write(text)


def _list_rules() -> None:
    from linter.explain import rules_table_plain, rules_table_rich

    if _colour(sys.stdout):
        _print_rich(rules_table_rich())
    else:
        sys.stdout.write(rules_table_plain())


def _show_loops(path: Path, output_format: OutputFormat) -> int:
    from linter.analysis import ParseFailure
    from linter.notebooks.reader import NotebookError
    from linter.show_loops import as_json, as_tree, describe
    from linter.source import SourceError

    _enable_project([path], [path])
    try:
        description = describe(str(path))
    except SourceError as exc:
        raise _fail(f"{path}: {exc}") from None
    except NotebookError as exc:
        raise _fail(f"{path}: cannot read notebook: {exc}") from None
    except ParseFailure as failure:
        echo(_syntax_error_line(path, failure))
        return 1
    if output_format == OutputFormat.json:
        sys.stdout.write(as_json(description))
    else:
        _print_rich(as_tree(description, str(path)))
    return 0


def _syntax_error_line(path: Path, failure) -> str:
    """The ACL000 line for a file `--show-loops` could not parse (in a notebook, by cell)."""
    from linter import output
    from linter.output.concise import line
    from linter.reporting import syntax_error
    from linter.source import decode, read_bytes

    text, shown = decode(read_bytes(str(path))).text, str(path)
    if not shown.endswith(".ipynb"):
        return line(syntax_error(text, shown, failure), output.Context())
    from linter.notebooks import program_of

    program = program_of(text)
    context = output.Context(notebooks={shown: program.index})
    return line(syntax_error(program.text, shown, failure), context)


def lint(
    paths: list[Path] | None = None,
    fix: bool = False,
    unsafe_fixes: bool | None = None,
    diff: bool = False,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    extend_select: list[str] | None = None,
    output_format: OutputFormat = OutputFormat.full,
    statistics: bool = False,
    exit_zero: bool = False,
    no_cache: bool = False,
    config: Path | None = None,
    explain: str | None = None,
    list_rules: bool = False,
    show_loops: Path | None = None,
    version: bool = False,
    stdin_filename: Path | None = None,
    add_noqa: bool = False,
    output_file: Path | None = None,
    quiet: bool = False,
    hints: bool | None = None,
) -> int:
    """The command itself: its exit code (`Exit` for a usage error)."""
    if version:
        echo(f"accel-lint {__version__}")
        return 0
    if explain is not None:
        _explain(explain)
        return 0
    if list_rules:
        _list_rules()
        return 0
    from linter.config import ConfigError, Overrides, Resolver

    overrides = Overrides(
        select=_selectors(select) or None,
        ignore=_selectors(ignore),
        extend_select=_selectors(extend_select),
        unsafe_fixes=unsafe_fixes,
        hints=hints,
    )
    try:
        resolver = Resolver(overrides, config)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    if show_loops is not None:
        return _show_loops(show_loops, output_format)
    mode = "diff" if diff else "write" if fix else "none"
    from linter.output.printer import OutputError, Printer

    printer = Printer(output_format.value, statistics, quiet, output_file)
    try:
        if stdin_filename is not None or paths == [Path("-")]:
            code = _stdin(paths or [], stdin_filename, resolver, mode, printer, add_noqa)
        elif add_noqa:
            if mode != "none":
                raise _fail("--add-noqa cannot be combined with --fix or --diff")
            code = _add_noqa(paths or [Path(".")], resolver, printer, no_cache)
        else:
            code = _check(paths or [Path(".")], resolver, mode, printer, no_cache)
    except ConfigError as exc:  # a nested config file found while walking
        raise _fail(str(exc)) from None
    except OutputError as exc:
        raise _fail(str(exc)) from None
    return 0 if exit_zero and code == 1 else code


def _stdin(paths, filename, resolver, mode, printer, add_noqa: bool) -> int:
    from linter import stdin

    if add_noqa:
        raise _fail("--add-noqa cannot be used with standard input")
    for path in paths:
        if path != Path("-"):
            echo(f"warning: ignoring {path}: the source is read from stdin", err=True)
    try:
        return stdin.run(filename, resolver, mode, printer)
    except stdin.StdinError as exc:
        raise _fail(f"{filename or '-'}: {exc}") from None


def _lint_files(paths, resolver, mode, printer, no_cache):
    """Discover and lint the files (through the cache); errors and notes printed on stderr."""
    from linter import runner
    from linter.discovery import discover

    found = discover(paths, resolver)
    for note in found.notes:
        printer.say(f"note: {note}")
    cache = None
    if no_cache:  # nor the compiled dataclass code kept in the user's cache directory
        from linter.analysis import store_no_code

        store_no_code()
    else:
        from linter.cache import Cache, default_directory

        cache = Cache(default_directory(resolver.project.root))
    named = frozenset(os.path.abspath(p) for p in paths if not p.is_dir())
    _enable_project(paths, [path for path, _ in found.files], cache)
    report = runner.run(found.files, mode, cache, named)
    if cache is not None:
        cache.save()
    for note in sorted({note for result in report.results for note in result.notes}):
        printer.say(f"note: {note}")
    for shown, message in report.errors:
        echo(f"error: {shown}: {message}", err=True)
    return report


def _enable_project(paths, linted, cache=None) -> None:
    """Files read from disk are analysed in their project (ACCEL_LINT_NO_PROJECT=1: alone);
    `linted`: the files this run reports on; `cache`: the results cache, whose directory
    also keeps the project's importer index and summaries."""
    from linter import project

    if os.environ.get("ACCEL_LINT_NO_PROJECT"):
        return project.enable(None)
    store = cache.project_directory if cache is not None else None
    project.enable(project.for_paths(paths, linted, store))


def _check(paths, resolver, mode, printer, no_cache) -> int:
    report = _lint_files(paths, resolver, mode, printer, no_cache)
    if mode == "diff":
        sys.stdout.write("".join(report.diffs))
        if report.fixed:
            printer.say(f"Would fix {_errors(report.fixed)}.")
        return 2 if report.errors else (1 if report.diffs else 0)
    diagnostics = report.diagnostics
    unsafe = resolver.project.unsafe_fixes
    printer.report(diagnostics, printer.context(unsafe, diagnostics, len(report.errors)))
    if report.fixed:
        printer.say(f"Fixed {_errors(report.fixed)}.")
    return 2 if report.errors else (1 if failing(diagnostics) else 0)


def _add_noqa(paths, resolver, printer, no_cache) -> int:
    """Suppress every finding in place (`--add-noqa`): a codebase adopts the linter today."""
    from linter.adopt import add_noqa_to_file

    report = _lint_files(paths, resolver, "none", printer, no_cache)
    added = left = 0
    for result in report.results:
        if result.diagnostics:
            try:
                changed, unsuppressable = add_noqa_to_file(result.shown, result.diagnostics)
            except OSError as exc:
                echo(f"error: {result.shown}: cannot add noqa: {exc.strerror}", err=True)
                return 2
            added, left = added + changed, left + unsuppressable
    printer.say(f"Added {added} noqa directive{'s' if added != 1 else ''}.")
    if left:
        echo(f"warning: {left} finding(s) are on lines that cannot take a comment", err=True)
    return 2 if report.errors else 0


def _errors(count: int) -> str:
    return f"{count} error{'s' if count != 1 else ''}"
