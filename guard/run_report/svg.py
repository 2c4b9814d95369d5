"""Timeline charts as inline SVG, written by hand.

matplotlib is not among the guard's dependencies and a report must open offline, without
scripts, in a CI artifact viewer: a polyline per series with its axis labels, red ticks for
skipped fp16 steps and dashed orange lines where findings fired is all a timeline needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 880, 170
LEFT, RIGHT, TOP, BOTTOM = 70, 14, 22, 26
_DOTS_UP_TO = 240  # points drawn as dots too when there are this few


@dataclass
class Chart:
    """One timeline: `ys[i]` at window `xs[i]` (None = not known for that window)."""

    name: str
    title: str
    xs: Sequence[int]
    ys: Sequence[float | None]
    x_max: int
    log: bool = False
    skipped: Sequence[int] = ()  # windows whose step the GradScaler skipped
    markers: list[tuple[int, str]] = field(default_factory=list)  # (window, label)


def _fmt(value: float) -> str:
    magnitude = abs(value)
    if value == 0:
        return "0"
    if 1e4 <= magnitude < 1e9:
        return f"{value:,.0f}"  # loss scales and token counts: 65,536
    if magnitude >= 1e9 or magnitude < 1e-3:
        return f"{value:.2e}"
    return f"{value:.4g}"


def _finite(chart: Chart) -> list[tuple[int, float]]:
    return [
        (x, y)
        for x, y in zip(chart.xs, chart.ys, strict=True)
        if y is not None and math.isfinite(y) and (y > 0 or not chart.log)
    ]


class _Scale:
    """Data coordinates to the plot area's pixels."""

    def __init__(self, chart: Chart, points: list[tuple[int, float]]):
        self.log = chart.log
        ys = [self._t(y) for _, y in points] or [0.0]
        low, high = min(ys), max(ys)
        if high - low < 1e-12:
            low, high = low - 1, high + 1
        pad = (high - low) * 0.08
        self.low, self.high = low - pad, high + pad
        self.x_low, self.x_high = 1, max(chart.x_max, 2)

    def _t(self, y: float) -> float:
        return math.log10(y) if self.log else y

    def x(self, window: float) -> float:
        span = self.x_high - self.x_low
        return LEFT + (window - self.x_low) / span * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        t = (self._t(value) - self.low) / (self.high - self.low)
        return TOP + (1 - t) * (HEIGHT - TOP - BOTTOM)

    def y_ticks(self) -> list[float]:
        raw = [self.low + (self.high - self.low) * f for f in (0.08 / 1.16, 0.5, 1 - 0.08 / 1.16)]
        return [10**t for t in raw] if self.log else raw

    def x_ticks(self) -> list[int]:
        step = max(1, math.ceil((self.x_high - self.x_low) / 6))
        return list(range(self.x_low, self.x_high + 1, step))


def _path(chart: Chart, scale: _Scale) -> str:
    """The polyline, broken where a window has no value."""
    parts, pen_down = [], False
    for x, y in zip(chart.xs, chart.ys, strict=True):
        usable = y is not None and math.isfinite(y) and (y > 0 or not chart.log)
        if not usable:
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{scale.x(x):.1f},{scale.y(y):.1f}")
        pen_down = True
    return " ".join(parts)


def render(chart: Chart) -> str:
    """The chart as an `<svg>` element (class "chart", `data-series` = its name)."""
    points = _finite(chart)
    scale = _Scale(chart, points)
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    out = [
        f'<svg class="chart" data-series="{escape(chart.name)}" data-points="{len(points)}" '
        f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(chart.title)}">',
        f'<text class="title" x="{LEFT}" y="14">{escape(chart.title)}'
        f"{' (log scale)' if chart.log else ''}</text>",
        f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{right - LEFT}" '
        f'height="{bottom - TOP}"/>',
    ]
    for value in scale.y_ticks():
        y = scale.y(value)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">')
        out.append(f"{_fmt(value)}</text>")
    for window in scale.x_ticks():
        x = scale.x(window)
        out.append(f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">')
        out.append(f"{window}</text>")
    for window in chart.skipped:
        x = scale.x(window)
        out.append(f'<line class="skip" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + 10}">')
        out.append(f"<title>window {window}: step skipped by the GradScaler</title></line>")
    for window, label in chart.markers:
        x = scale.x(window)
        out.append(f'<line class="finding" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{bottom}">')
        out.append(f"<title>{escape(label)}</title></line>")
    if points:
        out.append(f'<path class="line" d="{_path(chart, scale)}"/>')
    skipped = set(chart.skipped)
    for x, y in points:
        if x in skipped:  # the window whose step the scaler skipped, at the scale it used
            out.append(
                f'<circle class="skipped" cx="{scale.x(x):.1f}" cy="{scale.y(y):.1f}" r="3.5">'
            )
            out.append(f"<title>window {x}: {_fmt(y)}, step skipped</title></circle>")
        elif len(points) <= _DOTS_UP_TO:
            out.append(f'<circle class="dot" cx="{scale.x(x):.1f}" cy="{scale.y(y):.1f}" r="2">')
            out.append(f"<title>window {x}: {_fmt(y)}</title></circle>")
    out.append("</svg>")
    return "".join(out)


STYLE = """
svg.chart { display: block; margin: 4px 0 14px; max-width: 100%; height: auto; }
svg.chart .title { font: 600 12px sans-serif; fill: #222; }
svg.chart .frame { fill: #fbfbfd; stroke: #c8c8d0; }
svg.chart .grid { stroke: #e4e4ea; }
svg.chart .tick { font: 10px sans-serif; fill: #555; }
svg.chart .line { fill: none; stroke: #1f6fb4; stroke-width: 1.6; }
svg.chart .dot { fill: #1f6fb4; }
svg.chart .skip { stroke: #d62728; stroke-width: 2; }
svg.chart .skipped { fill: #d62728; }
svg.chart .finding { stroke: #ff7f0e; stroke-width: 1.4; stroke-dasharray: 4 3; }
"""
