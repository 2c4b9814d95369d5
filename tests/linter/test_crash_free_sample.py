"""Crash-free on real code (a CI-sized sample of `bench/crash_free.py`): every rule over the
installed accelerate package, torch's training utilities and a training notebook, then
`--fix --unsafe-fixes` twice."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))
import crash_free  # noqa: E402


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    return Path(next(iter(spec.submodule_search_locations)))


def test_real_code_sample_lints_and_fixes_cleanly():
    torch = _package_dir("torch")
    roots = [_package_dir("accelerate")] + [
        torch / part for part in ("amp", "optim", "nn/parallel", "nn/utils", "distributed/fsdp")
    ]
    notebooks = REPO / "tests" / "linter" / "cli" / "notebooks"
    result = crash_free.measure([*roots, notebooks])
    assert result["files"] > 150 and result["notebooks"] >= 1
    assert result["internal_errors"] == []
    assert result["not_analysed_ACL000"] == []  # real library code: all of it parses
    assert result["fixed_files"] == result["files_with_fixes"] >= 1  # every fix was applied
    assert result["fixed_not_compiling"] == []
    assert result["changed_by_second_fix"] == []
