"""Lint time and peak memory on big generated Python files (the size limit is 2 MiB).

    python bench/big_file.py [--sizes 0.5,2] [--shapes all] [--keep DIR]

Writes one file per shape and size, each ending with a training loop (so that it passes the
prefilter and every rule runs), then times `accel-lint --no-cache --output-format concise FILE`
in a fresh process: wall seconds, CPU seconds (user + system: what the run costs on a busy
machine) and the maximum resident set size, from `/usr/bin/time -v` (from `resource.getrusage` of
the child when that tool is missing). `same` says whether the file's findings are those of the
training loop alone in a small file (codes, messages and columns, lines moved by the code before
the loop): big files are analysed through their reduced text (`linter/reduce.py`). Prints a
table; asserts nothing.

Shapes, as code generators write them:
- `pb2`: a protobuf `_pb2`-style module: descriptors built by calls, many small message classes.
- `models`: an auto-generated model zoo: many `nn.Module` classes with `__init__` and `forward`.
- `tables`: long dict and list literals (vocabularies, lookup tables, weights as numbers).
- `one_function`: one function of many statements (a traced or unrolled graph).
- `mixed`: all of the above in one module.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAINING_LOOP = """

ACCUM_STEPS = 4


def train(model, loader, optimizer, scheduler, epochs):
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(epochs):
        for step, (inputs, labels) in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            scaler.scale(loss).backward()
            if (step + 1) % ACCUM_STEPS == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                optimizer.zero_grad()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "last.pt")
"""

HEADER = '''"""Generated code. Do not edit."""

import torch
import torch.nn as nn
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf import reflection as _reflection

'''


def pb2_unit(i: int) -> str:
    return f"""
_MESSAGE{i} = _descriptor.Descriptor(
    name="Message{i}",
    full_name="generated.v1.Message{i}",
    filename=None,
    containing_type=None,
    fields=[
        _descriptor.FieldDescriptor(
            name="field_{i}_a", full_name="generated.v1.Message{i}.field_{i}_a", index=0,
            number=1, type=9, cpp_type=9, label=1, has_default_value=False, default_value=b"",
            message_type=None, enum_type=None, containing_type=None, is_extension=False,
        ),
        _descriptor.FieldDescriptor(
            name="field_{i}_b", full_name="generated.v1.Message{i}.field_{i}_b", index=1,
            number=2, type=5, cpp_type=1, label=1, has_default_value=False, default_value=0,
            message_type=None, enum_type=None, containing_type=None, is_extension=False,
        ),
    ],
    serialized_start={i * 97},
    serialized_end={i * 97 + 96},
)
Message{i} = _reflection.GeneratedProtocolMessageType(
    "Message{i}", (_message.Message,), {{"DESCRIPTOR": _MESSAGE{i}, "__module__": "gen_pb2"}}
)


class Message{i}Stub(object):
    def __init__(self, channel):
        self.channel = channel
        self.Call{i} = channel.unary_unary("/generated.v1.Service/Call{i}")

    def describe(self):
        return _MESSAGE{i}.full_name
"""


def models_unit(i: int) -> str:
    return f'''

class Block{i}(nn.Module):
    """Auto-generated block {i}."""

    def __init__(self, channels={16 + i % 48}, dropout=0.1):
        super().__init__()
        self.conv{i} = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.norm{i} = nn.BatchNorm2d(channels)
        self.act{i} = nn.ReLU(inplace=True)
        self.drop{i} = nn.Dropout(dropout)
        self.scale = {1.0 + i / 1000:.4f}

    def forward(self, x):
        residual = x
        x = self.conv{i}(x)
        x = self.norm{i}(x)
        x = self.act{i}(x)
        if self.training:
            x = self.drop{i}(x)
        return residual + x * self.scale


def build_block{i}(config):
    return Block{i}(channels=config["channels_{i}"], dropout=config.get("dropout", 0.1))
'''


def tables_unit(i: int) -> str:
    words = ", ".join(f'"tok{i}_{j}": {i * 32 + j}' for j in range(32))
    numbers = ", ".join(f"{((i * 31 + j) % 997) / 997:.6f}" for j in range(24))
    return f"VOCAB_{i} = {{{words}}}\nWEIGHTS_{i} = [{numbers}]\n"


def one_function(size: int) -> str:
    """One function of about `size` bytes."""
    lines = ["\n\ndef traced_graph(x, params):"]
    total, i = 0, 0
    while total < size:
        pair = (
            f"    v{i} = torch.matmul(x, params[{i % 64}]) + params[{(i + 1) % 64}]",
            f"    x = torch.relu(v{i}) if v{i}.mean() > 0 else torch.tanh(v{i})",
        )
        lines.extend(pair)
        total += sum(len(line) + 1 for line in pair)
        i += 1
    lines.append("    return x\n")
    return "\n".join(lines)


def generate(shape: str, size: int) -> str:
    """A module of about `size` bytes of the given shape, ending with a training loop."""
    parts = [HEADER]
    total = len(HEADER) + len(TRAINING_LOOP)
    if shape == "one_function":
        return HEADER + one_function(size - total) + TRAINING_LOOP
    makers = {"pb2": [pb2_unit], "models": [models_unit], "tables": [tables_unit]}
    makers["mixed"] = [pb2_unit, models_unit, tables_unit]
    chosen = makers[shape]
    i = 0
    while total < size:
        unit = chosen[i % len(chosen)](i)
        parts.append(unit)
        total += len(unit)
        i += 1
    return "".join(parts) + TRAINING_LOOP


def measure(path: Path) -> tuple[float, float, float, list[tuple[int, str]]]:
    """(wall seconds, CPU seconds, max RSS in MB, findings) of one `accel-lint` run; each finding
    is its line and the rest of its concise line (column, code, message)."""
    command = ["accel-lint", "--no-cache", "--output-format", "concise", str(path)]
    timer = Path("/usr/bin/time")
    start = time.perf_counter()
    if timer.exists():
        run = subprocess.run([str(timer), "-v", *command], capture_output=True, text=True)
        seconds = time.perf_counter() - start
        match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)
        rss = int(match.group(1)) / 1024 if match else float("nan")
        cpu = sum(
            float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", run.stderr)
        )
    else:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        rss = after.ru_maxrss / 1024  # the largest child so far: run one size per process
    if run.returncode not in (0, 1):
        sys.exit(f"accel-lint failed on {path}:\n{run.stdout}\n{run.stderr}")
    found = [re.match(r".*?:(\d+):(\d+: ACL.*)$", line) for line in run.stdout.splitlines()]
    return seconds, cpu, rss, [(int(m[1]), m[2]) for m in found if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0.5,2", help="sizes in MiB, comma-separated")
    parser.add_argument("--shapes", default="all", help="pb2,models,tables,one_function,mixed")
    parser.add_argument("--keep", help="write the files here (default: a temporary directory)")
    args = parser.parse_args()
    shapes = ["pb2", "models", "tables", "one_function", "mixed"]
    if args.shapes != "all":
        shapes = args.shapes.split(",")
    sizes = [float(s) for s in args.sizes.split(",")]
    folder = Path(args.keep or tempfile.mkdtemp(prefix="big_file_"))
    folder.mkdir(parents=True, exist_ok=True)
    alone = folder / "loop_alone.py"
    alone.write_text(HEADER + TRAINING_LOOP)
    expected = measure(alone)[3]
    print(
        f"{'file':<24} {'bytes':>9} {'lines':>7} {'wall s':>7} {'CPU s':>7} {'max RSS MB':>10}",
        "found same",
    )
    for shape in shapes:
        for mib in sizes:
            # Just under the limit for 2 MiB (the screen refuses more than 2 MiB).
            size = int(mib * 1024 * 1024) - 4096
            text = generate(shape, size)
            path = folder / f"{shape}_{mib:g}mb.py"
            path.write_text(text)
            seconds, cpu, rss, found = measure(path)
            lines = text.count("\n")
            moved = lines - (HEADER + TRAINING_LOOP).count("\n")
            same = [(line - moved, rest) for line, rest in found] == expected
            print(
                f"{path.name:<24} {len(text):>9} {lines:>7} {seconds:>7.1f} {cpu:>7.1f} "
                f"{rss:>10.0f} {len(found):>5} {'yes' if same else 'NO':>4}",
                flush=True,
            )
    if not args.keep:
        for path in folder.iterdir():
            os.unlink(path)
        folder.rmdir()


if __name__ == "__main__":
    main()
