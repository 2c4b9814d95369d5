"""The run report: `ACCEL_GUARD_REPORT=run.json` or `run.html` (several joined by `os.pathsep`).

Both hold the findings, the run's configuration as the guard saw it and the per-window series
(`guard.run_report.recorder`). The JSON file is shared: every process (torchrun workers,
spawned children) adds its findings and its run under a file lock. The HTML file is one page per
process, self-contained (inline CSS and SVG, no script, no network): rank 0 or the launched
process writes `run.html`, rank r `run.rank<r>.html`, another child process `run.pid<pid>.html`.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from guard import _report
from guard.run_report import recorder
from guard.run_report.config import configuration

FORMAT = "accel-guard-report"
VERSION = 2  # a version-1 file (a bare list of findings) is read and rewritten as 2


def run() -> dict:
    """This process's run: configuration, series per optimizer and finding markers."""
    tracker = sys.modules.get("guard._tracker")
    rec = recorder.recording()
    recorder.read_unread()
    return {
        "config": configuration(tracker.TRACKER, rec) if tracker else {},
        "series": [_series(s) for s in rec.series] if rec else [],
        "markers": _markers(rec),
    }


def _series(s: recorder.Series) -> dict:
    columns = {name: [getattr(row, name) for row in s.rows] for name in recorder.FIELDS}
    return {
        "optimizer": s.index,
        "type": s.name,
        "windows": s.windows,
        "stride": s.stride,
        "skipped_total": s.skipped_total,
        "skipped_windows": list(s.skipped_windows),
        "columns": columns,
    }


def _markers(rec: Any) -> list[dict]:
    if rec is None:
        return []
    return [
        {"code": code, "location": location, "windows": list(windows)}
        for (code, location), windows in rec.markers.items()
    ]


def write(path: str) -> None:
    """Write this process's part of the report at `path` (HTML by its suffix, else JSON)."""
    if path.lower().endswith((".html", ".htm")):
        _write_html(path)
    else:
        _write_json(path)


def _write_json(path: str) -> None:
    import fcntl

    mine = run()
    with open(path, "a+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read()
        doc = _as_document(json.loads(text) if text.strip() else None)
        doc["findings"].extend(_report.finding_rows())
        doc["runs"].append(mine)
        fh.seek(0)
        fh.truncate()
        json.dump(doc, fh, indent=1)


def _as_document(loaded: Any) -> dict:
    if isinstance(loaded, dict) and loaded.get("format") == FORMAT:
        return loaded
    findings = loaded if isinstance(loaded, list) else []  # a version-1 file: its findings
    return {"format": FORMAT, "version": VERSION, "findings": findings, "runs": []}


def html_path(path: str, rank: int, world_size: int, first_process: bool) -> str:
    """Where this process's page goes: `path` for rank 0 of a distributed run or for the
    launched process, `.rank<r>` for the other ranks, `.pid<pid>` for other child processes."""
    stem, ext = os.path.splitext(path)
    if world_size > 1:
        return path if rank == 0 else f"{stem}.rank{rank}{ext}"
    return path if first_process else f"{stem}.pid{os.getpid()}{ext}"


def _write_html(path: str) -> None:
    from guard.run_report.page import render_page

    mine = run()
    config = mine["config"]
    target = html_path(path, config.get("rank", 0), config.get("world_size", 1), _first())
    idle = not mine["series"] and not _report.findings()
    if idle and (not _first() or os.path.exists(target)):
        return  # trained nothing (a launcher whose ranks wrote their pages): no page of its own
    text = render_page(mine, _report.finding_rows())
    tmp = f"{target}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, target)  # a reader never sees half a page


def _first() -> bool:
    return _report.FIRST_PROCESS
