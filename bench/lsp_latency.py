"""Language-server latency: from a didChange to the diagnostics published for that version.

Starts `python -m linter.server` as an editor would (LSP over stdio, pygls's client), opens
`fixtures/lsp/train_500.py` (a 540-line training script with four findings), then types at two
places: a default of the config dataclass (`log_every: int = 5`, a small top-level statement)
and a value inside the training function (`micro_step = 0`, in the largest one, which the
server's incremental parse must parse again). Each round sends one incremental change (the
value becomes 10, 11, 12, ...: every version is a text the server has never seen) and waits for
the publishDiagnostics that carries the new version. The first rounds warm the server up and
are not counted.

Also prints the server's CPU time per answer (from /proc: a figure the load hardly moves), the
analysis alone (`lint_text` in this process, with the server's parse cache and on each text
whole), so the server's own share (JSON-RPC, conversion, scheduling) is the difference, and
the load average: on a machine shared with other jobs every figure grows with the load.

    python bench/lsp_latency.py [--rounds 40] [--warmup 5] [--in-project] [--alone]

`--in-project` types in a copy of the script inside a small project of its own (a temporary
directory with a `pyproject.toml` and a `launch.py` that calls the script's `train`), so every
answer also builds the project context (the caller's text read with the script's; issue 23).
`--alone` starts the server with ACCEL_LINT_NO_PROJECT=1: each document read alone, the figure
to compare with.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient
from pygls.uris import from_fs_path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "fixtures" / "lsp" / "train_500.py"


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


# Where the benchmark types: a default in the config dataclass (a small top-level statement)
# and a value inside the training function (the largest one, 47 lines, parsed again each time).
KEYSTROKES = {"config": ("    log_every: int = 5\n", "5"), "loop": ("    micro_step = 0\n", "0")}


LAUNCH = """\
import torch

from train_500 import parse_args, train


def launch(argv):
    torch.distributed.init_process_group("nccl")
    return train(parse_args(argv))
"""


def in_project(directory: Path) -> Path:
    """The script copied into a project of its own, with a module that calls its `train`."""
    (directory / "pyproject.toml").write_text("[project]\nname = 'bench'\n")
    (directory / "launch.py").write_text(LAUNCH)
    return Path(shutil.copy(SCRIPT, directory / SCRIPT.name))


async def measure(
    rounds: int, warmup: int, script: Path = SCRIPT, env: dict | None = None
) -> dict[str, tuple[list[float], int, float | None]]:
    """Per keystroke site: the latencies, the diagnostics of the last answer, CPU per answer."""
    client = Client()
    root = script.parent if script != SCRIPT else REPO
    command = (sys.executable, "-m", "linter.server")
    await client.lsp.start_io(*command, cwd=str(REPO), env=env)
    params = types.InitializeParams(
        process_id=os.getpid(),
        root_uri=from_fs_path(str(root)),
        capabilities=types.ClientCapabilities(),
    )
    await client.lsp.initialize_async(params)
    client.lsp.initialized(types.InitializedParams())
    text = script.read_text(encoding="utf-8")
    uri = from_fs_path(str(script))
    item = types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
    client.lsp.text_document_did_open(types.DidOpenTextDocumentParams(text_document=item))
    await client.wait_for(1)
    results, version = {}, 1
    for site, (keystroke_line, value) in KEYSTROKES.items():
        line = text[: text.index(keystroke_line)].count("\n")
        column = keystroke_line.index(value)
        latencies, findings, cpu_start = [], 0, None
        pid = client.lsp._server.pid
        for typed in range(warmup + rounds):
            if typed == warmup:
                cpu_start = cpu_seconds(pid)
            where = types.Range(
                start=types.Position(line=line, character=column),
                end=types.Position(line=line, character=column + len(value)),
            )
            version += 1
            value = str(10 + typed)  # every version is a text the server has never seen
            change = types.TextDocumentContentChangePartial(range=where, text=value)
            document = types.VersionedTextDocumentIdentifier(uri=uri, version=version)
            sent = time.perf_counter()
            client.lsp.text_document_did_change(
                types.DidChangeTextDocumentParams(text_document=document, content_changes=[change])
            )
            arrived, findings = await client.wait_for(version)
            if typed >= warmup:
                latencies.append(arrived - sent)
        cpu_end = cpu_seconds(pid)
        cpu = (cpu_end - cpu_start) / rounds if cpu_start is not None and cpu_end else None
        results[site] = (latencies, findings, cpu)
    await client.lsp.shutdown_async(None)
    client.lsp.exit(None)
    await client.lsp.stop()
    return results


def analysis_alone(repeat: int, cached: bool) -> list[float]:
    """`lint_text` in this process on successive edits of the config default: with a parse
    cache as the server keeps (only the changed statement parsed again), or each text whole."""
    from linter.config import Overrides, Resolver
    from linter.incremental import ParseCache
    from linter.text import lint_text

    keystroke_line, value = KEYSTROKES["config"]
    text = SCRIPT.read_text(encoding="utf-8")
    resolver = Resolver(Overrides(), cwd=REPO)
    cache = ParseCache() if cached else None
    lint_text(text, SCRIPT, resolver, cache=cache)
    times = []
    for typed in range(repeat):
        edited = text.replace(keystroke_line, keystroke_line.replace(value, str(100 + typed)))
        start = time.perf_counter()
        lint_text(edited, SCRIPT, resolver, cache=cache)
        times.append(time.perf_counter() - start)
    return times


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--in-project", action="store_true", help="type inside a project")
    parser.add_argument("--alone", action="store_true", help="ACCEL_LINT_NO_PROJECT=1")
    options = parser.parse_args()
    env = {**os.environ, "ACCEL_LINT_NO_PROJECT": "1"} if options.alone else None
    with tempfile.TemporaryDirectory() as directory:
        script = in_project(Path(directory)) if options.in_project else SCRIPT
        results = asyncio.run(measure(options.rounds, options.warmup, script, env))
    lines = SCRIPT.read_text(encoding="utf-8").count("\n")
    findings = results["config"][1]
    where = " (in a project with launch.py)" if options.in_project else ""
    alone = ", ACCEL_LINT_NO_PROJECT=1" if options.alone else ""
    shown = SCRIPT.relative_to(REPO)
    print(f"{shown}{where}{alone}: {lines} lines, {findings} diagnostics per answer")
    for site, (latencies, _, cpu) in results.items():
        print(
            f"didChange in the {site} -> publishDiagnostics ({len(latencies)} rounds after"
            f" {options.warmup} warm-up): median {statistics.median(latencies) * 1000:.1f} ms,"
            f" p90 {p90(latencies) * 1000:.1f} ms"
            + (f", server CPU per answer {cpu * 1000:.1f} ms" if cpu is not None else "")
        )
    repeat = max(10, options.rounds // 2)
    for label, cached in (("with the server's parse cache", True), ("each text whole", False)):
        alone = analysis_alone(repeat, cached)
        print(
            f"analysis alone (lint_text, {label}): median {statistics.median(alone) * 1000:.1f}"
            f" ms, p90 {p90(alone) * 1000:.1f} ms"
        )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average {load} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
