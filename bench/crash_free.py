"""Crash-free over large real code: lint every file with every rule, then `--fix --unsafe-fixes` a
copy twice, and count what must be zero.

    python bench/crash_free.py [ROOT ...]      # default: the installed torch, accelerate and
                                               # (when installed) transformers, diffusers, timm,
                                               # lightning packages

Prints: files, files parsed (the rest the prefilter rules out), findings per code, internal
errors (must be 0), fixed files that no longer compile (must be 0), files a second `--fix` changes
again (must be 0), wall time and the peak memory of the linter's processes. Exit 1 when a must-be-0
figure is not. The linter runs as a subprocess (`python -m linter.cli`), as users run it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

PACKAGES = ("torch", "accelerate", "transformers", "diffusers", "timm", "lightning")


def default_roots() -> list[Path]:
    roots = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.append(Path(next(iter(spec.submodule_search_locations))))
    return roots


def copy_sources(roots: list[Path], into: Path) -> list[Path]:
    """Copy the .py files (only) of each root, so no config or .gitignore around them applies."""
    copied = []
    for index, root in enumerate(roots):
        files = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in files:
            relative = path.name if root.is_file() else path.relative_to(root)
            target = into / f"{index}-{root.name}" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            copied.append(target)
    return copied


def accel_lint(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "linter.cli", *args, "--no-cache", "--exit-zero"]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def digests(files: list[Path]) -> dict[Path, str]:
    return {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def internal_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "internal error" in line]


def does_not_compile(files: list[Path]) -> list[Path]:
    warnings.simplefilter("ignore", SyntaxWarning)  # old code's `is not ""`: not our concern
    broken = []
    for path in files:
        try:
            compile(path.read_bytes(), str(path), "exec")
        except (SyntaxError, ValueError):
            broken.append(path)
    return broken


def measure(roots: list[Path]) -> dict:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        files = copy_sources(roots, workdir)
        compiled_before = set(files) - set(does_not_compile(files))
        check = accel_lint(str(workdir), "--output-format", "json")
        findings = json.loads(check.stdout or "[]")
        before = digests(files)
        fix = accel_lint(str(workdir), "--fix", "--unsafe-fixes", "--output-format", "concise")
        after = digests(files)
        changed = [f for f in files if before[f] != after[f]]
        refix = accel_lint(str(workdir), "--fix", "--unsafe-fixes", "--output-format", "concise")
        again = [f for f in files if digests([f])[f] != after[f]]
        broken = [f for f in does_not_compile(changed) if f in compiled_before]
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {
        "files": len(files),
        "findings": dict(Counter(f["code"] for f in findings)),
        "internal_errors": internal_errors(check.stderr + fix.stderr + refix.stderr),
        "fixed_files": len(changed),
        "fixed_not_compiling": [str(p.relative_to(workdir)) for p in broken],
        "changed_by_second_fix": [str(p.relative_to(workdir)) for p in again],
        "wall_s": round(time.perf_counter() - started, 1),
        "peak_rss_mib": round(peak_kib / 1024, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="*", type=Path)
    args = parser.parse_args()
    roots = args.roots or default_roots()
    result = measure(roots)
    print("roots:", ", ".join(str(r) for r in roots))
    for key, value in result.items():
        shown = len(value) if isinstance(value, list) else value
        print(f"{key}: {shown}")
    for key in ("internal_errors", "fixed_not_compiling", "changed_by_second_fix"):
        for item in result[key][:20]:
            print(f"  {key}: {item}")
    must_be_zero = ("internal_errors", "fixed_not_compiling", "changed_by_second_fix")
    bad = any(result[k] for k in must_be_zero)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
