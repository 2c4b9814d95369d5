"""Language-server latency: from a didChange to the diagnostics published for that version.

Starts `python -m linter.server` as an editor would (LSP over stdio, pygls's client), opens
`fixtures/lsp/train_500.py` (a 540-line training script with four findings), then types: each
round sends one incremental change (an edit of a default value, `log_every: int = 5` becoming
6, 7, 8, ...: every version is a text the server has never seen) and waits for the
publishDiagnostics that carries the new version. The first rounds warm the server up and are
not counted.

Also prints the server's CPU time per answer (from /proc: a figure the load hardly moves),
the analysis alone (`lint_text` in this process) on the same text, so the server's
own share (JSON-RPC, conversion, scheduling) is the difference, and the load average: on a
machine shared with other jobs both figures grow with the load, not with the server.

    python bench/lsp_latency.py [--rounds 40] [--warmup 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient
from pygls.uris import from_fs_path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "fixtures" / "lsp" / "train_500.py"
KEYSTROKE_LINE = "    log_every: int = 5\n"


class Client:
    def __init__(self):
        self.lsp = LanguageClient("lsp-latency", "1")
        self.arrived: dict[int, tuple[float, int]] = {}  # version -> (time, diagnostics)
        self.event = asyncio.Event()

        @self.lsp.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def published(params: types.PublishDiagnosticsParams) -> None:
            self.arrived[params.version] = (time.perf_counter(), len(params.diagnostics))
            self.event.set()

    async def wait_for(self, version: int) -> tuple[float, int]:
        while version not in self.arrived:
            self.event.clear()
            await asyncio.wait_for(self.event.wait(), 60)
        return self.arrived[version]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux), None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(rounds: int, warmup: int) -> tuple[list[float], int, float | None]:
    client = Client()
    await client.lsp.start_io(sys.executable, "-m", "linter.server", cwd=str(REPO))
    params = types.InitializeParams(
        process_id=os.getpid(),
        root_uri=from_fs_path(str(REPO)),
        capabilities=types.ClientCapabilities(),
    )
    await client.lsp.initialize_async(params)
    client.lsp.initialized(types.InitializedParams())
    text = SCRIPT.read_text(encoding="utf-8")
    uri = from_fs_path(str(SCRIPT))
    item = types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
    client.lsp.text_document_did_open(types.DidOpenTextDocumentParams(text_document=item))
    await client.wait_for(1)

    line = text[: text.index(KEYSTROKE_LINE)].count("\n")
    column = KEYSTROKE_LINE.index("5")
    value = "5"
    latencies, findings, cpu_start = [], 0, None
    pid = client.lsp._server.pid
    for version in range(2, 2 + warmup + rounds):
        if version == 2 + warmup:
            cpu_start = cpu_seconds(pid)
        where = types.Range(
            start=types.Position(line=line, character=column),
            end=types.Position(line=line, character=column + len(value)),
        )
        value = str(4 + version)
        change = types.TextDocumentContentChangePartial(range=where, text=value)
        document = types.VersionedTextDocumentIdentifier(uri=uri, version=version)
        sent = time.perf_counter()
        client.lsp.text_document_did_change(
            types.DidChangeTextDocumentParams(text_document=document, content_changes=[change])
        )
        arrived, findings = await client.wait_for(version)
        if version >= 2 + warmup:
            latencies.append(arrived - sent)
    cpu_end = cpu_seconds(pid)
    cpu = (cpu_end - cpu_start) / rounds if cpu_start is not None and cpu_end else None
    await client.lsp.shutdown_async(None)
    client.lsp.exit(None)
    await client.lsp.stop()
    return latencies, findings, cpu


def analysis_alone(repeat: int) -> list[float]:
    from linter.config import Overrides, Resolver
    from linter.text import lint_text

    text = SCRIPT.read_text(encoding="utf-8")
    resolver = Resolver(Overrides(), cwd=REPO)
    lint_text(text, SCRIPT, resolver)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        lint_text(text, SCRIPT, resolver)
        times.append(time.perf_counter() - start)
    return times


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    options = parser.parse_args()
    latencies, findings, cpu = asyncio.run(measure(options.rounds, options.warmup))
    alone = analysis_alone(max(10, options.rounds // 2))
    lines = SCRIPT.read_text(encoding="utf-8").count("\n")
    print(f"{SCRIPT.relative_to(REPO)}: {lines} lines, {findings} diagnostics per answer")
    print(
        f"didChange -> publishDiagnostics ({len(latencies)} rounds after {options.warmup} warm-up):"
        f" median {statistics.median(latencies) * 1000:.1f} ms,"
        f" p90 {p90(latencies) * 1000:.1f} ms"
    )
    if cpu is not None:
        print(f"server CPU time per answer (mean): {cpu * 1000:.1f} ms")
    print(
        f"analysis alone (lint_text, same text): median {statistics.median(alone) * 1000:.1f} ms,"
        f" p90 {p90(alone) * 1000:.1f} ms"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average {load} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
