"""`--output-format concise`: one line per diagnostic, `path:line:col: CODE [*] message`
(`path:cell N:line:col: ...` in a notebook), and `[latent: ...]` or `[default config: ...]` after
a finding that depends on the script's configuration."""

from __future__ import annotations

from linter.output import Context, fixable, placed, where
from linter.types import Diagnostic


def line(diagnostic: Diagnostic, context: Context) -> str:
    marker = "[*] " if fixable(diagnostic, context) else ""
    shown = placed(diagnostic, context)[1]
    suffix = f" [{_short(shown.configuration)}]" if shown.configuration is not None else ""
    return f"{where(diagnostic, context)}: {diagnostic.code} {marker}{shown.message}{suffix}"


def _short(configuration) -> str:
    """`latent: with --k > 1 (default 1)` or `default config: with --k > 1 (default 4)`."""
    label = "default config" if configuration.affects_default else "latent"
    return f"{label}: {configuration.condition}"


def render(diagnostics: list[Diagnostic], context: Context) -> str:
    return "".join(line(d, context) + "\n" for d in diagnostics)
