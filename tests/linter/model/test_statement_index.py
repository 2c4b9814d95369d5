"""Shortcuts the big-file work took (issue 22): each must answer exactly what the long way does.

A statement's line read from the matched `ast` (`Positions.statement_line`) equals the line of
its generated position; the statement-only walk meets the compound statements the full walk
meets, in the same order; the screen's `ast` is handed to the analysis only for the very text it
read."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst

from linter import screen
from linter.analysis import parse
from linter.model.cst_util import compound_statements, walk
from linter.model.positions import Positions

SOURCE = textwrap.dedent(
    '''\
    """A training script with every kind of statement."""
    import torch


    @torch.no_grad()
    @staticmethod
    def evaluate(model, loader):
        for x, y in loader:
            if x is None: continue
            elif y is None:
                pass
            else:
                model(x); model(y)


    class Trainer:
        @property
        def steps(self):
            return 4

        class Config:
            accum = 4


    def train(model, loader, optimizer, accum=4):
        try:
            for step, (x, y) in enumerate(loader):
                with torch.autocast("cuda"):
                    loss = model(x, y) / accum
                loss.backward()
                if (step + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
        except RuntimeError:
            raise
        finally:
            print("done")
        match accum:
            case 1:
                lam = lambda: [i for i in range(3)]
            case _:
                while False:
                    break
    '''
)


def _statements(module: cst.Module) -> list[cst.CSTNode]:
    return [
        n
        for n in walk(module, into_scopes=True)
        if isinstance(n, (cst.BaseStatement, cst.BaseSmallStatement))
    ]


def test_a_statements_line_is_its_generated_positions_line():
    module = cst.parse_module(SOURCE)
    fast = Positions(module, SOURCE, ast.parse(SOURCE))
    slow = Positions(module, SOURCE, ast.parse(SOURCE))
    statements = _statements(module)
    assert len(statements) > 30
    for statement in statements:
        assert fast.statement_line(statement) == slow.range(statement).start.line, code_of(
            statement
        )


def code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def test_compound_statements_are_the_full_walks_in_its_order():
    module = cst.parse_module(SOURCE)
    expected = [
        n for n in walk(module, into_scopes=True) if isinstance(n, cst.BaseCompoundStatement)
    ]
    found = list(compound_statements(module))
    assert len(found) == len(expected) == 14
    assert all(a is b for a, b in zip(found, expected, strict=True))


def test_the_screens_tree_goes_to_the_analysis_of_that_text_only():
    text = SOURCE + "\n"
    assert screen.nesting_problem(text, "train.py") is None
    _, tree = parse(text)
    assert isinstance(tree, ast.Module) and ast.dump(tree) == ast.dump(ast.parse(text))
    assert parse(text)[1] is None  # handed on once, not kept
    assert screen.nesting_problem(text, "train.py") is None
    other = text[:-1] + "\n"  # equal, but not the text the screen read
    assert other is not text and parse(other)[1] is None
