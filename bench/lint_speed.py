"""Lint speed: accel-lint against TorchFix (check only) and ruff (default rules).

Corpus: the `.py` files of the installed `diffusers` and `accelerate` packages, copied to a
temporary directory first so that no config file or .gitignore around the virtual environment
changes what any tool sees. Also times one small training script (the pre-commit case) and
`accel-lint --version`.

Setup, once (nothing is downloaded at run time; torch is not needed: only source files are linted):

    python -m venv .benchvenv
    .benchvenv/bin/pip install torchfix ruff
    .benchvenv/bin/pip install --no-deps diffusers accelerate
    .benchvenv/bin/pip install --no-deps .

accel-lint is installed as a regular (non-editable) package, as pre-commit and pip users get it:
an editable install adds its import-path finder (about 10 ms) to every start-up. After changing
the linter, reinstall before measuring:

    .benchvenv/bin/pip install -q --no-deps --force-reinstall .

Run:

    .benchvenv/bin/python bench/lint_speed.py [--torchfix-sample N] [--repeat R] [--corpus DIR]

`--corpus DIR` lints a source tree instead of the installed packages (issue 27's figure: a
`git archive` of huggingface/diffusers, 2,089 .py files); `--no-torchfix` leaves TorchFix out.

One file only (no TorchFix, ruff or corpus needed; any environment with accel-lint installed):

    python bench/lint_speed.py --one-file [--repeat 20]

times `accel-lint fixtures/tour/train.py` as pre-commit runs it, start-up included, with an empty
results cache each run (so the file is analysed; `--no-cache` would also skip the compiled code of
libcst's dataclasses kept in the user's cache directory): median CPU (user + system) and wall
seconds, and the CPU median against the 0.15 s target.

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
import resource
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


def timed(command: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, children included) of one run; output is discarded
    (exit codes mean findings, not failure). CPU time is the steadier figure on a busy machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if "Traceback" in done.stderr:
        sys.exit(f"{command[0]} crashed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def median(command: list[str], cwd: Path, repeat: int, env: dict | None = None):
    runs = [timed(command, cwd, env) for _ in range(repeat)]
    return tuple(statistics.median(run[i] for run in runs) for i in (0, 1))


def copy_corpus(python: str, packages: list[str], into: Path, tree: Path | None = None):
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", ".git")
    if tree is not None:
        shutil.copytree(tree, into / tree.name, ignore=ignore)
    for package in packages if tree is None else ():
        shutil.copytree(package_dir(python, package), into / package, ignore=ignore)
    return sorted(into.rglob("*.py"))


def measure(args: argparse.Namespace) -> dict:
    python = os.environ.get("BENCH_PYTHON", sys.executable)
    packages = os.environ.get("BENCH_PACKAGES", "diffusers accelerate").split()
    accel, ruff = (tool(n, python) for n in ("accel-lint", "ruff"))
    torchfix = tool("torchfix", python) if args.torchfix else None
    tree = Path(args.corpus).resolve() if args.corpus else None
    if tree is not None:
        packages = [str(tree)]
    work = Path(tempfile.mkdtemp(prefix="lint-speed-"))
    try:
        corpus = work / "corpus"
        files = copy_corpus(python, packages, corpus, tree)
        script = work / "train.py"
        script.write_text(TRAINING_SCRIPT)
        config = work / "accel-lint.toml"
        config.write_text("")  # defaults, whatever config lies around
        env = {**os.environ, "ACCEL_LINT_CACHE_DIR": str(work / "cache")}
        lint = [accel, "--config", str(config), "--exit-zero", "--output-format", "concise"]
        r = {"files": len(files), "packages": packages}

        r["accel_cold"] = median([*lint, "--no-cache", "corpus"], work, args.repeat, env)
        timed([*lint, "corpus"], work, env)  # fill the cache
        r["accel_warm"] = median([*lint, "corpus"], work, args.repeat, env)
        ruff_check = [ruff, "check", "--isolated", "--exit-zero", "--quiet"]
        r["ruff_cold"] = median([*ruff_check, "--no-cache", "corpus"], work, args.repeat)
        cache_dir = ["--cache-dir", str(work / "ruff-cache")]
        timed([*ruff_check, *cache_dir, "corpus"], work)
        r["ruff_warm"] = median([*ruff_check, *cache_dir, "corpus"], work, args.repeat)

        r["accel_version"] = median([accel, "--version"], work, args.repeat)
        r["accel_script"] = median([*lint, "--no-cache", "train.py"], work, args.repeat, env)
        if torchfix is None:
            return r
        r["torchfix_script"] = median([torchfix, "train.py"], work, args.repeat)

        if args.torchfix_sample and args.torchfix_sample < len(files):
            sample = random.Random(0).sample(files, args.torchfix_sample)
            measured = timed([torchfix, *map(str, sample)], work)
            r["torchfix_cold"] = tuple(
                start + max(0.0, total - start) / len(sample) * len(files)
                for start, total in zip(r["torchfix_script"], measured, strict=True)
            )
            r["torchfix_basis"] = (
                f"extrapolated from {len(sample)} random files ({measured[0]:.1f} s wall)"
            )
        else:
            r["torchfix_cold"] = timed([torchfix, "corpus"], work)
            r["torchfix_basis"] = "measured on every file"
        return r
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(r: dict) -> str:
    """Wall seconds with CPU seconds in brackets; ratios on both."""

    def show(name: str) -> str:
        wall, cpu = r[name]
        return f"{wall:.3f} s ({cpu:.3f} s cpu)"

    def ratio(a: str, b: str, target: str) -> str:
        wall, cpu = (r[a][i] / r[b][i] for i in (0, 1))
        return f"{wall:.4f}x wall, {cpu:.4f}x cpu (target {target})"

    lines = [
        f"corpus: {r['files']} .py files of {' + '.join(r['packages'])}",
        f"accel-lint cold (--no-cache): {show('accel_cold')}",
        f"accel-lint warm (cached):     {show('accel_warm')}",
        f"ruff cold:                    {show('ruff_cold')}",
        f"ruff warm:                    {show('ruff_warm')}",
        f"warm accel-lint / ruff warm:  {ratio('accel_warm', 'ruff_warm', '<= 2x')}",
        f"cold accel-lint / ruff cold:  {ratio('accel_cold', 'ruff_cold', '<= 5x')}",
        f"one training script: accel-lint {show('accel_script')}",
        f"accel-lint --version: {show('accel_version')}",
    ]
    if "torchfix_script" in r:
        lines[5:5] = [
            f"TorchFix:                     {show('torchfix_cold')}, {r['torchfix_basis']}",
            f"cold accel-lint / TorchFix:   {ratio('accel_cold', 'torchfix_cold', '<= 0.02x')}",
        ]
        lines[-1:-1] = [
            f"TorchFix one training script: {show('torchfix_script')}",
            f"one script accel-lint / TorchFix: "
            f"{ratio('accel_script', 'torchfix_script', '<= 0.5x')}",
        ]
    return "\n".join(lines)


ONE_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "tour" / "train.py"
ONE_FILE_TARGET = 0.15  # CPU seconds for one training file, start-up included (issue 27)


def one_file(repeat: int) -> str:
    """The tour script linted `repeat` times: medians, because the machine may be busy."""
    python = os.environ.get("BENCH_PYTHON", sys.executable)
    command = [tool("accel-lint", python), str(ONE_FILE)]
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for run in range(repeat):  # a new results cache each run: the file is analysed
            env = {**os.environ, "ACCEL_LINT_CACHE_DIR": os.path.join(work, str(run))}
            runs.append(timed(command, ONE_FILE.parents[2], env))
    wall, cpu = (sorted(run[i] for run in runs) for i in (0, 1))
    return (
        f"one file ({ONE_FILE.name}, {repeat} runs): "
        f"cpu median {statistics.median(cpu):.3f} s (min {cpu[0]:.3f}), "
        f"wall median {statistics.median(wall):.3f} s (min {wall[0]:.3f}); "
        f"{statistics.median(cpu) / ONE_FILE_TARGET:.2f}x the {ONE_FILE_TARGET} s cpu target"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchfix-sample", type=int, default=0, metavar="N")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    parser.add_argument("--one-file", action="store_true", help="time one training file only")
    parser.add_argument("--corpus", metavar="DIR", help="lint this tree, not the packages")
    parser.add_argument("--no-torchfix", dest="torchfix", action="store_false")
    args = parser.parse_args()
    if args.one_file:
        print(one_file(args.repeat if args.repeat != 3 else 20))
        return
    figures = measure(args)
    print(report(figures))
    if args.json:
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
