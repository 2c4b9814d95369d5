"""accel-lint: the static half of accel-lint (the runtime half is `guard`)."""

__version__ = "0.1.0"  # kept equal to pyproject's version by tests/linter/cli/test_version.py
