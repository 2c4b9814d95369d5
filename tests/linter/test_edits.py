"""The shared line edits (`linter/edits.py`) and a fix's safety taken from its rule's record."""

from __future__ import annotations

import textwrap

import libcst

from linter import edits
from linter.context import RuleContext, make_fix, record_applicability
from linter.model import Model
from linter.types import Position


def _ctx(source: str, code: str = "ACL401") -> RuleContext:
    source = textwrap.dedent(source)
    return RuleContext(Model(libcst.parse_module(source)), source, "train.py", code)


def test_a_stdlib_name_is_spelled_as_the_module_imports_it():
    bound = _ctx("from contextlib import nullcontext as nc\n")
    assert edits.stdlib_name(bound, "contextlib", "nullcontext") == ("nc", None)
    module = _ctx("import contextlib\n")
    assert edits.stdlib_name(module, "contextlib", "nullcontext") == (
        "contextlib.nullcontext",
        None,
    )


def test_a_missing_stdlib_name_is_imported_after_the_last_stdlib_import():
    ctx = _ctx(
        """\
        import os
        import sys

        import torch
        """
    )
    name, edit = edits.stdlib_name(ctx, "contextlib", "nullcontext")
    assert name == "nullcontext"
    assert (edit.start, edit.end) == (Position(3, 0), Position(3, 0))
    assert edit.content == "from contextlib import nullcontext\n"


def test_statements_are_wrapped_in_a_with_and_the_common_block_is_the_deepest():
    ctx = _ctx(
        """\
        for batch in loader:
            if True:
                out = model(batch)  # forward
                loss = out.mean()
        """
    )
    loop = ctx.model.module.body[0]
    forward, backward = loop.body.body[0].body.body
    block, first, last = edits.common_block(loop, [forward, backward])
    assert (block[first], block[last]) == (forward, backward)
    edit = edits.wrap_in_with(ctx, forward, backward, "model.no_sync()")
    assert edit.content == (
        "        with model.no_sync():\n"
        "            out = model(batch)  # forward\n"
        "            loss = out.mean()"
    )


def test_a_multiline_string_is_never_reindented():
    ctx = _ctx('for b in loader:\n    x = """a\nb"""\n    y = 1\n')
    loop = ctx.model.module.body[0]
    first, last = loop.body.body
    assert edits.wrap_in_with(ctx, first, last, "model.no_sync()") is None


def test_a_fix_is_as_safe_as_its_rules_record_says():
    assert record_applicability("ACL401") == "unsafe"
    assert record_applicability("ACL101") == "safe"
    assert record_applicability("ACL202") == "safe"  # safe-when-trailing: offered only then
    ctx = _ctx("loss.backward()\n", "ACL306")
    node = ctx.model.module.body[0]
    fix = make_fix("Wrap", ctx.replace(node, "pass"))
    assert fix.applicability is None  # filled in when reported
    assert ctx.report(node, "m", fix).fix.applicability == "unsafe"
    explicit = make_fix("Wrap", ctx.replace(node, "pass"), applicability="safe")
    assert ctx.report(node, "m", explicit).fix.applicability == "safe"
