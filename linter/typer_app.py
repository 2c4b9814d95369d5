"""The typer app behind `accel-lint`: its help text, its usage errors, and every invocation that
`linter.cli.main` does not parse itself (importing typer and click costs a sixth of a one-file run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from linter import command
from linter.command import OutputFormat

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


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
    try:
        code = command.lint(
            paths=paths,
            fix=fix,
            unsafe_fixes=unsafe_fixes,
            diff=diff,
            select=select,
            ignore=ignore,
            extend_select=extend_select,
            output_format=output_format,
            statistics=statistics,
            exit_zero=exit_zero,
            no_cache=no_cache,
            config=config,
            explain=explain,
            list_rules=list_rules,
            show_loops=show_loops,
            version=version,
            stdin_filename=stdin_filename,
            add_noqa=add_noqa,
            output_file=output_file,
            quiet=quiet,
            hints=hints,
        )
    except command.Exit as exc:
        raise typer.Exit(exc.code) from None
    raise typer.Exit(code)
