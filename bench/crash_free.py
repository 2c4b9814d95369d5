"""Crash-free over large real code: lint every file with every rule, then `--fix --unsafe-fixes` a
copy twice, and count what must be zero.

    python bench/crash_free.py [ROOT ...] [--every-file] [--json OUT]

Default roots: the installed torch, accelerate, transformers, diffusers, timm and (pytorch-)
lightning packages, looked up in this interpreter and in the repository's `.venv` and
`.benchvenv`, plus the public training scripts under `$ACCEL_LINT_CORPUS` (default
`/work/corpus`) when that directory exists. Every `.py` file and notebook is copied (only those,
so no config or .gitignore around them applies) and linted as a user runs it: one directory walk,
where the prefilter skips files that cannot hold a finding. `--every-file` names each file on the
command line instead, so every file is parsed and analysed (much slower). The two `--fix` passes
name the files the check found a fix for (`--fix` never writes any other file).

Prints: files, files past the prefilter, findings per code, files not analysed (ACL000: syntax,
encoding, too large or too deep), internal errors (must be 0: a crash in a rule, the model or the
fixer, or a fix that produced invalid syntax), fixed files that no longer compile (must be 0),
files a second `--fix` changes again (must be 0), wall time per pass and the peak memory of one
linter process. Exit 1 when a must-be-0 figure is not. The linter runs as a subprocess
(`python -m linter.cli`), as users run it.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from linter.runner import PREFILTER  # noqa: E402

PACKAGES = (
    "torch", "accelerate", "transformers", "diffusers", "timm",
    "lightning", "pytorch_lightning", "lightning_fabric",
)  # fmt: skip
ENVIRONMENTS = (".venv", ".benchvenv")
SUFFIXES = (".py", ".ipynb")
MUST_BE_ZERO = ("internal_errors", "fixed_not_compiling", "changed_by_second_fix")
BATCH = 400  # named files per linter run with --every-file (argv stays far below ARG_MAX)


def _site_packages() -> list[Path]:
    found = [Path(p) for p in sys.path if p.endswith("site-packages")]
    for env in ENVIRONMENTS:
        found += [Path(p) for p in glob.glob(str(REPO / env / "lib" / "python*" / "site-packages"))]
    unique = []
    for path in found:
        if path.is_dir() and path.resolve() not in {p.resolve() for p in unique}:
            unique.append(path)
    return unique


def default_roots() -> list[Path]:
    """Each package once (the first environment that has it), then the corpus if present."""
    roots = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.append(Path(next(iter(spec.submodule_search_locations))))
            continue
        for site in _site_packages():
            if (site / name / "__init__.py").is_file():
                roots.append(site / name)
                break
    corpus = Path(os.environ.get("ACCEL_LINT_CORPUS", "/work/corpus"))
    if corpus.is_dir():
        roots.append(corpus)
    return roots


def copy_sources(roots: list[Path], into: Path) -> list[Path]:
    """Copy the .py files and notebooks of each root (symbolic links are not followed)."""
    copied = []
    for index, root in enumerate(roots):
        files = [root] if root.is_file() else _sources_under(root)
        for path in files:
            relative = path.name if root.is_file() else path.relative_to(root)
            target = into / f"{index}-{root.name}" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            copied.append(target)
    return copied


def _sources_under(root: Path) -> list[Path]:
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            if name.endswith(SUFFIXES) and path.is_file() and not path.is_symlink():
                found.append(path)
    return sorted(found)


def accel_lint(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "linter.cli", *args, "--no-cache", "--exit-zero"]
    return subprocess.run(
        command, capture_output=True, text=True, check=False, cwd=REPO, timeout=timeout
    )


def lint_pass(workdir: Path, files: list[Path], every_file: bool, *args: str) -> dict:
    """One linter pass (a walk, or batches of named files): its stdout pieces, stderr, wall."""
    started = time.perf_counter()
    targets = [[str(f) for f in files[i : i + BATCH]] for i in range(0, len(files), BATCH)]
    runs = (
        [accel_lint(*batch, *args) for batch in targets]
        if every_file
        else [accel_lint(str(workdir), *args)]
    )
    return {
        "stdout": [r.stdout for r in runs],
        "stderr": "".join(r.stderr for r in runs),
        "returncodes": sorted({r.returncode for r in runs}),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def digests(files: list[Path]) -> dict[Path, str]:
    return {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def internal_errors(stderr: str) -> list[str]:
    """Per-file errors that are the linter's fault (not the file's, not the file system's)."""
    markers = ("internal error", "a fix produced invalid syntax", "Traceback")
    return [line for line in stderr.splitlines() if any(m in line for m in markers)]


def compiling_units(path: Path) -> set[str]:
    """What of a file compiles: the file itself, or a notebook's code cells (magics aside)."""
    warnings.simplefilter("ignore", SyntaxWarning)  # old code's `is not ""`: not our concern
    data = path.read_bytes()
    if path.suffix != ".ipynb":
        return {"file"} if _compiles(data, path) else set()
    try:
        cells = json.loads(data).get("cells", [])
    except (ValueError, AttributeError):
        return set()
    units = set()
    for index, cell in enumerate(cells):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        if _compiles(text, path):
            units.add(f"cell {index}")
    return units


def _compiles(source: bytes | str, path: Path) -> bool:
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _findings(stdouts: list[str]) -> list[dict]:
    return [f for out in stdouts for f in json.loads(out or "[]")]


def _fixable(findings: list[dict]) -> list[Path]:
    """Files with at least one fix `--fix --unsafe-fixes` applies: the only ones it can change."""
    return sorted({Path(f["filename"]) for f in findings if f.get("fix") and f["fix"]["edits"]})


def measure(roots: list[Path], every_file: bool = False) -> dict:
    """Check every file (a walk, as users run it), then fix twice the files that have a fix:
    a file with none is never written, so the fix passes skip re-analysing the rest."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="crash-free-") as tmp:
        workdir = Path(tmp)
        files = copy_sources(roots, workdir)
        prefiltered = sum(1 for f in files if PREFILTER.search(f.read_bytes()))
        check = lint_pass(workdir, files, every_file, "--output-format", "json")
        findings = _findings(check["stdout"])
        fixable = [f for f in _fixable(findings) if f.is_file()]
        units_before = {f: compiling_units(f) for f in fixable}
        before = digests(files)
        fix_args = ("--fix", "--unsafe-fixes", "--output-format", "concise")
        fix = lint_pass(workdir, fixable, True, *fix_args) if fixable else _NO_PASS
        after = digests(files)
        changed = [f for f in files if before[f] != after[f]]
        refix = lint_pass(workdir, changed, True, *fix_args) if changed else _NO_PASS
        again = [f for f, digest in digests(files).items() if digest != after[f]]
        broken = [
            f"{f.relative_to(workdir)} ({', '.join(sorted(lost))})"
            for f in changed
            if (lost := units_before.get(f, set()) - compiling_units(f))
        ]
        stderr = check["stderr"] + fix["stderr"] + refix["stderr"]
        other_errors = [
            line
            for line in stderr.splitlines()
            if line.startswith("error:") and not internal_errors(line)
        ]
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    codes = Counter(f["code"] for f in findings)
    return {
        "files": len(files),
        "notebooks": sum(1 for f in files if f.suffix == ".ipynb"),
        "past_prefilter": len(files) if every_file else prefiltered,
        "findings": sum(n for code, n in codes.items() if code != "ACL000"),
        "findings_by_code": dict(sorted(codes.items())),
        "not_analysed_ACL000": [
            f"{Path(f['filename']).relative_to(workdir)}: {f['message']}"
            for f in findings
            if f["code"] == "ACL000"
        ],
        "internal_errors": internal_errors(stderr),
        "other_file_errors": other_errors,
        "files_with_fixes": len(fixable),
        "fixed_files": len(changed),
        "fixed_not_compiling": broken,
        "changed_by_second_fix": [str(p.relative_to(workdir)) for p in again],
        "wall_s": {
            "check": check["wall_s"],
            "fix": fix["wall_s"],
            "second_fix": refix["wall_s"],
            "total": round(time.perf_counter() - started, 1),
        },
        "peak_rss_mib": round(peak_kib / 1024, 1),
    }


_NO_PASS = {"stdout": [], "stderr": "", "returncodes": [], "wall_s": 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="*", type=Path)
    parser.add_argument("--every-file", action="store_true", help="bypass the prefilter")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    roots = args.roots or default_roots()
    result = measure(roots, args.every_file)
    print("roots:", ", ".join(str(r) for r in roots))
    for key, value in result.items():
        shown = len(value) if isinstance(value, list) else value
        print(f"{key}: {shown}")
    for key in (*MUST_BE_ZERO, "other_file_errors", "not_analysed_ACL000"):
        for item in result[key][:20]:
            print(f"  {key}: {item}")
    if args.json:
        args.json.write_text(json.dumps({"roots": [str(r) for r in roots], **result}, indent=1))
    return 1 if any(result[k] for k in MUST_BE_ZERO) else 0


if __name__ == "__main__":
    sys.exit(main())
