"""Files the linter cannot analyse get one clear ACL000 each, and the run goes on with the others:
syntax errors, null bytes, encodings, a 10 MB file, nesting too deep for libcst."""

from __future__ import annotations

import pytest
from bad_input_scripts import FINDING, FIXED, SCRIPT


def _lint_beside_a_good_file(project, invoke, name: str, data: bytes, *args: str):
    (project / "train.py").write_text(SCRIPT)
    (project / name).write_bytes(data)
    return invoke(".", *args)


def test_syntax_error_is_one_acl000_and_the_other_file_is_checked(project, invoke):
    result = _lint_beside_a_good_file(
        project, invoke, "broken.py", b"import torch\nloss.backward(\n"
    )
    assert result.exit_code == 1
    assert result.stdout.splitlines()[:2] == [
        "broken.py:2:14: ACL000 SyntaxError: '(' was never closed",
        f"train.py:8:5: {FINDING}: under fp16 the loss would not be scaled",
    ]
    assert result.stderr == ""


def test_null_byte_is_an_acl000_not_a_crash(project, invoke):
    data = b"import torch\x00\nloss.backward()\n"
    result = _lint_beside_a_good_file(project, invoke, "nul.py", data, "--fix")
    assert result.exit_code == 1  # the ACL000 is left; the good file was fixed
    assert result.stdout.splitlines()[0] == (
        "nul.py:1:1: ACL000 SyntaxError: source code string cannot contain null bytes"
    )
    assert (project / "nul.py").read_bytes() == data
    assert (project / "train.py").read_text() == FIXED


def test_coding_cookie_is_honoured_and_the_fix_keeps_the_encoding(project, invoke):
    latin = "# -*- coding: latin-1 -*-\n# entraîné\n" + SCRIPT
    (project / "latin.py").write_bytes(latin.encode("latin-1"))
    result = invoke("latin.py", "--fix")
    assert result.exit_code == 0, result.stdout
    expected = "# -*- coding: latin-1 -*-\n# entraîné\n" + FIXED
    assert (project / "latin.py").read_bytes() == expected.encode("latin-1")


@pytest.mark.parametrize(
    "data, line, message",
    [
        (
            b"import torch\n# caf\xe9\nloss.backward()\n",
            2,
            "cannot decode file as utf-8: invalid continuation byte (byte 0xe9, line 2); "
            "declare its encoding with a coding comment (PEP 263)",
        ),
        (
            b"# coding: klingon\nimport torch\nloss.backward()\n",
            1,
            "cannot decode file: unknown encoding: klingon",
        ),
        (
            b"# coding: ascii\nimport torch\nloss.backward()\n# \xc3\xa9\n",
            4,
            "cannot decode file as ascii: ordinal not in range(128) (byte 0xc3, line 4)",
        ),
    ],
    ids=["not-utf8", "unknown-cookie", "not-the-cookies-encoding"],
)
def test_undecodable_file_is_a_clear_acl000(project, invoke, data, line, message):
    result = _lint_beside_a_good_file(project, invoke, "bad.py", data)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[:2] == [
        f"bad.py:{line}:1: ACL000 {message}",
        f"train.py:8:5: {FINDING}: under fp16 the loss would not be scaled",
    ]


def test_a_10_mb_file_is_refused_quickly_with_its_size(project, invoke):
    table = "".join(f"    {i}.5,\n" for i in range(800_000))
    data = (SCRIPT + "TABLE = [\n" + table + "]\n").encode()
    assert 10 * 2**20 < len(data) < 11 * 2**20
    result = _lint_beside_a_good_file(project, invoke, "huge.py", data)
    size = f"{len(data) / 2**20:.1f} MiB"
    assert result.stdout.splitlines()[:2] == [
        f"huge.py:1:1: ACL000 too large to analyse: {size} (the limit is 2.0 MiB)",
        f"train.py:8:5: {FINDING}: under fp16 the loss would not be scaled",
    ]


_DEEP = {
    # CPython's tokenizer stops at 200 open brackets; libcst's parser overflowed its stack here.
    "parentheses": (
        "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n",
        11,
        "too deeply nested to analyse: too many nested parentheses",
    ),
    # Flat for CPython, one level per operand for libcst (a segmentation fault at 200,000).
    "boolean-chain": (
        "x = " + " and ".join(["a"] * 5000) + "\n",
        11,  # module, assignment, 4999 nested `and`s, the last name and its load context
        "too deeply nested to analyse: 5003 levels (the limit is 400)",
    ),
    # libcst takes minutes on a chain this long; CPython's parser refuses it.
    "attribute-chain": (
        "x = a" + ".b" * 100_000 + "\n",
        1,  # no tree: no line
        "too deeply nested to analyse: Python's own parser gives up on it",
    ),
}


@pytest.mark.parametrize("kind", sorted(_DEEP))
def test_too_deep_nesting_is_an_acl000_without_a_traceback(project, invoke, kind):
    body, line, message = _DEEP[kind]
    result = _lint_beside_a_good_file(project, invoke, "deep.py", (SCRIPT + body).encode())
    assert result.exit_code == 1
    assert result.stdout.splitlines()[:2] == [
        f"deep.py:{line}:1: ACL000 {message}",
        f"train.py:8:5: {FINDING}: under fp16 the loss would not be scaled",
    ]
    assert "Recursion" not in result.stdout + result.stderr


def test_deep_but_real_nesting_is_still_analysed(project, invoke):
    """100 nested calls and 90 nested blocks: deeper than any real module, under the limits."""
    calls = "y = " + "f(" * 100 + "1" + ")" * 100 + "\n"
    blocks = "".join("    " * i + "if x:\n" for i in range(90)) + "    " * 90 + "pass\n"
    (project / "deep.py").write_text(SCRIPT + calls + blocks)
    result = invoke("deep.py")
    assert result.stdout.splitlines()[0] == (
        f"deep.py:8:5: {FINDING}: under fp16 the loss would not be scaled"
    )
