"""The "Disable CODE for this line" edit on its own: the changed line, and where none can go."""

from __future__ import annotations

import pytest
from pygls.workspace.position_codec import PositionCodec

from linter.server.actions import changed_span, noqa_edit
from linter.server.convert import Lines
from linter.types import Diagnostic, Position


def disable(text: str, line: int, code: str = "ACL301"):
    finding = Diagnostic(code, "m", "t.py", Position(line, 4), Position(line, 19))
    edit = noqa_edit(text, finding, Lines(text, PositionCodec()))
    if edit is None:
        return None
    start, end = edit.range.start, edit.range.end
    return (start.line, start.character), (end.line, end.character), edit.new_text


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("loss.backward()\n", "loss.backward()  # noqa: ACL301\n"),
        ("loss.backward()  # sum\n", "loss.backward()  # sum  # noqa: ACL301\n"),
        ("loss.backward()  # noqa: ACL303\n", "loss.backward()  # noqa: ACL303, ACL301\n"),
        ("loss.backward()\r\n", "loss.backward()  # noqa: ACL301\r\n"),
    ],
)
def test_the_line_is_replaced_with_its_noqa_line(line, expected):
    text = f"for x in y:\n    {line}    step()\n"
    assert disable(text, 2) == ((1, 0), (2, 0), f"    {expected}")


def test_the_last_line_without_a_newline():
    assert disable("x = 1\nloss.backward()", 2) == (
        (1, 0),
        (1, 15),
        "loss.backward()  # noqa: ACL301",
    )


@pytest.mark.parametrize(
    "text",
    [
        'log("""start\nend""")\n',  # line 1 ends inside a string: a comment would join it
        "total = a + \\\n    b\n",  # a comment after a line continuation is a syntax error
    ],
)
def test_no_edit_where_a_comment_cannot_go(text):
    assert disable(text, 1) is None


def test_changed_span_keeps_unchanged_lines_out():
    before = "a = '🔥'\nb = 1\nc = 2\n"
    after = "a = '🔥'\nb = 10\nc = 2\n"
    edit = changed_span(before, after, Lines(before, PositionCodec()))
    assert (edit.range.start.line, edit.range.end.line, edit.new_text) == (1, 2, "b = 10\n")
    assert changed_span(before, before, Lines(before, PositionCodec())) is None
