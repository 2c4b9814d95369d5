"""`--add-noqa`: write a `# noqa: CODE` on every line with a finding, in modules and notebooks.

A team turns the linter on today and fixes later: each finding is suppressed where it starts, codes
already in a directive on that line are kept, and a second run adds nothing. Files are rewritten
atomically in their own encoding and line endings; a notebook changes only in the cells touched.
"""

from __future__ import annotations

import os

from linter import noqa
from linter.selection import PARSE_ERROR
from linter.source import decode, read_bytes, write_atomic
from linter.types import Diagnostic


def add_noqa_to_file(shown: str, diagnostics: list[Diagnostic]) -> tuple[int, int]:
    """Add the directives to the file; returns (lines changed, findings left unsuppressed)."""
    if all(d.code == PARSE_ERROR for d in diagnostics):
        return 0, 0  # a file that does not parse gets no directive (as in ruff)
    path = os.path.abspath(shown)
    data = read_bytes(path)
    if shown.endswith(".ipynb"):
        new_data, changed, left = _notebook(data, diagnostics)
    else:
        source = decode(data)
        text, changed, left = noqa.add_directives(source.text, diagnostics)
        new_data = source.encode(text)
    if changed:
        write_atomic(path, new_data)
    return changed, left


def _notebook(data: bytes, diagnostics: list[Diagnostic]) -> tuple[bytes, int, int]:
    from linter.notebooks import program_of, replace_sources

    text = data.decode("utf-8")
    program = program_of(text)
    new_program, changed, left = noqa.add_directives(program.text, diagnostics)
    if not changed:
        return data, 0, left
    sources = program.cell_sources(new_program)
    if sources is None:  # comments at line ends keep the cells apart; never write on a doubt
        return data, 0, len(diagnostics)
    bom = "\ufeff" * text.startswith("\ufeff")
    return (bom + replace_sources(program.notebook, sources)).encode("utf-8"), changed, left
