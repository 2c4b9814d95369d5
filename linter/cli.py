"""The `accel-lint` command: options mirror ruff's so a ruff user needs no manual.

Exit codes: 0 no findings left, 1 findings left, 2 usage or internal error. Heavy modules (rich,
libcst, the analysis) are imported only by the paths that need them. Start-up time is most of a
pre-commit run, and typer (with its click) is a sixth of a one-file run: `main` parses the common
invocations (known options, well-formed values) itself, the way click would, and hands anything
else (`--help`, a usage error, an option it does not know) to the typer app, which owns the help
text and the error messages. Both hand the options to `linter.command.lint`, which does the work.
`tests/linter/cli/test_fast_path.py` checks both parse alike.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from linter import __version__
from linter.command import Exit, OutputFormat, echo, lint


def __getattr__(name: str):
    if name == "app":  # `from linter.cli import app`: typer is imported by who asks for it
        from linter.typer_app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The options `main` parses itself, as the typer app declares them (test_fast_path.py compares
# the two): a flag's parameter and value, a value option's parameter and whether it repeats.
_FLAGS = {
    "--fix": ("fix", True),
    "--unsafe-fixes": ("unsafe_fixes", True),
    "--no-unsafe-fixes": ("unsafe_fixes", False),
    "--diff": ("diff", True),
    "--statistics": ("statistics", True),
    "--exit-zero": ("exit_zero", True),
    "--no-cache": ("no_cache", True),
    "--list-rules": ("list_rules", True),
    "--version": ("version", True),
    "--add-noqa": ("add_noqa", True),
    "--quiet": ("quiet", True),
    "-q": ("quiet", True),
    "--hints": ("hints", True),
    "--no-hints": ("hints", False),
}
_VALUES = {
    "--select": ("select", True),
    "--ignore": ("ignore", True),
    "--extend-select": ("extend_select", True),
    "--output-format": ("output_format", False),
    "--config": ("config", False),
    "--explain": ("explain", False),
    "--show-loops": ("show_loops", False),
    "--stdin-filename": ("stdin_filename", False),
    "--output-file": ("output_file", False),
    "-o": ("output_file", False),
}
_PATHS = frozenset({"paths", "config", "show_loops", "stdin_filename", "output_file"})


def _parse(args: list[str]) -> dict | None:
    """`lint`'s arguments for `args` as click would give them, or None where click would say
    more than the options (help, a usage error) or this parser is unsure: typer decides."""
    options: dict = {}
    paths: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        if not token.startswith("-"):
            paths.append(token)
            continue
        name, equals, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if name in _FLAGS and not equals:
            key, flag = _FLAGS[name]
            options[key] = flag
            continue
        if name not in _VALUES:
            return None  # --help, `-`, `--`, bundled short options, an unknown option
        if not equals:
            if index == len(args):
                return None
            value = args[index]
            index += 1
        if not value or value.startswith("-"):
            return None
        key, repeats = _VALUES[name]
        if repeats:
            options.setdefault(key, []).append(value)
        else:
            options[key] = value
    if paths:
        options["paths"] = paths
    for key in _PATHS & options.keys():
        values = options[key] if key == "paths" else [options[key]]
        # click's Path checks: an existing path it cannot read is a usage error.
        if any(os.path.exists(v) and not os.access(v, os.R_OK) for v in values):
            return None
        options[key] = [Path(v) for v in values] if key == "paths" else Path(values[0])
    if "output_format" in options:
        try:
            options["output_format"] = OutputFormat(options["output_format"])
        except ValueError:
            return None
    return options


def _run(options: dict) -> None:
    """`lint(**options)` with the exits typer's `main` gives the same outcomes."""
    import errno

    try:
        try:
            code = lint(**options)
        except EOFError:
            echo("", err=True)
            echo("Aborted!", err=True)
            code = 1
        except KeyboardInterrupt:
            code = 130
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            sys.stdout, sys.stderr = _Pacified(sys.stdout), _Pacified(sys.stderr)
            code = 1
    except Exit as exc:
        code = exc.code
    sys.exit(code)


class _Pacified:
    """A stream whose flush ignores a closed pipe (click's PacifyFlushWrapper)."""

    def __init__(self, wrapped):
        self.wrapped = wrapped

    def flush(self) -> None:
        try:
            self.wrapped.flush()
        except OSError as exc:
            import errno

            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, name):
        return getattr(self.wrapped, name)


def main() -> None:
    args = sys.argv[1:]
    if args == ["--version"]:  # the fastest path: nothing else imported
        print(f"accel-lint {__version__}")
        return
    if args[:1] == ["server"]:  # the language server (as `ruff server`); lint ./server
        from linter.server import main as serve

        sys.exit(serve(args[1:]))
    # Shell completion is typer's; Windows expands wildcards in typer's own parse.
    completing = any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ)
    options = None if completing or os.name == "nt" else _parse(args)
    if options is not None:
        _run(options)
    from linter.typer_app import app

    app()


if __name__ == "__main__":
    main()
