"""Value types passed between the analysis, the fixer and the reporters.

Positions are 1-based lines and 0-based columns counted in characters (libcst's convention);
reporters convert to ruff's 1-based columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Applicability = Literal["safe", "unsafe"]


@dataclass(frozen=True, order=True)
class Position:
    line: int
    column: int


@dataclass(frozen=True)
class Edit:
    """Replace the text between `start` and `end` with `content` (an insertion when equal)."""

    start: Position
    end: Position
    content: str


@dataclass(frozen=True)
class Fix:
    applicability: Applicability
    message: str
    edits: tuple[Edit, ...]


@dataclass(frozen=True)
class Configuration:
    """The runs a finding affects: whether the default configuration is one of them, and the
    setting that makes it real (`with --gradient_accumulation_steps > 1 (default 1)`)."""

    affects_default: bool
    condition: str
    knobs: tuple[str, ...] = ()

    @property
    def latent(self) -> bool:
        return not self.affects_default

    def describe(self) -> str:
        """One line a reporter shows beside the message."""
        if self.affects_default:
            return f"the default configuration is affected ({self.condition})"
        return f"latent: only {self.condition}; the default configuration is not affected"

    def as_dict(self) -> dict:
        return {
            "condition": self.condition,
            "default_affected": self.affects_default,
            "knobs": list(self.knobs),
        }


def latent_severity(configuration: Configuration | None, severity: str | None) -> str | None:
    """The severity policy: a finding harmless in the default configuration is reported one
    level lower than the same finding in the default run (an error becomes a warning); a
    warning is the lowest level shown by default, so it stays a warning, and a hint is never
    where a latent finding goes."""
    if configuration is None or configuration.affects_default or severity == "info":
        return severity
    return "warning"


@dataclass(frozen=True)
class Diagnostic:
    code: str
    message: str
    path: str
    start: Position
    end: Position
    fix: Fix | None = None
    # Extra facts a reporter may show (e.g. the accumulation value and where it came from).
    notes: tuple[str, ...] = field(default=())
    # "info" for a hint-level finding of a rule whose findings are otherwise errors (ACL305's
    # unchecked step after a GradScaler step); None: the rule's own severity.
    severity: str | None = None
    # The configuration the finding depends on (None: it does not depend on one).
    configuration: Configuration | None = None

    @property
    def is_hint(self) -> bool:
        """A hint is shown only when hints are asked for, and never fails a run."""
        return self.severity == "info"


def failing(diagnostics) -> list[Diagnostic]:
    """The findings that count toward the exit code: every one but the hints."""
    return [d for d in diagnostics if not d.is_hint]
