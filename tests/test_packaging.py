"""The install paths the README documents, as a new user takes them: a wheel and an sdist built
from the checkout, installed into a clean venv; the console script, a lint without torch, and the
README's pre-commit configuration in a real `pre-commit run` in a scratch repository.

Offline: the build uses the test venv's setuptools (`--no-isolation`), and the clean venv gets
the package with `--no-deps`, its dependencies from the test venv through a `.pth` line (after
its own site-packages, so its `linter` is the installed one, never the checkout's)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BAD = """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for x, y in dl:
    with accelerator.accumulate(model):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
"""
FIXED = BAD.replace("loss.backward()", "accelerator.backward(loss)")
AMP_WITH_HINT = """\
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    sched.step()
"""


def _run(args, cwd, env=None, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The wheel and the sdist, built from a copy of the files git tracks or would (the
    checkout is left as it is: setuptools writes build/ and egg-info next to the sources)."""
    pytest.importorskip("build")
    source = tmp_path_factory.mktemp("source")
    listed = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    tracked = _run(listed, ROOT).stdout.split("\0")
    for name in filter(None, tracked):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, target)
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), "."], source)
    return {"wheel": next(out.glob("*.whl")), "sdist": next(out.glob("*.tar.gz"))}


def _clean_venv(where: Path, dist: Path) -> Path:
    """A new venv holding only `dist` (no deps); returns its bin folder."""
    venv.EnvBuilder(with_pip=False).create(where)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(where), "platbase": str(where)}))
    (purelib / "zz_test_venv_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    python = where / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "--no-deps", "--no-build-isolation", "-q", str(dist)], where)
    return where / "bin"


def _without_torch(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import torch` fails: the linter must never need it."""
    blocker = tmp_path / "no_torch" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('the linter imported torch')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(blocker.parent)
    return env


def test_the_wheel_holds_the_packages_and_declares_torch_only_for_the_guard(dists):
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert {name.split("/")[0] for name in names} >= {"linter", "rules", "guard"}
    assert not any(name.startswith(("tests/", "fixtures/", "bench/")) for name in names)
    torch_lines = [line for line in metadata.splitlines() if "Requires-Dist: torch" in line]
    assert torch_lines and all("extra ==" in line for line in torch_lines)
    assert 'Requires-Dist: torch>=2.4; extra == "guard"' in torch_lines


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_package_lints_without_torch(dists, kind, tmp_path):
    bin_dir = _clean_venv(tmp_path / "venv", dists[kind])
    env = _without_torch(tmp_path)
    version = _run([str(bin_dir / "accel-lint"), "--version"], tmp_path, env)
    assert version.stdout.strip() == "accel-lint 0.1.0"
    where = _run([str(bin_dir / "python"), "-c", "import linter; print(linter.__file__)"], tmp_path)
    assert str(tmp_path / "venv") in where.stdout  # the installed copy, not the checkout
    (tmp_path / "train.py").write_text(BAD)
    lint = _run(
        [str(bin_dir / "accel-lint"), "--no-cache", "--output-format", "concise", "train.py"],
        tmp_path,
        env,
        check=False,
    )
    assert lint.returncode == 1, lint.stderr
    assert lint.stdout.startswith("train.py:8:9: ACL101 [*]")


def _readme_precommit_config() -> str:
    """The `.pre-commit-config.yaml` the README gives for a clone (its `repo: local` block)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    return next(block for block in blocks if "repo: local" in block)


def test_the_readmes_precommit_setup_runs_from_the_installed_wheel(dists, tmp_path):
    pytest.importorskip("pre_commit")
    bin_dir = _clean_venv(tmp_path / "venv", dists["wheel"])
    repo = tmp_path / "project"
    repo.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"  # the activated venv holding the wheel
    env["PRE_COMMIT_HOME"] = str(tmp_path / "pre-commit-home")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    _run(["git", "init", "-q"], repo, env)
    (repo / ".pre-commit-config.yaml").write_text(_readme_precommit_config())
    _run([sys.executable, "-m", "pre_commit", "install"], repo, env)
    (repo / "train.py").write_text(BAD)
    _run(["git", "add", "."], repo, env)
    blocked = _run([*git, "commit", "-m", "bad"], repo, env, check=False)
    assert blocked.returncode == 1  # the hook fixed the file: the commit is refused
    assert "files were modified by this hook" in blocked.stdout + blocked.stderr
    assert (repo / "train.py").read_text() == FIXED
    _run(["git", "add", "."], repo, env)
    _run([*git, "commit", "-q", "-m", "fixed"], repo, env)
    (repo / "amp.py").write_text(AMP_WITH_HINT)  # a hint only: never blocks a commit
    _run(["git", "add", "."], repo, env)
    _run([*git, "commit", "-q", "-m", "amp recipe"], repo, env)
    assert _run(["git", "log", "--oneline"], repo, env).stdout.count("\n") == 2
