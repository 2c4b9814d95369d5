"""Not a check: installs the run report's recorder (`guard.run_report.recorder`) with the checks,
so that `install()` / `uninstall()` cover it too. It reports no code and costs nothing unless a
report was asked for (`ACCEL_GUARD_REPORT=run.html` or `.json`, `configure(report_path=...)`)."""

from __future__ import annotations

from guard import _report

CODES: tuple[str, ...] = ()


def install(tracker) -> None:
    if _report._state.settings.report_path:
        from guard.run_report import recorder

        recorder.install(tracker)
