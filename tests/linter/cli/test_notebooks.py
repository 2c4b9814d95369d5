"""Notebooks with the real rules: cells linted as one program, ruff's cell locations in each
format, fixes that rewrite only the changed cell (every other byte kept, nbformat-valid), IPython
lines masked and never rewritten, unreadable notebooks reported."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from linter.notebooks import program_of
from linter.notebooks.magics import Masks, mask_cell

NOTEBOOK = Path(__file__).parent / "notebooks" / "train.ipynb"
MESSAGE = (
    "`F.mse_loss(model(x), y)` is backpropagated undivided while the optimizer steps every "
    "`GRAD_ACCUM` micro-steps: the window sums `GRAD_ACCUM` losses, so the gradients are "
    "`GRAD_ACCUM` times those of the window's mean loss"
)
# GRAD_ACCUM = 4 in cell 3: a module setting whose default makes the finding real
CONFIG = "the default configuration is affected (with GRAD_ACCUM > 1 (default 4))"
CONFIG_SUFFIX = "[default config: with GRAD_ACCUM > 1 (default 4)]"
BEFORE = '    "        F.mse_loss(model(x), y).backward()\\n",\n'
AFTER = '    "        (F.mse_loss(model(x), y) / GRAD_ACCUM).backward()\\n",\n'


@pytest.fixture
def invoke():
    """The CLI in-process with the real rules; `input` is what stdin holds."""
    from typer.testing import CliRunner

    from linter.cli import app

    def run(*args: str, input: str | None = None):
        return CliRunner().invoke(app, list(args), input=input)

    return run


@pytest.fixture
def notebook(project) -> Path:
    target = project / "train.ipynb"
    shutil.copyfile(NOTEBOOK, target)
    return target


def test_the_loop_in_cell_5_is_understood_with_the_setup_of_cell_3(notebook, invoke):
    result = invoke("--no-cache", "--output-format", "concise", "train.ipynb")
    assert result.exit_code == 1, result.output
    assert result.stdout == (
        f"train.ipynb:cell 5:5:9: ACL301 [*] {MESSAGE} {CONFIG_SUFFIX}\n"
        "Found 1 error.\n"
        "[*] 1 fixable with `--fix`.\n"
    )


def test_full_format_shows_the_cell_and_its_own_line_numbers(notebook, invoke):
    result = invoke("--no-cache", "train.ipynb")
    assert result.stdout == (
        f"train.ipynb:cell 5:5:9: ACL301 [*] {MESSAGE}\n"
        "  |\n"
        "4 |     for step, (x, y) in enumerate(train_loader):\n"
        "5 |         F.mse_loss(model(x), y).backward()\n"
        "  |         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "6 |         if (step + 1) % GRAD_ACCUM == 0 or step + 1 == len(train_loader):\n"
        "  |\n"
        "  = help: Divide the loss by `GRAD_ACCUM`\n"
        "  -         F.mse_loss(model(x), y).backward()\n"
        "  +         (F.mse_loss(model(x), y) / GRAD_ACCUM).backward()\n"
        "  = note: accumulation value K = GRAD_ACCUM (step gate at cell 5, line 6)\n"
        f"  = config: {CONFIG}\n"
        "\n"
        "Found 1 error.\n"
        "[*] 1 fixable with `--fix`.\n"
    )


def test_json_has_ruffs_cell_field_and_in_cell_rows(notebook, invoke):
    [item] = json.loads(invoke("--no-cache", "--output-format", "json", "train.ipynb").stdout)
    assert item["cell"] == 5 and item["filename"] == str(notebook)
    assert (item["location"], item["end_location"]) == (
        {"column": 9, "row": 5},
        {"column": 43, "row": 5},
    )
    assert item["noqa_row"] == 5
    assert item["fix"]["edits"] == [
        {
            "content": "(F.mse_loss(model(x), y) / GRAD_ACCUM)",
            "end_location": {"column": 32, "row": 5},
            "location": {"column": 9, "row": 5},
        }
    ]


def test_sarif_and_github_place_the_finding_in_its_cell(notebook, invoke):
    log = json.loads(invoke("--no-cache", "--output-format", "sarif", "train.ipynb").stdout)
    [found] = log["runs"][0]["results"]
    region = found["locations"][0]["physicalLocation"]["region"]
    assert region == {"endColumn": 43, "endLine": 5, "startColumn": 9, "startLine": 5}
    assert found["properties"]["cell"] == 5
    github = invoke("--no-cache", "--output-format", "github", "train.ipynb").stdout
    assert github == (
        f"::error title=accel-lint (ACL301),file={notebook},line=5,col=9,endLine=5,endColumn=43"
        f"::cell 5: ACL301 {MESSAGE} ({CONFIG})\n"
    )


def test_fix_rewrites_only_the_changed_line_and_keeps_every_other_byte(notebook, invoke):
    original = notebook.read_bytes()
    result = invoke("--no-cache", "--fix", "train.ipynb")
    assert result.exit_code == 0, result.output
    assert result.stderr == "Fixed 1 error.\n"
    assert original.count(BEFORE.encode()) == 1
    assert notebook.read_bytes() == original.replace(BEFORE.encode(), AFTER.encode())
    nbformat.validate(nbformat.read(notebook, as_version=4))  # outputs, ids, counts intact
    again = invoke("--no-cache", "--fix", "train.ipynb")  # the fixed loop is correct: no finding
    assert (again.exit_code, again.stdout, again.stderr) == (0, "All checks passed!\n", "")
    assert notebook.read_bytes() == original.replace(BEFORE.encode(), AFTER.encode())


def test_diff_is_shown_per_cell(notebook, invoke):
    result = invoke("--no-cache", "--diff", "train.ipynb")
    assert result.exit_code == 1
    assert result.stdout == (
        "--- train.ipynb:cell 5\n"
        "+++ train.ipynb:cell 5\n"
        "@@ -2,7 +2,7 @@\n"
        " for epoch in range(2):\n"
        "     model.train()\n"
        "     for step, (x, y) in enumerate(train_loader):\n"
        "-        F.mse_loss(model(x), y).backward()\n"
        "+        (F.mse_loss(model(x), y) / GRAD_ACCUM).backward()\n"
        "         if (step + 1) % GRAD_ACCUM == 0 or step + 1 == len(train_loader):\n"
        "             optimizer.step()\n"
        "             optimizer.zero_grad()\n"
    )
    assert notebook.read_bytes() == NOTEBOOK.read_bytes()


def test_a_directory_walk_lints_notebooks_and_the_cache_keeps_cells(notebook, invoke):
    (notebook.parent / "util.py").write_text("x = 1\n")
    first, cached = (invoke("--output-format", "concise").stdout for _ in range(2))
    assert first.startswith("train.ipynb:cell 5:5:9: ACL301 [*] ") and cached == first


def test_stdin_notebook_reports_cells_and_fixes_the_json(project, invoke):
    text = NOTEBOOK.read_text()
    result = invoke("--output-format", "concise", "--stdin-filename", "nb.ipynb", "-", input=text)
    assert result.stdout.startswith(f"nb.ipynb:cell 5:5:9: ACL301 [*] {MESSAGE} {CONFIG_SUFFIX}\n")
    fixed = invoke("--fix", "--stdin-filename", "nb.ipynb", "-", input=text)
    assert fixed.stdout == text.replace(BEFORE, AFTER)


def test_invalid_json_gets_one_clear_diagnostic(project, invoke):
    (project / "broken.ipynb").write_text('{\n "cells": [\n  {"cell_type": "code",]\n}\n')
    result = invoke("--no-cache", "--output-format", "concise", "broken.ipynb")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0] == (
        "broken.ipynb:3:24: ACL000 cannot read notebook: not valid JSON: "
        "Expecting property name enclosed in double quotes"
    )
    (project / "other.ipynb").write_text('{"metadata": {}}')
    other = invoke("--no-cache", "--output-format", "concise", "other.ipynb")
    assert other.stdout.splitlines()[0] == (
        "other.ipynb:1:1: ACL000 cannot read notebook: not a Jupyter notebook: no `cells` list"
    )


def _notebook(*sources: str, language: str = "python") -> str:
    cells = [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": s}
        for s in sources
    ]
    metadata = {"language_info": {"name": language}}
    return json.dumps({"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 4})


def test_a_syntax_error_is_placed_in_its_cell(project, invoke):
    (project / "typo.ipynb").write_text(_notebook("import torch\n", "x = 1\nfor i in range(3)\n"))
    result = invoke("--no-cache", "--output-format", "concise", "typo.ipynb")
    assert (
        result.stdout.splitlines()[0] == "typo.ipynb:cell 2:2:18: ACL000 SyntaxError: expected ':'"
    )


def test_a_notebook_in_another_language_is_not_linted_as_python(project, invoke):
    (project / "r.ipynb").write_text(_notebook("library(torch)\nloss$backward()", language="R"))
    result = invoke("--no-cache", "r.ipynb")
    assert (result.exit_code, result.stdout) == (0, "All checks passed!\n")


def test_ipython_lines_are_masked_and_python_lines_kept():
    masks = Masks()
    cell = (
        "!pip install accelerate\n%timeit step()\nmodel?\n??model.forward\nfiles = !ls\n"
        "pip install -q torch\nx = (a\n     % b)\nfor b in dl:\n    %time step(b)\n"
        "!echo a \\\n  b\nls -l data\nls = 3\ncd -1\n"
    )
    assert mask_cell(cell, masks) == (
        "pass  # accel-lint: ipython 0\npass  # accel-lint: ipython 1\n"
        "pass  # accel-lint: ipython 2\npass  # accel-lint: ipython 3\n"
        "pass  # accel-lint: ipython 4\npass  # accel-lint: ipython 5\n"
        "x = (a\n     % b)\nfor b in dl:\n    pass  # accel-lint: ipython 6\n"
        "pass  # accel-lint: ipython 7\n# accel-lint: ipython 7+\n"
        "pass  # accel-lint: ipython 8\nls = 3\ncd -1\n"  # Python stays Python
    )
    assert mask_cell("%%time\nloss.backward()", masks) == (
        "pass  # accel-lint: ipython 9\nloss.backward()"
    )
    assert mask_cell("%%bash\nloss.backward()", masks) is None  # not Python: not linted


def test_a_fix_that_reindents_an_ipython_line_keeps_its_text():
    masks = Masks()
    masked = mask_cell("for b in dl:\n    !nvidia-smi -q \\\n      -d MEMORY\n", masks)
    moved = masked.replace("\n    ", "\n        ")  # as a fix that nests the body one level
    restored = "for b in dl:\n        !nvidia-smi -q \\\n          -d MEMORY\n"
    assert masks.restore(moved, {0}) == restored
    assert masks.restore(masked.replace("    pass  # accel-lint: ipython 0", ""), {0}) is None
    assert masks.restore(masked + masked, {0}) is None


def test_a_fix_that_crosses_a_cell_boundary_is_refused():
    program = program_of(_notebook("a = 1\n", "b = 2"))
    assert (
        program.text
        == "# accel-lint: notebook cell 1\na = 1\n# accel-lint: notebook cell 2\nb = 2\n"
    )
    assert program.cell_sources(program.text.replace("b = 2", "b = 3")) == {2: "b = 3"}
    assert (
        program.cell_sources(program.text.replace("1\n# accel-lint: notebook cell 2\n", "")) is None
    )


def test_a_compact_notebook_with_string_sources_keeps_its_layout(project, fake_rules, invoke):
    cells = [
        {"cell_type": "code", "metadata": {}, "outputs": [], "source": "x = 1  # café\n"},
        {"cell_type": "code", "metadata": {}, "outputs": [], "source": "loss.backward()  # é"},
    ]
    text = json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 4})
    (project / "c.ipynb").write_text(text)  # one line, non-ASCII escaped as json.dumps does
    assert invoke("--no-cache", "--fix", "c.ipynb").exit_code == 0
    old = '"loss.backward()  # \\u00e9"'
    assert (project / "c.ipynb").read_text() == text.replace(
        old, '"accelerator.backward(loss)  # \\u00e9"'
    )


def test_show_loops_places_the_loop_and_its_parts_in_their_cells(notebook, invoke):
    """`--show-loops` sees the notebook as the rules do: the loop of cell 5 with the optimizer
    of cell 3, and every line given as the cell and the line in it."""
    result = invoke("--show-loops", "train.ipynb", "--output-format", "json")
    assert result.exit_code == 0, result.output
    (loop,) = json.loads(result.stdout)["loops"]
    assert (loop["cell"], loop["line"], loop["kind"]) == (5, 4, "for")
    assert loop["optimizers"] == ["optimizer"]
    (backward,) = loop["backwards"]
    assert (backward["cell"], backward["line"]) == (5, 5)  # the row of the ACL301 finding
    tree = invoke("--show-loops", "train.ipynb")
    assert "for (cell 5, line 4)" in tree.stdout


def test_show_loops_on_a_notebook_with_a_syntax_error_names_its_cell(project, invoke):
    (project / "typo.ipynb").write_text(_notebook("import torch\n", "x = 1\nfor i in range(3)\n"))
    result = invoke("--show-loops", "typo.ipynb")
    assert result.exit_code == 1
    assert result.stdout == "typo.ipynb:cell 2:2:18: ACL000 SyntaxError: expected ':'\n"
    (project / "broken.ipynb").write_text('{"metadata": {}}')
    broken = invoke("--show-loops", "broken.ipynb")
    assert broken.exit_code == 2
    assert "broken.ipynb: cannot read notebook: not a Jupyter notebook" in broken.output


def test_a_cell_too_deep_to_analyse_gets_the_screens_acl000_in_its_cell(project, invoke):
    """The module screen applies to the cells' program: libcst never sees a 600-term sum."""
    deep = "y = " + " + ".join(["a"] * 600) + "\n"
    (project / "deep.ipynb").write_text(_notebook("import torch\n", deep))
    result = invoke("--no-cache", "--output-format", "concise", "deep.ipynb")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0] == (
        "deep.ipynb:cell 2:1:1: ACL000 too deeply nested to analyse: 603 levels (the limit is 400)"
    )
