"""Which files a run lints: .gitignore (nested, negated, in parents), exclude, named files."""

from pathlib import Path

from linter.config import Overrides, Resolver
from linter.discovery import discover


def write(root: Path, relative: str, text: str = "x = 1\n") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def found(root: Path, *paths: str) -> list[str]:
    resolver = Resolver(Overrides(), cwd=root)
    result = discover([root / p for p in paths or ["."]], resolver)
    return sorted(Path(p).resolve().relative_to(root.resolve()).as_posix() for p, _ in result.files)


def test_walk_honours_nested_gitignores_and_negations(tmp_path):
    (tmp_path / ".git").mkdir()
    write(tmp_path, ".gitignore", "generated/\n*_tmp.py\n")
    write(tmp_path, "train.py")
    write(tmp_path, "scratch_tmp.py")
    write(tmp_path, "generated/out.py")
    write(tmp_path, "pkg/.gitignore", "local.py\n!keep_tmp.py\n")
    write(tmp_path, "pkg/local.py")
    write(tmp_path, "pkg/keep_tmp.py")
    write(tmp_path, "pkg/model.py")
    write(tmp_path, "notes.txt")
    assert found(tmp_path) == ["pkg/keep_tmp.py", "pkg/model.py", "train.py"]


def test_parent_gitignore_applies_when_walking_a_subdirectory(tmp_path):
    (tmp_path / ".git").mkdir()
    write(tmp_path, ".gitignore", "src/gen/\n")
    write(tmp_path, "src/gen/a.py")
    write(tmp_path, "src/b.py")
    assert found(tmp_path, "src") == ["src/b.py"]


def test_config_exclude_and_default_excludes(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.accel-lint]\nexclude = ["fixtures", "legacy/*.py"]\n')
    write(tmp_path, "fixtures/bad.py")
    write(tmp_path, "legacy/old.py")
    write(tmp_path, "legacy/sub/keep.py")
    write(tmp_path, ".venv/lib/site.py")
    write(tmp_path, "build/lib/copy.py")
    write(tmp_path, "train.py")
    assert found(tmp_path) == ["legacy/sub/keep.py", "train.py"]


def test_named_files_are_linted_even_when_excluded(tmp_path):
    write(tmp_path, ".gitignore", "ignored.py\n")
    write(tmp_path, "ignored.py")
    write(
        tmp_path, "script"
    )  # a named file needs no .py suffix (pre-commit passes shebang scripts)
    assert found(tmp_path, "ignored.py", "script") == ["ignored.py", "script"]


def test_notebooks_are_linted_named_or_walked(tmp_path):
    write(tmp_path, "nb.ipynb", "{}")
    write(tmp_path, "sub/a.ipynb", "{}")
    write(tmp_path, "sub/b.py")
    resolver = Resolver(Overrides(), cwd=tmp_path)
    named = discover([tmp_path / "nb.ipynb"], resolver)
    assert [p.name for p, _ in named.files] == ["nb.ipynb"] and named.notes == []
    walked = discover([tmp_path], resolver)
    assert [p.name for p, _ in walked.files] == ["nb.ipynb", "a.ipynb", "b.py"]
    assert walked.notes == []


def test_duplicates_are_linted_once(tmp_path):
    write(tmp_path, "a.py")
    assert found(tmp_path, "a.py", ".", "a.py") == ["a.py"]


def test_a_named_excluded_directory_is_walked(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.accel-lint]\nexclude = ["fixtures"]\n')
    write(tmp_path, ".gitignore", "gen/\n")
    write(tmp_path, "fixtures/ACL101/bad.py")
    write(tmp_path, "fixtures/ACL101/fixtures/nested.py")
    write(tmp_path, "gen/out.py")
    assert found(tmp_path, "fixtures/ACL101", "gen") == ["fixtures/ACL101/bad.py", "gen/out.py"]
