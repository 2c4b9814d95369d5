"""Read a Python file as text exactly as the interpreter would, and write it back the same way.

Decoding honours a UTF-8 BOM and PEP 263 coding cookies (`tokenize.detect_encoding`). Line endings
are kept as they are (no universal-newline translation) so fixes on CRLF files stay CRLF.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
import tokenize
from dataclasses import dataclass

# Python's tokenizer ends lines only at these; str.splitlines() would also split on \f, \x1c, ...
_NEWLINE = re.compile(r"\r\n|\r|\n")


class SourceError(Exception):
    """The file cannot be read or decoded: reported as one diagnostic, never a traceback."""


@dataclass(frozen=True)
class SourceText:
    text: str
    encoding: str  # as tokenize names it; "utf-8-sig" means the file starts with a BOM
    newline: str  # the first line ending found, "\n" when there is none

    def encode(self, text: str) -> bytes:
        """Bytes for `text` in this file's encoding (the BOM comes back with utf-8-sig)."""
        return text.encode(self.encoding)


def decode(data: bytes) -> SourceText:
    """Decode a module's bytes the way the interpreter does."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot decode file: {exc}") from None
    match = _NEWLINE.search(text)
    return SourceText(text, encoding, match.group() if match else "\n")


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise SourceError(f"cannot read file: {exc.strerror or exc}") from None


def line_starts(text: str) -> list[int]:
    """Offset of the first character of each line (index 0 is line 1)."""
    return [0] + [m.end() for m in _NEWLINE.finditer(text)]


def split_lines(text: str) -> list[str]:
    """The lines of `text` without their endings, split where Python splits them."""
    return _NEWLINE.split(text)


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` with `data` via a temporary file in the same directory, keeping its mode."""
    directory = os.path.dirname(os.path.abspath(path))
    mode = os.stat(path).st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".accel-lint-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
