"""`analysis._DataclassCode`: the compiled methods of dataclasses, reused between runs, must make
the same classes, and a missing, foreign or broken cache file only costs the compile."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from linter.analysis import _DataclassCode


def make_classes():
    @dataclasses.dataclass(frozen=True)
    class Window:
        steps: int
        names: tuple[str, ...] = ()
        gated: bool = dataclasses.field(default=False, compare=False)

    return Window


def test_cached_code_makes_the_same_class(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = _DataclassCode()
    with first.installed():
        compiled = make_classes()
    first.save()
    assert Path(first.path).is_file() and first.used
    second = _DataclassCode()
    assert second.known.keys() == first.used.keys()
    with second.installed():
        cached = make_classes()
    assert "exec" not in vars(dataclasses)  # uninstalled again
    for cls in (compiled, cached):
        window = cls(4, ("a",))
        assert window == cls(4, ("a",), gated=True) and hash(window) == hash(cls(4, ("a",)))
        assert repr(window).endswith("Window(steps=4, names=('a',), gated=False)")
    assert compiled.__init__.__code__.co_code == cached.__init__.__code__.co_code
    assert cached.__init__.__code__.co_flags == compiled.__init__.__code__.co_flags


def test_a_broken_cache_file_is_compiled_over(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = Path(_DataclassCode().path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00not marshal")
    code = _DataclassCode()
    assert code.known == {}
    with code.installed():
        cls = make_classes()
    code.save()
    assert cls(2).steps == 2 and _DataclassCode().known.keys() == code.used.keys()


def test_an_unwritable_cache_directory_is_no_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file where the directory would be
    code = _DataclassCode()
    with code.installed():
        make_classes()
    code.save()


def _lint_twice(tmp_path, *options):
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "linter.cli", *options, "fixtures/tour/train.py"]
    env = {"XDG_CACHE_HOME": str(tmp_path / "user"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    runs = []
    for run in "12":  # a results cache of its own each time: both runs analyse the file
        env["ACCEL_LINT_CACHE_DIR"] = str(tmp_path / f"results{run}")
        runs.append(subprocess.run(command, cwd=root, env=env, capture_output=True, text=True))
    return runs


def test_lint_results_are_the_same_with_a_warm_cache(tmp_path):
    runs = _lint_twice(tmp_path)
    assert list(tmp_path.glob("user/accel-lint/dataclass-code-*.marshal"))
    assert runs[0].stdout == runs[1].stdout and runs[0].returncode == runs[1].returncode == 1


def test_no_cache_writes_no_compiled_code(tmp_path):
    runs = _lint_twice(tmp_path, "--no-cache")
    assert not (tmp_path / "user").exists() and not list(tmp_path.glob("results*"))
    assert runs[0].stdout == runs[1].stdout and runs[0].returncode == runs[1].returncode == 1
