"""`# noqa` handling: bare, code lists, case, real comments only, the diagnostic's first line."""

from linter.noqa import apply, directives
from linter.types import Diagnostic, Position


def diag(code: str, line: int, end_line: int | None = None) -> Diagnostic:
    return Diagnostic(code, "m", "f.py", Position(line, 0), Position(end_line or line, 1))


def test_directive_forms():
    text = (
        "a  # noqa\n"
        "b  # NoQA: ACL101\n"
        "c  # noqa:ACL101,ACL303 ACL201\n"
        "d  # type: ignore  # noqa: acl301 because reasons\n"
        "e  # noqa:\n"
    )
    assert directives(text) == {
        1: None,
        2: frozenset({"ACL101"}),
        3: frozenset({"ACL101", "ACL303", "ACL201"}),
        4: frozenset({"ACL301"}),
    }


def test_codes_suppress_only_their_own_codes():
    text = "x\ny  # noqa: ACL101\n"
    kept = apply(text, [diag("ACL101", 2), diag("ACL303", 2), diag("ACL101", 1)])
    assert kept == [diag("ACL303", 2), diag("ACL101", 1)]


def test_bare_noqa_suppresses_everything_on_its_line():
    assert apply("x  # noqa\n", [diag("ACL101", 1), diag("ACL303", 1)]) == []


def test_noqa_inside_a_string_does_nothing():
    text = "x = '# noqa'\n"
    assert apply(text, [diag("ACL101", 1)]) == [diag("ACL101", 1)]


def test_multiline_statement_uses_the_start_line():
    text = "f(  # noqa: ACL101\n    a,\n)\ng(\n    b,  # noqa: ACL101\n)\n"
    kept = apply(text, [diag("ACL101", 1, 3), diag("ACL101", 4, 6)])
    assert kept == [diag("ACL101", 4, 6)]
