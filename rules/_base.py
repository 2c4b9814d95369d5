"""The rule record shared by the linter, the guard and the docs.

This module must stay importable without libcst or torch: the guard reads the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]
FixSafety = Literal["safe", "unsafe", "none", "safe-when-trailing"]
RuntimeCoverage = Literal["full", "partial", "heuristic", "warning", "none"]
GuardLevel = Literal["error", "warning"]


@dataclass(frozen=True)
class Rule:
    """One catalogue entry: identity, classification and the `--explain` text."""

    code: str  # "ACL101"
    name: str  # "raw-backward"
    summary: str  # one line, shown by --list-rules and in messages
    severity: Severity
    fix: FixSafety
    runtime: RuntimeCoverage  # how the guard covers it
    static: bool  # whether the linter has a static check for it
    docs: str  # markdown: What it does / Why is this bad? / Example / Use instead / Fix safety
    # How the runtime guard reports it: "error" raises `GuardError` in ACCEL_GUARD=raise mode,
    # "warning" never raises. Empty = the static severity. Several = it depends on the case.
    guard_levels: tuple[GuardLevel, ...] = ()
    # The rule's hint-level (info) variant, if any: reported only with `--hints` (or
    # `hints = true` in the config), and never counted toward the exit code.
    hint: str = ""

    @property
    def runtime_levels(self) -> tuple[str, ...]:
        """The levels the guard may report this code with (see `guard_levels`)."""
        if self.runtime == "none":
            return ()
        return self.guard_levels or (self.severity,)
