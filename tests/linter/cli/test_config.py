"""Config files: discovery (closest wins), keys, per-file-ignores, CLI layering, errors."""

from pathlib import Path

import pytest

from linter.config import ConfigError, Overrides, Resolver


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_closest_config_wins_and_plain_pyproject_is_skipped(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.accel-lint]\nselect = ["ACL3"]\n')
    write(tmp_path / "sub" / "pyproject.toml", "[project]\nname = 'x'\n")  # no accel-lint table
    write(tmp_path / "other" / "accel-lint.toml", 'select = ["ACL101"]\n')
    resolver = Resolver(Overrides(), cwd=tmp_path)
    assert all(c.startswith("ACL3") for c in resolver.for_path(tmp_path / "sub" / "a.py").codes)
    assert resolver.for_path(tmp_path / "other" / "a.py").codes == {"ACL101"}


def test_dot_file_beats_pyproject_in_the_same_directory(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.accel-lint]\nselect = ["ACL3"]\n')
    write(tmp_path / ".accel-lint.toml", 'select = ["ACL201"]\n')
    assert Resolver(Overrides(), cwd=tmp_path).project.codes == {"ACL201"}


def test_cli_select_replaces_and_ignore_extends(tmp_path):
    write(
        tmp_path / "pyproject.toml", '[tool.accel-lint]\nselect = ["ACL3"]\nignore = ["ACL303"]\n'
    )
    cli = Overrides(select=("ACL30",), ignore=("ACL302",))
    codes = Resolver(cli, cwd=tmp_path).project.codes
    assert "ACL301" in codes and "ACL302" not in codes and "ACL303" not in codes
    assert not any(c.startswith("ACL31") for c in codes)


def test_per_file_ignores_match_relative_globs_and_basenames(tmp_path):
    write(
        tmp_path / "pyproject.toml",
        '[tool.accel-lint]\nselect = ["ACL101", "ACL301"]\n'
        '[tool.accel-lint.per-file-ignores]\n"tests/*.py" = ["ACL1"]\n"conftest.py" = ["ACL301"]\n',
    )
    settings = Resolver(Overrides(), cwd=tmp_path).project
    assert settings.codes_for(tmp_path / "tests" / "t.py") == {"ACL301"}
    assert settings.codes_for(tmp_path / "deep" / "conftest.py") == {"ACL101"}
    assert settings.codes_for(tmp_path / "train.py") == {"ACL101", "ACL301"}


def test_explicit_config_applies_to_every_file(tmp_path):
    config = write(tmp_path / "ci.toml", 'select = ["ACL201"]\nunsafe-fixes = true\n')
    write(tmp_path / "sub" / "pyproject.toml", '[tool.accel-lint]\nselect = ["ACL3"]\n')
    resolver = Resolver(Overrides(), config, cwd=tmp_path)
    settings = resolver.for_path(tmp_path / "sub" / "a.py")
    assert settings.codes == {"ACL201"} and settings.unsafe_fixes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tool.accel-lint]\nselct = []\n", "unknown key"),
        ("[tool.accel-lint]\nselect = 'ACL1'\n", "must be a list of strings"),
        ("[tool.accel-lint]\nselect = ['ACL999']\n", "unknown rule selector"),
        ("[tool.accel-lint]\nunsafe-fixes = 'yes'\n", "true or false"),
        ("[tool.accel-lint]\nper-file-ignores = ['a']\n", "table of glob"),
        ("[tool.accel-lint\n", "pyproject.toml"),
    ],
)
def test_invalid_config_is_a_clear_error(tmp_path, text, message):
    write(tmp_path / "pyproject.toml", text)
    with pytest.raises(ConfigError, match=message):
        Resolver(Overrides(), cwd=tmp_path)
