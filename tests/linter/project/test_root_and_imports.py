"""The project root and the module resolution: found as ruff and pyright find them."""

from __future__ import annotations

from pathlib import Path

from linter.project.resolve import Modules
from linter.project.root import find_root


def test_root_is_the_nearest_marker(tmp_path):
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = demo\n")
    (tmp_path / "tools").mkdir()
    script = tmp_path / "tools" / "train.py"
    script.write_text("")
    assert find_root([script]) == tmp_path
    (tmp_path / "tools" / "pyproject.toml").write_text("")
    assert find_root([script]) == tmp_path / "tools"


def test_a_git_checkout_is_a_project(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "engine.py").write_text("")
    assert find_root([tmp_path / "engine.py"]) == tmp_path


def test_without_a_marker_the_paths_given_share_a_root(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = tmp_path / "a" / "x.py", tmp_path / "b" / "y.py"
    first.write_text("")
    second.write_text("")
    if find_root([tmp_path]) != tmp_path:  # a marker above the temporary directory
        return
    assert find_root([first, second]) == tmp_path
    assert find_root([first]) is None  # a single file outside any project is linted alone


def _files(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


def test_absolute_relative_and_src_layouts(tmp_path):
    _files(tmp_path, "util/__init__.py", "util/misc.py", "engine.py", "src/pkg/__init__.py",
           "src/pkg/losses.py", "tools/train.py", "tools/options.py")  # fmt: skip
    modules = Modules(tmp_path)
    assert modules.resolve("util.misc") == str(tmp_path / "util" / "misc.py")
    assert modules.resolve("util") == str(tmp_path / "util" / "__init__.py")
    assert modules.resolve("pkg.losses") == str(tmp_path / "src" / "pkg" / "losses.py")
    # a script's own directory is on sys.path when it runs
    train = str(tmp_path / "tools" / "train.py")
    assert modules.resolve("options", train) == str(tmp_path / "tools" / "options.py")
    assert modules.resolve("torch") is None and modules.resolve("os.path") is None
    assert modules.package_of(str(tmp_path / "src" / "pkg" / "losses.py")) == "pkg"
    assert modules.name_of(str(tmp_path / "engine.py")) == "engine"


def test_relative_imports_are_made_absolute(tmp_path):
    from linter.project.summary import summarize

    text = "from .engine import train_one_epoch\nfrom ..util import misc\nimport torch\n"
    summary = summarize("pkg/sub/main.py", text, "", "pkg.sub")
    assert [(i.local, i.module, i.name) for i in summary.imports] == [
        ("train_one_epoch", "pkg.sub.engine", "train_one_epoch"),
        ("misc", "pkg.util", "misc"),
        ("torch", "torch", None),
    ]


def test_each_tree_given_is_its_own_project(tmp_path):
    """Two unrelated trees linted together stay two projects: their common parent (here the
    temporary directory, in real use a home directory or /work) is never the project."""
    from linter.project import for_paths
    from linter.project.root import find_roots

    marked, plain = tmp_path / "marked", tmp_path / "plain"
    _files(tmp_path, "marked/pyproject.toml", "marked/pkg/train.py", "plain/train.py")
    roots = find_roots([marked / "pkg" / "train.py", plain])
    if find_roots([plain])[plain] != plain:  # a marker above the temporary directory
        return
    assert roots == {marked / "pkg" / "train.py": marked, plain: plain}
    found = for_paths([marked, plain], [])
    assert sorted(p.root for p in found.projects) == [marked, plain]
    assert found.of(str(marked / "pkg" / "train.py")).root == marked
    assert found.of(str(plain / "train.py")).root == plain
    assert found.of(str(tmp_path / "elsewhere.py")) is None


def test_a_nested_project_holds_its_own_files(tmp_path):
    from linter.project import for_paths

    _files(tmp_path, "pyproject.toml", "tools/pyproject.toml", "tools/train.py", "engine.py")
    found = for_paths([tmp_path / "engine.py", tmp_path / "tools" / "train.py"], [])
    assert found.of(str(tmp_path / "tools" / "train.py")).root == tmp_path / "tools"
    assert found.of(str(tmp_path / "engine.py")).root == tmp_path


def test_a_single_file_outside_any_project_is_no_project(tmp_path):
    from linter.project import for_paths

    _files(tmp_path, "train.py")
    if find_root([tmp_path]) != tmp_path:  # a marker above the temporary directory
        return
    assert for_paths([tmp_path / "train.py"], []) is None
