"""The run report in a real browser: headless Chromium (Debian's `chromium` package) renders the
fp16 run's page; the screenshot holds the charts' line colour inside every plot, and the DOM the
browser built has one SVG chart per series with a drawn line."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.guard.voice.test_run_report import fp16_page

CHROMIUM = "/usr/bin/chromium"
LINE = (0x1F, 0x6F, 0xB4)  # svg.STYLE's colour for .line and .dot
pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="headless Chromium absent: install Debian's package (apt-get install -y chromium)",
)


def _chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    command += ["--no-first-run", "--disable-extensions", f"--user-data-dir={cwd / 'profile'}"]
    return subprocess.run(
        [*command, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=True
    )


def _png_rows(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, RGB(A) rows) of an 8-bit RGB or RGBA PNG, unfiltered (no PIL here)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color = header[:4]
    assert depth == 8 and color in (2, 6), header
    channels = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up, corner = previous[x], previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                guess = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[x] = (line[x] + guess) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, channels, rows


def _has_pixel(row: bytes, colour: bytes, channels: int) -> bool:
    """Whether some pixel of `row` has exactly `colour` (RGB)."""
    start = row.find(colour)
    while start >= 0:
        if start % channels == 0:
            return True
        start = row.find(colour, start + 1)
    return False


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, str] = {}
        self._chart = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg" and "chart" in (attrs.get("class") or ""):
            self._chart = attrs.get("data-series")
        elif tag == "path" and self._chart and attrs.get("class") == "line":
            self.lines[self._chart] = attrs.get("d", "")

    def handle_endtag(self, tag):
        if tag == "svg":
            self._chart = None


def test_chromium_renders_every_chart(guard_mode, tmp_path):
    guard_mode("warn", report_path=str(tmp_path / "run.html"))
    page, expected = fp16_page(tmp_path)
    dom = _Dom()
    dom.feed(_chromium("--dump-dom", page.as_uri(), cwd=tmp_path).stdout)
    assert set(dom.lines) == {"loss_scale", "micro_batches", "tokens", "grad_norm", "lr"}
    assert all(d.count("L") >= 2 for d in dom.lines.values()), dom.lines

    shot = tmp_path / "run.png"
    _chromium(f"--screenshot={shot}", "--window-size=1000,2000", page.as_uri(), cwd=tmp_path)
    width, channels, rows = _png_rows(shot)
    colour = bytes(LINE)  # the fill of the points, drawn in the exact colour
    line_rows = [y for y, row in enumerate(rows) if _has_pixel(row, colour, channels)]
    bands = 1 + sum(1 for a, b in zip(line_rows, line_rows[1:], strict=False) if b - a > 40)
    assert bands >= len(dom.lines), (bands, line_rows[:5])  # a drawn line in every chart
    keep = os.environ.get("ACCEL_GUARD_SCREENSHOTS")
    if keep:
        shutil.copy(shot, Path(keep) / "run_report.png")
    assert expected["skipped_windows"] == [3]
