"""Big files are analysed through their reduced text (`linter.reduce`): what they report must be
what the same training code reports in a small file, fixes must keep every other byte, and the
scan in pieces must read exactly the statements and nesting the whole `ast` holds."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from linter import reduce, screen
from linter.analysis import describe_loops
from linter.checking import check_source
from linter.types import Diagnostic, Edit, Fix, Position
from rules import ALL_RULES

CODES = frozenset(ALL_RULES)
ROOT = Path(__file__).resolve().parents[2]

HEADER = (
    '"""Generated. Do not edit."""\n\nimport torch\nfrom google.protobuf import descriptor as _d\n'
)

LOOP = textwrap.dedent(
    """

    ACCUM = 4


    def train(model, loader, optimizer):
        scaler = torch.amp.GradScaler("cuda")
        for step, (x, y) in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = objective(model(x), y)
            scaler.scale(loss).backward()
            if (step + 1) % ACCUM == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "a.pt")
    """
)

# Nothing in it a rule reads: the loop does not call it, and it mentions no training word.
HELPER = "\n\ndef objective(pred, y):\n    return ((pred - y) ** 2).sum()\n"
NET = textwrap.dedent(
    """

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.1)
    """
)


def filler(size: int) -> str:
    """Generated code of about `size` characters: descriptors, tables and one long function."""
    parts, total, i = [], 0, 0
    while total < size:
        unit = (
            f"\n_MESSAGE{i} = _d.Descriptor(\n    name='M{i}',\n    fields=[\n"
            f"        _d.FieldDescriptor(name='f{i}', index=0, number={i}, type=9),\n    ],\n)\n"
            f"VOCAB_{i} = {{{', '.join(f'{chr(34)}t{i}_{j}{chr(34)}: {j}' for j in range(8))}}}\n"
            f"\n\ndef traced_{i}(x, params):\n"
            + "".join(f"    v{j} = torch.matmul(x, params[{j}])\n    x = v{j}\n" for j in range(6))
            + "    return x\n"
        )
        parts.append(unit)
        total += len(unit)
        i += 1
    return "".join(parts)


@pytest.fixture
def small_threshold(monkeypatch):
    """Reduce from 8 KB on, so that the files stay small and the tests fast."""
    monkeypatch.setattr(screen, "SCAN_FROM", 8 * 1024)
    monkeypatch.setattr(reduce, "PIECE", 2 * 1024)


def found(text: str, fix: str = "none"):
    return check_source(text, "gen_pb2.py", CODES, fix)


def shifted(result, lines: int) -> list[tuple]:
    """Each finding's code, place and message, `lines` earlier."""
    return [
        (d.code, d.start.line - lines, d.start.column, d.end.line - lines, d.message)
        for d in result.diagnostics
    ]


def test_big_file_reports_what_the_loop_reports_alone(small_threshold):
    small = HEADER + HELPER + LOOP
    padding = filler(40 * 1024)
    big = HEADER + HELPER + padding + LOOP
    expected = shifted(found(small), 0)
    assert [f[0] for f in expected] == ["ACL307", "ACL503"]
    assert shifted(found(big), padding.count("\n")) == expected


def test_a_helper_far_from_the_loop_is_still_read(small_threshold):
    """Without `objective` the loop's loss is backpropagated undivided (ACL301); with it, 40 KB
    of generated code away, the loss is a sum the loop means (nothing to report there)."""
    padding = filler(40 * 1024)
    alone = found(HEADER + LOOP)
    assert "ACL301" in [d.code for d in alone.diagnostics]
    far = found(HEADER + HELPER + padding + LOOP)
    assert "ACL301" not in [d.code for d in far.diagnostics]


def test_dropout_anywhere_in_the_module_still_counts(small_threshold):
    """`eval_modes.mode_matters` reads the whole module for dropout: the unused class that
    shows it is kept, so the missing `.eval()` is reported as in the small file."""
    evaluation = textwrap.dedent(
        """

        def evaluate(model, val_loader):
            with torch.no_grad():
                for x, y in val_loader:
                    print(model(x))
        """
    )
    small = HEADER + NET + evaluation
    padding = filler(40 * 1024)
    big = HEADER + NET + padding + evaluation
    expected = shifted(found(small), 0)
    assert [f[0] for f in expected] == ["ACL502"]
    assert shifted(found(big), padding.count("\n")) == expected
    assert found(HEADER + padding + evaluation).diagnostics == []


def test_fixing_a_big_file_keeps_every_other_byte(small_threshold):
    loop = LOOP.replace("loss = objective(model(x), y)", "loss = model(x).mean()")
    small, padding = HEADER + loop, filler(40 * 1024)
    fixed_small = found(small, "unsafe")
    assert fixed_small.fixes_applied >= 1
    fixed_big = found(HEADER + padding + loop, "unsafe")
    assert fixed_big.fixes_applied == fixed_small.fixes_applied
    assert fixed_big.fixed == HEADER + padding + fixed_small.fixed[len(HEADER) :]
    lines = padding.count("\n")
    assert shifted(fixed_big, lines) == shifted(fixed_small, 0)


def test_the_language_servers_parse_cache_reads_the_reduced_text(small_threshold):
    """An editor's versions go through the parse cache (the screen leaves the depth to the
    analysis there): the same findings, and an edit far from the loop changes none."""
    from linter.incremental import ParseCache

    padding = filler(40 * 1024)
    big = HEADER + HELPER + padding + LOOP
    cache = ParseCache()
    first = check_source(big, "gen_pb2.py", CODES, cache=cache)
    assert first.diagnostics == found(big).diagnostics
    edited = big.replace("VOCAB_3 = {", "VOCAB_3 = {'new': 0, ")
    assert check_source(edited, "gen_pb2.py", CODES, cache=cache).diagnostics == first.diagnostics


def test_show_loops_says_what_it_skipped(small_threshold):
    padding = filler(40 * 1024)
    small = describe_loops(HEADER + HELPER + LOOP, "gen_pb2.py")
    big = describe_loops(HEADER + HELPER + padding + LOOP, "gen_pb2.py")
    skipped = big.pop("skipped_unrelated_statements")
    units = padding.count("\n_MESSAGE")
    assert skipped == 3 * units + 1  # each unit's descriptor, table and function; the docstring
    assert "skipped_unrelated_statements" not in small
    assert _lines_moved(big, -padding.count("\n")) == small


def _lines_moved(value, by: int):
    if isinstance(value, dict):
        return {
            k: v + by if k == "line" and isinstance(v, int) else _lines_moved(v, by)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_lines_moved(v, by) for v in value]
    return value


def test_under_the_threshold_nothing_is_reduced(monkeypatch):
    text = HEADER + filler(4 * 1024) + LOOP
    assert len(text) < screen.SCAN_FROM
    calls = []
    monkeypatch.setattr(reduce, "reduce", lambda *a: calls.append(a))
    found(text)
    assert calls == []


def test_the_real_threshold_from_the_command_line(tmp_path):
    """At the default threshold, end to end: the findings of the loop alone, lines moved."""
    padding = filler(screen.SCAN_FROM)
    big, small = tmp_path / "gen_pb2.py", tmp_path / "small.py"
    big.write_text(HEADER + HELPER + padding + LOOP)
    small.write_text(HEADER + HELPER + LOOP)
    lines = padding.count("\n")
    expected = [(line + lines, column, text) for line, column, text in concise(small)]
    assert len(expected) == 2
    assert concise(big) == expected


def concise(path: Path) -> list[tuple[int, int, str]]:
    """(line, column, code and message) of each finding `accel-lint` prints for `path`."""
    command = [sys.executable, "-m", "linter.cli", "--no-cache", "--output-format", "concise"]
    out = subprocess.run([*command, str(path)], capture_output=True, text=True, cwd=ROOT)
    found = [re.match(r".*?:(\d+):(\d+): (ACL\d+ .*)$", line) for line in out.stdout.splitlines()]
    return [(int(m[1]), int(m[2]), m[3]) for m in found if m]


VOCABULARY = (
    "loss.backward", "torch.autocast", "GradScaler", "clip_grad_norm_", "zero_grad", "no_grad",
    "enable_grad", "set_grad_enabled", "inference_mode", "requires_grad_", "Accelerator",
    "no_sync", "gradient_accumulation_steps", "DistributedSampler", "set_epoch", "train_loader",
    "custom_fwd", "weight_decay", "optimiser", "lr_scheduler", "warmup_steps",
    "num_training_steps", "all_gather", "all_reduce", "metrics", "accuracy", "state_dict",
    "checkpoint", "save_state", "prepare", "deepspeed", "fabric", "lightning", "FSDP",
    "FullyShardedDataParallel", "fully_shard", "DistributedDataParallel", "world_size",
    "LOCAL_RANK", "set_device", "init_process_group", "bfloat16", "fp16", "bf16",
    "mixed_precision", "criterion", "Trainer", "TrainingArguments", "guard", "amp", "x.grad",
    "opt.step", "model.eval", "model.train", "x.half", "dist", "cuda", "rank", "DDP", "reduce",
    "loss_fn", "val", "valid", "validation", "validate", "evaluate", "test_loader", "dev_set",
)  # fmt: skip
UNRELATED = ("value", "device", "interval", "example", "sample", "training", "contest", "x.dev0")


def test_the_vocabulary_is_found_in_any_statement():
    """Each word of the vocabulary makes its statement a root, found through the anchors."""
    words = VOCABULARY + UNRELATED
    text = "".join(f"x = {word}\n" for word in words)
    offset, spans = 0, []
    for word in words:
        spans.append((offset, offset + len(f"x = {word}\n")))
        offset = spans[-1][1]
    roots, _ = reduce._classified(text, spans)
    assert dict(zip(words, roots, strict=True)) == {w: w in VOCABULARY for w in words}


# The mapping of fixes back to the original text -------------------------------------------------

TEXT = "import torch\n\nA = 1\nB = {\n    1: 2,\n}\n\n\ndef train(model):\n    model.step()\n"


def reduction() -> reduce.Reduction:
    """TEXT with `A = 1` (line 3) and the dict B (lines 4-6) dropped."""
    statements = reduce.scan(TEXT, screen.nesting_depth, screen.parser_limit).statements
    reduced = reduce.reduce(TEXT, statements)
    assert reduced is not None and reduced.dropped == ((3, 3), (4, 6))
    assert reduced.text == "import torch\n\n\n\n\n\n\n\ndef train(model):\n    model.step()\n"
    return reduced


def diagnostic(*edits: Edit) -> Diagnostic:
    return Diagnostic(
        "t.py", Position(10, 4), Position(10, 16), "ACL305", "m",
        fix=Fix("safe", "fix", edits),
    )  # fmt: skip


def edit(start: tuple[int, int], end: tuple[int, int], content: str = "") -> Edit:
    return Edit(Position(*start), Position(*end), content)


@pytest.mark.parametrize(
    ("edits", "kept"),
    [
        ((edit((10, 4), (10, 16), "model.stop()"),), True),  # inside kept code
        ((edit((9, 0), (9, 0), "x = 2\n"),), True),  # before a kept statement
        ((edit((4, 0), (4, 0), "x = 2\n"),), True),  # between two dropped statements
        ((edit((5, 0), (5, 0), "x = 2\n"),), False),  # inside the dropped dict
        ((edit((3, 2), (3, 2), "x"),), False),  # inside a dropped line
        ((edit((2, 0), (4, 0), ""),), False),  # removes the dropped `A = 1`
        ((edit((7, 0), (9, 0), ""),), True),  # blank lines after the dict only
        ((edit((10, 4), (10, 16), "B.step()"),), False),  # a name only dropped code knows
        ((edit((10, 4), (10, 16), "torch.step()"),), True),  # known to kept code as well
        ((edit((10, 4), (10, 4), "A"), edit((1, 0), (1, 0), "")), False),
    ],
)
def test_a_fix_touching_dropped_code_is_withheld(edits, kept):
    d = diagnostic(*edits)
    (checked,) = reduction().checked([d])
    assert checked == (d if kept else replace(d, fix=None))


# The scan in pieces -----------------------------------------------------------------------------


def whole(text: str) -> tuple[list[reduce.Statement], tuple[int, int]]:
    """What the scan must find, read from the whole text's `ast`."""
    tree = ast.parse(text)
    lines = reduce._LINES.findall(text)
    statements = []
    for node in tree.body:
        decorators = getattr(node, "decorator_list", ())
        first = min([node.lineno] + [d.lineno for d in decorators])
        kind, binds = reduce._summary(node, lines, first, node.end_lineno)
        statements.append(reduce.Statement(first, node.end_lineno, kind, binds))
    return statements, screen.nesting_depth(tree)


TRICKY = textwrap.dedent(
    '''\
    """Docstring
    x = 1
    def looks_like_code():
    """
    import os, sys as system
    from a.b import (c,
    d as e)
    @decorator(
    1)
    @other
    def f(a,
          b):
        s = """
    class NotAClass:
        pass
    """
        if a:
            return 1
        else:
            return 2
    if os:
        G = 1
    elif sys:
        G = 2
    else:
        G = 3
    try:
        import torch
    except ImportError:
        torch = None
    finally:
        pass
    x = 1; y = 2
    total = \\
    3
    async def g():
        global COUNT
        await h()
    class C(Base):
        attr = [
    1, 2]
        def m(self):
            pass
    for i in range(3): print(i)
    obj.attr = 5
    (a, b), *c = 1, 2, 3
    del x
    '''
)


@pytest.mark.parametrize("piece", [1, 16, 64, 100_000])
def test_the_scan_reads_what_the_whole_ast_holds(monkeypatch, piece):
    monkeypatch.setattr(reduce, "PIECE", piece)
    statements, (depth, _) = whole(TRICKY)
    got = reduce.scan(TRICKY, screen.nesting_depth, screen.parser_limit)
    assert got is not None
    assert got.statements == statements and got.depth == depth
    kinds = {s.first: (s.kind, s.binds) for s in got.statements}
    assert kinds[5] == (reduce.Kind.IMPORT, frozenset({"os", "system"}))
    assert kinds[8] == (reduce.Kind.DEFINITION, frozenset({"f"}))
    assert kinds[27][0] is reduce.Kind.EFFECT and "torch" in kinds[27][1]
    assert kinds[36] == (reduce.Kind.DEFINITION, frozenset({"g", "COUNT"}))
    assert kinds[45] == (reduce.Kind.EFFECT, frozenset())


def test_the_scan_reads_the_project_sources_in_small_pieces(monkeypatch):
    """Every module of the linter, cut into pieces of 300 characters (big definitions into
    runs of their body): the same statements and depth as the whole `ast`."""
    monkeypatch.setattr(reduce, "PIECE", 300)
    texts = [path.read_text() for path in sorted((ROOT / "linter").rglob("*.py"))]
    texts = [text for text in texts if _parses(text)]  # one mid-edit by someone: not this test's
    assert len(texts) > 50
    for text in texts:
        statements, (depth, _) = whole(text)
        got = reduce.scan(text, screen.nesting_depth, screen.parser_limit)
        assert got is not None, text[:200]
        assert (got.statements, got.depth) == (statements, depth), text[:200]


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def test_a_syntax_error_leaves_the_whole_text_to_the_screen(monkeypatch):
    monkeypatch.setattr(reduce, "PIECE", 16)
    assert reduce.scan("x = 1\ny = (\nz = 2\n", screen.nesting_depth, screen.parser_limit) is None


def test_nesting_in_a_piece_is_judged_as_in_the_whole_tree(small_threshold):
    deep = "x = " + "-" * (screen.MAX_NESTING + 20) + "1\n"
    text = HEADER + filler(20 * 1024) + deep + LOOP
    line = text[: text.index("x = -")].count("\n") + 1
    problem = screen.nesting_problem(text, "gen.py")
    expected = screen.too_deep(ast.parse(text))
    assert problem == expected and problem[1] == line
    parens = "y = " + "(" * 210 + ")" * 210 + "\n"
    text = HEADER + filler(20 * 1024) + parens + LOOP
    problem = screen.nesting_problem(text, "gen.py")
    assert problem is not None and problem[0].startswith("too deeply nested to analyse: too many")
    assert problem[1] == text[: text.index("y = (")].count("\n") + 1
