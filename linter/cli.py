"""The `accel-lint` command: options mirror ruff's so a ruff user needs no manual.

Exit codes: 0 no findings left, 1 findings left, 2 usage or internal error. Heavy modules (rich,
libcst, the analysis) are imported only by the paths that need them; `--version` answers before
typer is even imported, because start-up time is most of a pre-commit run.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from linter import __version__
from linter.types import failing

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


class OutputFormat(str, Enum):
    full = "full"
    concise = "concise"
    json = "json"
    github = "github"
    sarif = "sarif"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


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

    try:
        description = describe(str(path))
    except SourceError as exc:
        raise _fail(f"{path}: {exc}") from None
    except NotebookError as exc:
        raise _fail(f"{path}: cannot read notebook: {exc}") from None
    except ParseFailure as failure:
        typer.echo(_syntax_error_line(path, failure))
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
    from linter.runner import syntax_error
    from linter.source import decode, read_bytes

    text, shown = decode(read_bytes(str(path))).text, str(path)
    if not shown.endswith(".ipynb"):
        return line(syntax_error(text, shown, failure), output.Context())
    from linter.notebooks import program_of

    program = program_of(text)
    context = output.Context(notebooks={shown: program.index})
    return line(syntax_error(program.text, shown, failure), context)


@app.command()
def lint(
    paths: Annotated[list[Path] | None, typer.Argument(help="Files or directories.")] = None,
    fix: Annotated[bool, typer.Option("--fix", help="Apply safe fixes.")] = False,
    unsafe_fixes: Annotated[
        bool | None,
        typer.Option("--unsafe-fixes/--no-unsafe-fixes", help="Also apply/show unsafe fixes."),
    ] = None,
    diff: Annotated[bool, typer.Option("--diff", help="Print the fixes as a diff.")] = False,
    select: Annotated[list[str] | None, typer.Option(help="Codes or prefixes.")] = None,
    ignore: Annotated[list[str] | None, typer.Option(help="Codes or prefixes.")] = None,
    extend_select: Annotated[list[str] | None, typer.Option(help="Added to select.")] = None,
    output_format: Annotated[OutputFormat, typer.Option()] = OutputFormat.full,
    statistics: Annotated[bool, typer.Option("--statistics", help="Counts per code.")] = False,
    exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 on findings.")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Ignore the cache.")] = False,
    config: Annotated[Path | None, typer.Option(help="Use this config file only.")] = None,
    explain: Annotated[str | None, typer.Option(help="Explain a rule code.")] = None,
    list_rules: Annotated[bool, typer.Option("--list-rules", help="List every rule.")] = False,
    show_loops: Annotated[Path | None, typer.Option(help="Show the loop model.")] = None,
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
    stdin_filename: Annotated[
        Path | None, typer.Option(help="Read the source from stdin, linted as this path.")
    ] = None,
    add_noqa: Annotated[
        bool, typer.Option("--add-noqa", help="Add `# noqa: CODE` to each line with a finding.")
    ] = False,
    output_file: Annotated[
        Path | None, typer.Option("--output-file", "-o", help="Write the report to this file.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print the findings only.")] = False,
    hints: Annotated[
        bool | None,
        typer.Option("--hints/--no-hints", help="Also report hints (never fail the run)."),
    ] = None,
) -> None:
    """Catch silent mixed-precision, gradient-accumulation and data-parallel bugs."""
    if version:
        typer.echo(f"accel-lint {__version__}")
        return
    if explain is not None:
        return _explain(explain)
    if list_rules:
        return _list_rules()
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
        raise typer.Exit(_show_loops(show_loops, output_format))
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
    raise typer.Exit(0 if exit_zero and code == 1 else code)


def _stdin(paths, filename, resolver, mode, printer, add_noqa: bool) -> int:
    from linter import stdin

    if add_noqa:
        raise _fail("--add-noqa cannot be used with standard input")
    for path in paths:
        if path != Path("-"):
            typer.echo(f"warning: ignoring {path}: the source is read from stdin", err=True)
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
    if not no_cache:
        from linter.cache import Cache, default_directory

        cache = Cache(default_directory(resolver.project.root))
    named = frozenset(os.path.abspath(p) for p in paths if not p.is_dir())
    report = runner.run(found.files, mode, cache, named)
    if cache is not None:
        cache.save()
    for shown, message in report.errors:
        typer.echo(f"error: {shown}: {message}", err=True)
    return report


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
                typer.echo(f"error: {result.shown}: cannot add noqa: {exc.strerror}", err=True)
                return 2
            added, left = added + changed, left + unsuppressable
    printer.say(f"Added {added} noqa directive{'s' if added != 1 else ''}.")
    if left:
        typer.echo(f"warning: {left} finding(s) are on lines that cannot take a comment", err=True)
    return 2 if report.errors else 0


def _errors(count: int) -> str:
    return f"{count} error{'s' if count != 1 else ''}"


def main() -> None:
    if sys.argv[1:] == ["--version"]:  # the fast path: no typer, no click
        print(f"accel-lint {__version__}")
        return
    if sys.argv[1:2] == ["server"]:  # the language server (as `ruff server`); lint ./server
        from linter.server import main as serve

        sys.exit(serve(sys.argv[2:]))
    app()


if __name__ == "__main__":
    main()
