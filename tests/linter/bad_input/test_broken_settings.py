"""A broken `[tool.accel-lint]` table or an unknown code on the command line: one clear error
naming the key or option, exit 2, and no file is touched."""

from __future__ import annotations

import pytest
from bad_input_scripts import SCRIPT

_TABLES = {
    "not-toml": (
        "[tool.accel-lint]\nselect = [ACL101]\n",
        "invalid TOML: Invalid value (at line 4, column 11): `select = [ACL101]`",
    ),
    "not-a-table": ("[tool]\naccel-lint = 3\n", "`tool.accel-lint` must be a table"),
    "misspelt-key": (
        "[tool.accel-lint]\nselct = ['ACL1']\n",
        "unknown key(s): `selct` (did you mean `select`?)",
    ),
    "unknown-code": (
        "[tool.accel-lint]\nextend-select = ['ACL9']\n",
        "`extend-select`: unknown rule selector: `ACL9`",
    ),
    "not-a-list": (
        "[tool.accel-lint]\nignore = 'ACL101'\n",
        "`ignore` must be a list of strings, not 'ACL101'",
    ),
    "per-file-code": (
        "[tool.accel-lint.per-file-ignores]\n'tests/*' = ['ACL999']\n",
        '`per-file-ignores."tests/*"`: unknown rule selector: `ACL999`',
    ),
    "not-a-bool": (
        "[tool.accel-lint]\nunsafe-fixes = 'yes'\n",
        "`unsafe-fixes` must be true or false, not 'yes'",
    ),
}


@pytest.mark.parametrize("kind", sorted(_TABLES))
def test_broken_table_names_the_key_and_exits_two(project, invoke, kind):
    table, message = _TABLES[kind]
    (project / "pyproject.toml").write_text("[project]\nname = 'demo'\n" + table)
    (project / "train.py").write_text(SCRIPT)
    result = invoke(".", "--fix")
    assert result.exit_code == 2
    assert result.stderr == f"error: {project / 'pyproject.toml'}: {message}\n"
    assert result.stdout == ""
    assert (project / "train.py").read_text() == SCRIPT


def test_a_broken_nested_config_is_reported_when_the_walk_reaches_it(project, invoke):
    (project / "sub").mkdir()
    (project / "sub" / ".accel-lint.toml").write_text("select = 'ACL1'\n")
    (project / "sub" / "train.py").write_text(SCRIPT)
    result = invoke(".", "--fix")
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {project / 'sub' / '.accel-lint.toml'}: "
        "`select` must be a list of strings, not 'ACL1'\n"
    )
    assert (project / "sub" / "train.py").read_text() == SCRIPT


@pytest.mark.parametrize(
    "option, value", [("--select", "ACL999"), ("--ignore", "E501"), ("--extend-select", "acl7")]
)
def test_unknown_code_on_the_command_line_names_the_option(project, invoke, option, value):
    (project / "train.py").write_text(SCRIPT)
    result = invoke(".", option, f"ACL101,{value}")
    assert result.exit_code == 2
    assert result.stderr == f"error: {option}: unknown rule selector: `{value}`\n"
    assert result.stdout == ""
