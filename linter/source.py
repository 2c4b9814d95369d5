"""Read a Python file as text exactly as the interpreter would, and write it back the same way.

Decoding honours a UTF-8 BOM and PEP 263 coding cookies (`tokenize.detect_encoding`). Line endings
are kept as they are (no universal-newline translation) so fixes on CRLF files stay CRLF.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import signal
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass

# Python's tokenizer ends lines only at these; str.splitlines() would also split on \f, \x1c, ...
_NEWLINE = re.compile(r"\r\n|\r|\n")


class SourceError(Exception):
    """The file cannot be read or decoded: reported as one diagnostic, never a traceback."""

    def __init__(self, message: str, line: int = 1):
        super().__init__(message)
        self.line = line  # where the undecodable byte is (1 when the whole file is at fault)


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
    except (SyntaxError, LookupError) as exc:  # an unknown or contradictory coding cookie
        raise SourceError(f"cannot decode file: {exc}") from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        byte = data[exc.start : exc.start + 1].hex()
        reason = f"{exc.reason} (byte 0x{byte}, line {line})"
        hint = "declare its encoding with a coding comment (PEP 263)" if encoding == "utf-8" else ""
        message = f"cannot decode file as {encoding}: {reason}"
        raise SourceError(f"{message}; {hint}" if hint else message, line) from None
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


class FileChanged(OSError):
    """The file no longer holds the bytes a fix was computed from: it is not written."""


def write_atomic(path: str, data: bytes, expected: bytes | None = None) -> None:
    """Replace `path` with `data` via a temporary file in the same directory, keeping its mode.

    A symbolic link is written through (the link stays a link). A read-only file is refused,
    although replacing it would succeed (only the directory must be writable). With `expected`,
    a file whose bytes are no longer those is left alone (`FileChanged`): someone edited it
    since it was read. The check and the rename are not one atomic step, but the window is a
    few microseconds, not the seconds an analysis takes.
    """
    target = os.path.realpath(path)
    mode = os.stat(target).st_mode & 0o7777
    if not _writable(target, mode):
        raise PermissionError(errno.EACCES, "the file is read-only", path)
    if expected is not None and read_bytes(target) != expected:
        raise FileChanged(errno.EAGAIN, "the file changed on disk since it was read", path)
    folder = os.path.dirname(target)
    import tempfile  # here: only a fix writes, and tempfile loads random and shutil

    with _signals_held():
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".accel-lint-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and termination wait until the file is replaced or its temporary file removed.

    A terminal's Ctrl-C reaches every worker of a `--fix` run at once. A KeyboardInterrupt
    between creating the temporary file and the `try` that removes it, or the SIGTERM with
    which the pool ends a worker still writing, would leave `.accel-lint-*.tmp` behind. Blocked,
    they are delivered (and raised) right after the write."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _writable(path: str, mode: int) -> bool:
    """Writable for this user; for root (who may write anything) only with a write bit set."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return bool(mode & 0o222)
    return os.access(path, os.W_OK)
