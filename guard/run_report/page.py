"""The run report as one self-contained HTML page: inline CSS and SVG, no script, no network.

The findings' docs are the catalogue's markdown (`rules/`), rendered with markdown-it-py (rich's
own markdown parser, so already installed with the linter); raw HTML in it is not passed through.
"""

from __future__ import annotations

from html import escape

from guard import _voice
from guard.run_report import svg

_PAGE_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1d1d22; margin: 24px auto; max-width: 960px;
  padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 2px; } h2 { font-size: 17px; margin-top: 28px; }
h3 { font-size: 15px; margin-bottom: 4px; }
.lede { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { text-align: left; padding: 3px 10px 3px 0; vertical-align: top;
  border-bottom: 1px solid #eee; }
th { color: #444; font-weight: 600; }
td.num { text-align: right; }
code, pre { font: 12px ui-monospace, monospace; background: #f4f4f7; }
pre { padding: 8px; overflow-x: auto; }
details { margin: 6px 0 10px; } summary { cursor: pointer; font-weight: 600; }
.error { color: #b00020; } .warning { color: #9a5b00; }
.none { color: #2e7d32; }
"""


def render_page(run: dict, findings: list[dict]) -> str:
    config = run.get("config", {})
    script = config.get("script") or "?"
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>accel-guard run report: {escape(_voice.display_path(script))}</title>",
        f"<style>{_PAGE_STYLE}{svg.STYLE}</style></head><body>",
        "<h1>accel-guard run report</h1>",
        f'<p class="lede">{escape(_lede(run, findings))}</p>',
        "<h2>Configuration</h2>",
        _config_table(config),
        "<h2>Findings</h2>",
        _findings_section(findings),
        "<h2>Timelines per optimizer step</h2>",
        _timelines(run),
        "</body></html>",
    ]
    return "\n".join(parts)


def _lede(run: dict, findings: list[dict]) -> str:
    config = run.get("config", {})
    windows = sum(s["windows"] for s in run.get("series", []))
    skipped = sum(s["skipped_total"] for s in run.get("series", []))
    return (
        f"{_voice.display_path(config.get('script') or '?')} · rank {config.get('rank', 0)} of "
        f"{config.get('world_size', 1)} · pid {config.get('pid')} · {windows} optimizer step "
        f"attempt(s), {skipped} skipped · {len(findings)} finding(s)"
    )


def _config_table(config: dict) -> str:
    optimizers = ", ".join(
        f"{o['type']} ({o['parameters']:,} parameters, {o['param_groups']} group(s), "
        f"lr {_number(o['first_lr'])})"
        for o in config.get("optimizers", [])
    )
    k = config.get("accumulation_steps")
    observed = config.get("accumulation_observed")
    rows = [
        ("trainer", config.get("trainer")),
        ("precision requested", config.get("precision_requested") or "(none: a plain loop)"),
        ("precision effective", config.get("precision_effective")),
        ("accumulation steps K", f"{k if k is not None else 'not set'}; observed {observed}"),
        ("world size", config.get("world_size")),
        ("optimizers", optimizers or "none seen"),
        ("schedulers", ", ".join(config.get("schedulers", [])) or "none stepped"),
        ("settings changed", _changed(config.get("settings", []))),
        ("guard mode", config.get("mode")),
        ("torch", config.get("torch")),
        ("command", " ".join([config.get("script") or "?", *config.get("argv", [])])),
    ]
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    return f'<table class="config">{body}</table>'


def _changed(settings: list[dict]) -> str:
    """The settings this run changed from their defaults: `--k 4 (default 1)`."""
    changed = [
        f"{s['option']} {s['value']} (default {s['default']})" for s in settings if s["changed"]
    ]
    if changed:
        return "; ".join(changed)
    return "none (every option at its default)" if settings else "no command-line options seen"


def _findings_section(findings: list[dict]) -> str:
    if not findings:
        return '<p class="none">No findings.</p>'
    head = "<tr><th>code</th><th>level</th><th>location</th><th>first step</th>"
    head += "<th>count</th><th>message</th></tr>"
    rows = []
    for f in sorted(findings, key=lambda r: (r["code"], r["step"], r["location"] or "")):
        problem, fix = _voice.split_fix(f["code"], f["message"])
        message = escape(problem) + (f"<br><b>help:</b> {escape(fix)}" if fix else "")
        rows.append(
            f'<tr><td><a href="#{f["code"]}">{f["code"]}</a></td>'
            f'<td class="{escape(f["level"])}">{escape(f["level"])}</td>'
            f"<td><code>{escape(_voice.where(f['location']))}</code></td>"
            f'<td class="num">{f["step"]}</td><td class="num">{f["count"]}</td>'
            f"<td>{message}</td></tr>"
        )
    docs = [_docs(code) for code in sorted({f["code"] for f in findings})]
    return f'<table class="findings">{head}{"".join(rows)}</table>' + "".join(docs)


def _docs(code: str) -> str:
    try:
        from rules import ALL_RULES
    except ImportError:
        return ""
    rule = ALL_RULES.get(code)
    if rule is None:
        return ""
    title = f"{code} {rule.name}: {rule.summary}"
    return (
        f'<details id="{code}"><summary>{_markdown_inline(title)}</summary>'
        f"{_markdown(rule.docs)}</details>"
    )


def _markdown(text: str) -> str:
    try:
        from markdown_it import MarkdownIt
    except ImportError:  # rich without its markdown parser: the text as it is
        return f"<pre>{escape(text)}</pre>"
    return MarkdownIt("commonmark", {"html": False}).render(text)


def _markdown_inline(text: str) -> str:
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return escape(text)
    return MarkdownIt("commonmark", {"html": False}).renderInline(text)


_CHARTS = (  # column, title, log scale
    ("loss_scale", "GradScaler loss scale (red ticks: skipped steps)", True),
    ("micro_batches", "micro-batches per window", False),
    ("tokens", "valid tokens per window", False),
    ("grad_norm", "gradient norm (before clipping)", False),
    ("lr", "learning rate", False),
)


def _timelines(run: dict) -> str:
    series = run.get("series", [])
    if not series:
        return "<p>No optimizer step was seen.</p>"
    markers = [
        (window, f"{m['code']} at {_voice.where(m['location'])} (window {window})")
        for m in run.get("markers", [])
        for window in m["windows"]
    ]
    out = []
    for s in series:
        out.append(_optimizer_timelines(s, markers))
    return "".join(out)


def _optimizer_timelines(s: dict, markers: list[tuple[int, str]]) -> str:
    columns = s["columns"]
    thinning = f", every {s['stride']}th window shown" if s["stride"] > 1 else ""
    skipped = s["skipped_windows"]
    head = (
        f"<h3>optimizer {s['optimizer']}: {escape(s['type'])}</h3>"
        f"<p>{s['windows']} step attempt(s), {s['skipped_total']} skipped by the GradScaler"
        f"{' (windows ' + escape(_short_list(skipped)) + ')' if skipped else ''}{thinning}.</p>"
    )
    charts = []
    for name, title, log in _CHARTS:
        ys = columns.get(name, [])
        if not any(v is not None for v in ys):
            continue
        chart = svg.Chart(
            name=name,
            title=title,
            xs=columns["window"],
            ys=ys,
            x_max=s["windows"],
            log=log,
            skipped=skipped if name == "loss_scale" else (),
            markers=markers,
        )
        charts.append(svg.render(chart))
    return head + "".join(charts)


def _short_list(values: list[int], limit: int = 20) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def _number(value: float | None) -> str:
    return "?" if value is None else f"{value:.4g}"
