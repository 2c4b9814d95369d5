"""The fix loop: non-overlapping edits, rounds until stable, CRLF kept, broken output rejected."""

from linter import analysis
from linter.fixer import apply_fixes, fix_text
from linter.types import Diagnostic, Edit, Fix, Position


def edit(line, col, end_line, end_col, content) -> Edit:
    return Edit(Position(line, col), Position(end_line, end_col), content)


def fix(*edits: Edit, applicability="safe") -> Fix:
    return Fix(applicability, "fix", tuple(edits))


def test_non_overlapping_edits_apply_in_one_pass():
    text = "aaa\nbbb\nccc\n"
    new, count = apply_fixes(text, [fix(edit(3, 0, 3, 3, "C")), fix(edit(1, 0, 1, 1, "A"))])
    assert (new, count) == ("Aaa\nbbb\nC\n", 2)


def test_overlapping_fix_waits_for_the_next_round():
    text = "abcdef\n"
    new, count = apply_fixes(text, [fix(edit(1, 0, 1, 4, "X")), fix(edit(1, 2, 1, 6, "Y"))])
    assert (new, count) == ("Xef\n", 1)


def test_two_insertions_at_one_point_do_not_both_apply():
    new, count = apply_fixes("ab\n", [fix(edit(1, 1, 1, 1, "X")), fix(edit(1, 1, 1, 1, "Y"))])
    assert (new, count) == ("aXb\n", 1)


def test_multi_edit_fix_is_all_or_nothing():
    text = "abc\ndef\n"
    first = fix(edit(1, 0, 1, 1, "A"))
    both = fix(edit(1, 0, 1, 1, "Z"), edit(2, 0, 2, 1, "D"))
    assert apply_fixes(text, [first, both]) == ("Abc\ndef\n", 1)


def test_crlf_files_get_crlf_in_inserted_lines():
    text = "a\r\nb\r\n"
    new, _ = apply_fixes(text, [fix(edit(2, 0, 2, 0, "x\ny\n"))], newline="\r\n")
    assert new == "a\r\nx\r\ny\r\nb\r\n"


def _counting_rule(text: str) -> list[Diagnostic]:
    """Flags every `1` and fixes it to `2`; a `2` on a line after `x` becomes `3` next round."""
    found = []
    for number, line in enumerate(text.split("\n"), start=1):
        for col, char in enumerate(line):
            if char in "12" and (char == "1" or line.startswith("x")):
                at, end = Position(number, col), Position(number, col + 1)
                new = "2" if char == "1" else "3"
                found.append(Diagnostic("ACL101", "m", "f", at, end, fix(Edit(at, end, new))))
    return found


def test_fix_loop_runs_rounds_until_nothing_changes():
    outcome = fix_text("x = 1\ny = 1\n", _counting_rule, unsafe=False)
    assert outcome.text == "x = 3\ny = 2\n"
    assert outcome.fixed == 3
    assert outcome.diagnostics == []
    again = fix_text(outcome.text, _counting_rule, unsafe=False)
    assert (again.text, again.fixed) == (outcome.text, 0)


def test_unsafe_fixes_apply_only_when_allowed():
    at, end = Position(1, 0), Position(1, 1)
    unsafe = Diagnostic(
        "ACL303", "m", "f", at, end, fix(Edit(at, end, "b"), applicability="unsafe")
    )

    def rule(text):
        return [unsafe] if text.startswith("a") else []

    assert fix_text("a\n", rule, unsafe=False).text == "a\n"
    assert fix_text("a\n", rule, unsafe=True).text == "b\n"


def test_a_fix_that_breaks_syntax_is_not_applied():
    at, end = Position(1, 4), Position(1, 5)
    broken = Diagnostic("ACL101", "m", "f", at, end, fix(Edit(at, end, "(")))

    def rule(text):
        if text.count("(") != text.count(")"):
            raise analysis.ParseFailure("'(' was never closed", 1, 4)
        return [broken]

    outcome = fix_text("x = 1\n", rule, unsafe=False)
    assert outcome.text == "x = 1\n"
    assert outcome.fixed == 0
    assert "invalid syntax" in outcome.error
