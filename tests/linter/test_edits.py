"""The shared line edits (`linter/edits.py`) and a fix's safety taken from its rule's record."""

from __future__ import annotations

import textwrap

import libcst

from linter import edits
from linter.context import RuleContext, make_fix, record_applicability
from linter.model import Model
from linter.model.cst_util import code
from linter.types import Edit, Position


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


def _stmts(ctx: RuleContext) -> dict:
    """The model's statements by their code."""
    return {code(s.node): s for scope in ctx.model.scopes for s in scope.stmts}


def test_a_statement_moves_as_its_whole_line_after_the_anchor():
    ctx = _ctx(
        """\
        for batch in loader:
            sched.step()  # per batch
            loss.backward()
            if step % 4 == 0:
                opt.step()
        """
    )
    stmts = _stmts(ctx)
    moved = edits.move_after(ctx, stmts["sched.step()"], stmts["opt.step()"])
    assert moved == [
        Edit(Position(2, 0), Position(3, 0), ""),
        Edit(Position(5, 18), Position(5, 18), "\n        sched.step()  # per batch"),
    ]
    assert not edits.movable(ctx, stmts["opt.step()"])  # its block would be left empty


def test_a_statement_never_moves_out_of_a_handler_or_off_a_shared_line():
    ctx = _ctx(
        """\
        for batch in loader:
            try:
                sched.step()
                loss.backward()
            except RuntimeError:
                pass
            opt.step(); opt.zero_grad()
        """
    )
    stmts = _stmts(ctx)
    assert not edits.movable(ctx, stmts["sched.step()"])
    assert not edits.movable(ctx, stmts["opt.zero_grad()"])


def test_statements_move_together_only_when_consecutive_in_one_block():
    ctx = _ctx(
        """\
        for batch in loader:
            clip(model)
            unscale(opt)
            loss.backward()
            opt.step()
        """
    )
    stmts = _stmts(ctx)
    clip, unscale, step = stmts["clip(model)"], stmts["unscale(opt)"], stmts["opt.step()"]
    assert edits.move_before(ctx, [clip, unscale], step) == [
        Edit(Position(2, 0), Position(3, 0), ""),
        Edit(Position(3, 0), Position(4, 0), ""),
        Edit(Position(5, 0), Position(5, 0), "    clip(model)\n    unscale(opt)\n"),
    ]
    backward = stmts["loss.backward()"]
    assert edits.move_before(ctx, [clip, backward], step) is None  # unscale(opt) between


def test_a_statement_is_inserted_after_another_or_deleted_with_all_its_lines():
    ctx = _ctx(
        """\
        if ok:
            scaler.update(
                1.0,
            )
            scaler.step(opt)
        else:
            scaler.update()
        scaler.step(opt); opt.zero_grad()
        """
    )
    at = {(ctx.line_of(s.node), s.index): s for scope in ctx.model.scopes for s in scope.stmts}
    assert edits.delete_alone(ctx, at[2, 0]) == Edit(Position(2, 0), Position(5, 0), "")
    assert edits.delete_alone(ctx, at[7, 0]) is None  # alone in its block
    own, shared = at[5, 0], at[8, 0]
    assert edits.insert_after(ctx, own, "scaler.update()") == Edit(
        Position(6, 0), Position(6, 0), "    scaler.update()\n"
    )
    assert edits.insert_after(ctx, shared, "scaler.update()") == Edit(
        Position(8, 16), Position(8, 16), "; scaler.update()"
    )
