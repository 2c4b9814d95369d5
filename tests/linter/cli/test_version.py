"""`--version` and the cache key use `linter.__version__`; it must match the package's version."""

import subprocess
import sys
from pathlib import Path

import tomllib

import linter

ROOT = Path(__file__).resolve().parents[3]


def test_version_matches_pyproject():
    with open(ROOT / "pyproject.toml", "rb") as handle:
        assert linter.__version__ == tomllib.load(handle)["project"]["version"]


def test_version_loads_no_parser_renderer_or_torch():
    probe = (
        "import sys; from linter.cli import main; sys.argv = ['accel-lint', '--version']; main(); "
        "print(sorted(m for m in ('libcst', 'rich', 'pydantic', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    assert out.stdout.splitlines() == [f"accel-lint {linter.__version__}", "[]"]
