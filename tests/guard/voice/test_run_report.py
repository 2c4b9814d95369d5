"""The run report (`ACCEL_GUARD_REPORT=run.json` / `run.html`): its series are what the run did,
as each loop recorded it by its own host reads; its pages hold one non-empty SVG per series."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from pathlib import Path

from guard import run_report
from guard.run_report import recorder
from tests.guard.voice import loops


def _written(path: Path) -> dict:
    run_report.write(str(path))
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert (doc["format"], doc["version"]) == ("accel-guard-report", 2)
    return doc


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)


def _assert_series(series: dict, expected: dict, fields: tuple[str, ...]) -> None:
    columns = series["columns"]
    assert series["windows"] == expected["windows"]
    assert columns["window"] == list(range(1, expected["windows"] + 1))
    for name in fields:
        got, want = columns[name], expected[name]
        assert len(got) == len(want) and all(map(_close, got, want)), (name, got, want)


def test_fp16_overflow_shows_the_skipped_step(guard_mode, tmp_path):
    guard = guard_mode("warn", report_path=str(tmp_path / "run.json"))
    expected = loops.fp16_overflow_loop(overflow_window=3, scaled_clip_window=2)
    doc = _written(tmp_path / "run.json")
    (run,) = doc["runs"]
    (series,) = run["series"]
    _assert_series(series, expected, loops.FIELDS)
    assert expected["skipped_windows"] == [3]  # the loop's own record: the inf loss was skipped
    assert series["skipped_windows"] == expected["skipped_windows"]
    assert series["skipped_total"] == 1
    assert [f["code"] for f in doc["findings"]] == [f.code for f in guard.findings()] == ["ACL104"]
    assert [m["windows"] for m in run["markers"]] == [[2]]  # the clip before unscale_
    config = run["config"]
    assert config["trainer"] == "plain PyTorch"
    assert config["precision_effective"] == "fp16 + GradScaler"
    assert config["accumulation_observed"] == 2
    assert [o["type"] for o in config["optimizers"]] == ["SGD"]
    assert config["schedulers"] == ["StepLR"]
    assert (config["world_size"], config["rank"]) == (1, 0)


def test_engine_accumulation_with_a_tail_window(guard_mode, tmp_path):
    guard = guard_mode("raise", report_path=str(tmp_path / "run.json"))
    expected = loops.engine_tail_loop(guard.Engine)
    assert expected["micro_batches"] == [3, 3, 2]  # the loader ran out in the third window
    doc = _written(tmp_path / "run.json")
    (run,) = doc["runs"]
    (series,) = run["series"]
    _assert_series(series, expected, loops.FIELDS)
    assert doc["findings"] == []
    config = run["config"]
    assert (config["trainer"], config["accumulation_steps"]) == ("guard.Engine", 3)
    assert (config["precision_requested"], config["precision_effective"]) == ("bf16", "bf16")
    assert config["schedulers"] == ["StepLR"]


def test_the_guard_computes_the_norm_when_nobody_clips(guard_mode, tmp_path):
    guard_mode("raise", report_path=str(tmp_path / "run.json"))
    expected = loops.plain_loop(windows=3)
    (run,) = _written(tmp_path / "run.json")["runs"]
    _assert_series(run["series"][0], expected, ("step", "grad_norm"))


def test_long_runs_are_thinned_not_dropped(guard_mode, tmp_path, monkeypatch):
    monkeypatch.setattr(recorder, "MAX_ROWS", 8)
    guard_mode("raise", report_path=str(tmp_path / "run.json"))
    expected = loops.plain_loop(windows=40)
    (run,) = _written(tmp_path / "run.json")["runs"]
    series = run["series"][0]
    assert series["windows"] == 40
    stride = series["stride"]
    assert stride == 8  # 9 rows -> every 2nd, again at 9 -> every 4th, then every 8th
    kept = series["columns"]["window"]
    assert kept == list(range(1, 41, stride)) and len(kept) <= 8
    norms = [expected["grad_norm"][w - 1] for w in kept]
    assert all(map(_close, series["columns"]["grad_norm"], norms))


def test_an_old_list_report_keeps_its_findings(guard_mode, tmp_path):
    guard_mode("raise", report_path=str(tmp_path / "run.json"))
    old = [{"code": "ACL102", "message": "m", "level": "error", "location": None, "step": 0}]
    (tmp_path / "run.json").write_text(json.dumps(old))
    doc = _written(tmp_path / "run.json")
    assert doc["findings"] == old and len(doc["runs"]) == 1


class _Charts(HTMLParser):
    """The page's charts: data-series -> the `d` of its line and its point count."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict] = {}
        self._current: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg" and "chart" in (attrs.get("class") or ""):
            self._current = attrs["data-series"]
            self.charts[self._current] = {"points": int(attrs["data-points"]), "d": ""}
        elif tag == "path" and self._current and attrs.get("class") == "line":
            self.charts[self._current]["d"] = attrs["d"]
        elif tag == "line" and self._current and attrs.get("class") in ("skip", "finding"):
            self.charts[self._current].setdefault(attrs["class"], 0)
            self.charts[self._current][attrs["class"]] += 1

    def handle_endtag(self, tag):
        if tag == "svg":
            self._current = None


def fp16_page(tmp_path: Path) -> tuple[Path, dict]:
    """The fp16 run's HTML page and the loop's own record."""
    expected = loops.fp16_overflow_loop(overflow_window=3, scaled_clip_window=2)
    page = tmp_path / "run.html"
    run_report.write(str(page))
    return page, expected


def test_the_html_page_has_one_chart_per_series(guard_mode, tmp_path):
    guard_mode("warn", report_path=str(tmp_path / "run.html"))
    page, expected = fp16_page(tmp_path)
    text = page.read_text(encoding="utf-8")
    assert "<script" not in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    parser = _Charts()
    parser.feed(text)
    charts = parser.charts
    assert set(charts) == {"loss_scale", "micro_batches", "tokens", "grad_norm", "lr"}
    windows = expected["windows"]
    for name, chart in charts.items():
        known = sum(v is not None for v in expected[name])
        assert chart["points"] == known, name
        assert chart["d"].count("M") + chart["d"].count("L") == known, name
        assert chart.get("finding") == 1, name  # ACL104's marker, window 2
    assert charts["loss_scale"]["skip"] == len(expected["skipped_windows"]) == 1
    assert windows == 5
    assert 'id="ACL104"' in text and "## " not in text  # the rule's docs, rendered


WORKER = Path(__file__).with_name("report_worker.py")


def test_ddp_ranks_write_their_own_pages_and_share_the_json(tmp_path):
    from tests.guard.two_ranks import run_two_ranks

    for stale in tmp_path.glob("run*"):
        stale.unlink()
    ranks = run_two_ranks(WORKER, tmp_path, str(tmp_path))
    doc = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))
    runs = sorted(doc["runs"], key=lambda r: r["config"]["rank"])
    assert [r["config"]["rank"] for r in runs] == [0, 1]
    assert doc["findings"] == []
    for run, rank in zip(runs, ranks, strict=True):
        assert run["config"]["world_size"] == 2
        expected = dict(rank["expected"], windows=3)
        assert expected["micro_batches"] == [2, 2, 1]  # the 1-batch tail window
        _assert_series(run["series"][0], expected, ("micro_batches", "grad_norm", "lr", "tokens"))
    norms = [r["series"][0]["columns"]["grad_norm"] for r in runs]
    assert all(map(_close, *norms))  # DDP averaged the gradients: one norm on both ranks
    for page, pid in ((tmp_path / "run.html", runs[0]), (tmp_path / "run.rank1.html", runs[1])):
        text = page.read_text(encoding="utf-8")
        assert f"rank {pid['config']['rank']} of 2 · pid {pid['config']['pid']}" in text


def test_accelerate_fp16_on_cpu_shows_what_really_ran(guard_mode, tmp_path):
    """Accelerate asked for fp16 on a CPU trains fp32 (ACL602): the report shows both."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from torch.utils.data import DataLoader, TensorDataset

    guard = guard_mode("warn", report_path=str(tmp_path / "run.json"))
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, mixed_precision="fp16", gradient_accumulation_steps=2)
    xs, ys = zip(*loops.batches(5), strict=True)
    loader = DataLoader(TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=4)
    net = loops.model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(net, opt, loader)
    windows = []
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            windows.append(accelerator.sync_gradients)
            opt.step()
            opt.zero_grad()
    (run,) = _written(tmp_path / "run.json")["runs"]
    config = run["config"]
    assert config["trainer"] == "accelerate.Accelerator"
    assert (config["precision_requested"], config["precision_effective"]) == ("fp16", "fp32")
    assert config["accumulation_steps"] == 2
    assert run["series"][0]["columns"]["micro_batches"] == [2, 2, 1]
    assert windows.count(True) == 3
    assert [f.code for f in guard.findings()] == ["ACL602"]
