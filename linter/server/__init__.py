"""`accel-lint server`: the linter as a language server (LSP over stdio), built on pygls.

Importing this package imports nothing beyond the standard library: pygls, libcst and the rules
load only when the server starts, so `accel-lint --version` and plain runs never pay for them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

USAGE = "accel-lint server [--root DIR] [--log-level LEVEL]"


def main(argv: list[str] | None = None) -> int:
    """Serve LSP on stdin/stdout until the client sends `exit`."""
    parser = argparse.ArgumentParser("accel-lint server", usage=USAGE, description=main.__doc__)
    parser.add_argument("--root", type=Path, help="Project root when the client names none.")
    parser.add_argument("--log-level", default="WARNING", help="Logged to stderr (WARNING).")
    options = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=options.log_level.upper(), format="accel-lint server: %(message)s")
    try:
        from linter.server.features import start
    except ImportError as exc:  # pygls is the `server` extra
        parser.exit(2, f"error: {exc.name} is not installed: pip install 'accel-lint[server]'\n")
    start(options.root)
    return 0
