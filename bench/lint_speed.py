"""Lint speed: accel-lint against TorchFix (check only) and ruff (default rules).

Corpus: the `.py` files of the installed `diffusers` and `accelerate` packages, copied to a
temporary directory first so that no config file or .gitignore around the virtual environment
changes what any tool sees. Also times one small training script (the pre-commit case) and
`accel-lint --version`.

Setup, once (nothing is downloaded at run time; torch is not needed: only source files are linted):

    python -m venv .benchvenv
    .benchvenv/bin/pip install torchfix ruff
    .benchvenv/bin/pip install --no-deps diffusers accelerate
    .benchvenv/bin/pip install -e .

Run:

    .benchvenv/bin/python bench/lint_speed.py [--torchfix-sample N] [--repeat R]

Environment: BENCH_PYTHON (the interpreter whose environment holds the packages and the three tools;
default: the one running this script), BENCH_PACKAGES (default "diffusers accelerate"),
ACCEL_LINT / TORCHFIX / RUFF (explicit executables).

`--torchfix-sample N` times TorchFix on N random files and extrapolates to the whole corpus (its
start-up, measured on the single script, plus the per-file time times the file count); the figure is
labelled "extrapolated". Without it TorchFix runs on every file (about 0.3 s a file).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAINING_SCRIPT = """\
import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
loader = DataLoader(data, batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=100)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

for epoch in range(3):
    model.train()
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
"""


def tool(name: str, python: str) -> str:
    """The executable for `name`: $NAME, else beside BENCH_PYTHON."""
    override = os.environ.get(name.upper().replace("-", "_"))
    if override:
        return override
    candidate = Path(python).parent / name
    if not candidate.exists():
        sys.exit(f"{name} not found beside {python}; see the setup at the top of this script")
    return str(candidate)


def package_dir(python: str, package: str) -> Path:
    """Where `package` is installed, found without importing it."""
    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.find_spec({package!r}); "
        "sys.stdout.write(list(spec.submodule_search_locations)[0])"
    )
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True)
    return Path(out.stdout)


def wall(command: list[str], cwd: Path, env: dict | None = None) -> float:
    """Seconds one run takes; output is discarded (exit codes mean findings, not failure)."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if "Traceback" in done.stderr:
        sys.exit(f"{command[0]} crashed:\n{done.stderr[-3000:]}")
    return seconds


def median(command: list[str], cwd: Path, repeat: int, env: dict | None = None) -> float:
    return statistics.median(wall(command, cwd, env) for _ in range(repeat))


def copy_corpus(python: str, packages: list[str], into: Path) -> list[Path]:
    for package in packages:
        shutil.copytree(
            package_dir(python, package),
            into / package,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"),
        )
    return sorted(into.rglob("*.py"))


def measure(args: argparse.Namespace) -> dict:
    python = os.environ.get("BENCH_PYTHON", sys.executable)
    packages = os.environ.get("BENCH_PACKAGES", "diffusers accelerate").split()
    accel, torchfix, ruff = (tool(n, python) for n in ("accel-lint", "torchfix", "ruff"))
    work = Path(tempfile.mkdtemp(prefix="lint-speed-"))
    try:
        corpus = work / "corpus"
        files = copy_corpus(python, packages, corpus)
        script = work / "train.py"
        script.write_text(TRAINING_SCRIPT)
        config = work / "accel-lint.toml"
        config.write_text("")  # defaults, whatever config lies around
        env = {**os.environ, "ACCEL_LINT_CACHE_DIR": str(work / "cache")}
        lint = [accel, "--config", str(config), "--exit-zero", "--output-format", "concise"]
        r = {"files": len(files), "packages": packages}

        r["accel_cold"] = median([*lint, "--no-cache", "corpus"], work, args.repeat, env)
        wall([*lint, "corpus"], work, env)  # fill the cache
        r["accel_warm"] = median([*lint, "corpus"], work, args.repeat, env)
        ruff_check = [ruff, "check", "--isolated", "--exit-zero", "--quiet"]
        r["ruff_cold"] = median([*ruff_check, "--no-cache", "corpus"], work, args.repeat)
        cache_dir = ["--cache-dir", str(work / "ruff-cache")]
        wall([*ruff_check, *cache_dir, "corpus"], work)
        r["ruff_warm"] = median([*ruff_check, *cache_dir, "corpus"], work, args.repeat)

        r["accel_version"] = median([accel, "--version"], work, args.repeat)
        r["accel_script"] = median([*lint, "--no-cache", "train.py"], work, args.repeat, env)
        r["torchfix_script"] = median([torchfix, "train.py"], work, args.repeat)

        if args.torchfix_sample and args.torchfix_sample < len(files):
            sample = random.Random(0).sample(files, args.torchfix_sample)
            seconds = wall([torchfix, *map(str, sample)], work)
            per_file = max(0.0, seconds - r["torchfix_script"]) / len(sample)
            r["torchfix_cold"] = r["torchfix_script"] + per_file * len(files)
            r["torchfix_basis"] = f"extrapolated from {len(sample)} random files ({seconds:.1f} s)"
        else:
            r["torchfix_cold"] = wall([torchfix, "corpus"], work)
            r["torchfix_basis"] = "measured on every file"
        return r
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(r: dict) -> str:
    return "\n".join(
        [
            f"corpus: {r['files']} .py files of {' + '.join(r['packages'])}",
            f"accel-lint cold (--no-cache): {r['accel_cold']:.2f} s",
            f"accel-lint warm (cached):     {r['accel_warm']:.2f} s",
            f"ruff cold / warm:             {r['ruff_cold']:.2f} s / {r['ruff_warm']:.2f} s",
            f"TorchFix:                     {r['torchfix_cold']:.1f} s ({r['torchfix_basis']})",
            f"ratio cold accel-lint/TorchFix: {r['accel_cold'] / r['torchfix_cold']:.4f}x"
            " (target <= 0.02x)",
            f"ratio warm accel-lint/ruff warm: {r['accel_warm'] / r['ruff_warm']:.2f}x"
            " (target <= 2x)",
            f"ratio cold accel-lint/ruff cold: {r['accel_cold'] / r['ruff_cold']:.2f}x",
            f"one training script: accel-lint {r['accel_script']:.3f} s, "
            f"TorchFix {r['torchfix_script']:.3f} s, ratio "
            f"{r['accel_script'] / r['torchfix_script']:.2f}x (target <= 0.5x)",
            f"accel-lint --version: {r['accel_version']:.3f} s",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchfix-sample", type=int, default=0, metavar="N")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    args = parser.parse_args()
    figures = measure(args)
    print(report(figures))
    if args.json:
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
