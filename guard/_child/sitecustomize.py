"""Put on PYTHONPATH by `python -m guard` so that child Python processes (torchrun workers,
`torch.multiprocessing.spawn`) run with the guard too. `import guard` is cheap: the checks are
installed only once the child imports torch. Any other `sitecustomize` on the path still runs."""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain_other_sitecustomize() -> None:
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("ACCEL_GUARD", "raise").strip().lower() != "off":
    try:
        import guard  # noqa: F401  (installs the checks when torch is imported)
    except Exception as exc:  # never break an unrelated child process
        print(f"accel-guard: not installed in child process: {exc!r}", file=sys.stderr)
_chain_other_sitecustomize()
