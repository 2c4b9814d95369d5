"""Reading source the interpreter's way: BOM, coding cookies, CRLF, undecodable bytes."""

import os
import stat

import pytest

from linter.source import SourceError, decode, line_starts, split_lines, write_atomic


def test_utf8_bom_is_stripped_and_restored():
    source = decode(b"\xef\xbb\xbfx = 'caf\xc3\xa9'\n")
    assert source.text == "x = 'café'\n"
    assert source.encode(source.text) == b"\xef\xbb\xbfx = 'caf\xc3\xa9'\n"


def test_pep263_cookie_decodes_latin1():
    data = b"# -*- coding: latin-1 -*-\nx = '\xe9'\n"
    source = decode(data)
    assert source.text.splitlines()[1] == "x = 'é'"
    assert source.encode(source.text) == data


def test_crlf_is_kept_and_reported():
    source = decode(b"a = 1\r\nb = 2\r\n")
    assert source.text == "a = 1\r\nb = 2\r\n"
    assert source.newline == "\r\n"


@pytest.mark.parametrize(
    "data",
    [b"x = '\xff\xfe'\n", b"# coding: no-such-codec\nx = 1\n", b"\xef\xbb\xbf# coding: latin-1\n"],
)
def test_undecodable_bytes_raise_source_error(data):
    with pytest.raises(SourceError, match="cannot decode"):
        decode(data)


def test_lines_split_only_where_python_splits():
    text = "a = '\x0c'\r\nb\rc\n"
    assert split_lines(text) == ["a = '\x0c'", "b", "c", ""]
    assert line_starts(text) == [0, 9, 11, 13]


def test_write_atomic_keeps_mode_and_leaves_no_temp(tmp_path):
    target = tmp_path / "script.py"
    target.write_bytes(b"old\n")
    os.chmod(target, 0o751)
    write_atomic(str(target), b"new\n")
    assert target.read_bytes() == b"new\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o751
    assert os.listdir(tmp_path) == ["script.py"]
