"""Run a training script with the guard's runtime checks installed.

    python -m guard train.py [ARGS ...]          # unmodified script, checks installed first
    python -m guard -m package.train [ARGS ...]  # same for a module
    python -m guard --explain ACL102             # the catalogue text shared with accel-lint

Modes (environment): ACCEL_GUARD=raise (default: errors raise `guard.GuardError` with `.code`,
printed as `train.py:29: ACL305 ...` and a `help:` line, with a traceback that ends at the
script's line; exit status 1; warnings warn), ACCEL_GUARD=warn (nothing raises; each finding is
printed once as `train.py:29: ACL305 ...` and a summary grouped by code, with counts, first
steps and one line per location, is printed at exit), ACCEL_GUARD=off. ACCEL_GUARD_DEBUG=1
keeps the guard's own frames in tracebacks.
ACCEL_GUARD_REPORT=run.html writes the run report at exit (configuration, findings and their
docs, timelines per optimizer step); run.json the same as JSON, shared by all processes.
Check options: ACCEL_GUARD_TOKEN_BIAS=0.25, ACCEL_GUARD_OVERFLOW_STREAK=20,
ACCEL_GUARD_NONFINITE_POLICY=raise|skip, ACCEL_GUARD_ANOMALY=0|1 (or `guard.configure(...)`).

Distributed launchers: the guard goes between the launcher and the script, and every worker
process installs it (a `sitecustomize` on PYTHONPATH covers processes the script spawns itself,
such as `torch.multiprocessing.spawn` children):

    torchrun --nproc-per-node 2 -m guard train.py [ARGS ...]
    accelerate launch -m guard train.py [ARGS ...]

Inside a script, `import guard` at the top does the same for that process, and
`guard.configure(mode=..., select=[...], ignore=[...])` adjusts it from code.
"""

from __future__ import annotations

import sys

USAGE = "usage: python -m guard [-m MODULE | SCRIPT | --explain CODE] [ARGS ...]"


def main(argv: list[str]) -> int:
    """The exit status; a closed output pipe (`| head`) ends the command quietly, as it should."""
    try:
        return _main(argv)
    except BrokenPipeError:
        _silence_stdout()
        return 1


def _silence_stdout() -> None:
    """Python flushes stdout again at exit: point it at devnull so that flush cannot fail."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__ if argv else USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--explain":
        return _explain(argv[1:])
    from guard._main import print_error, run_script
    from guard._report import GuardError

    if argv[0] == "-m" and len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    problem = _cannot_run(argv)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1 if argv[0] == "-m" else 2
    try:
        if argv[0] == "-m":
            run_script(argv[1], argv[2:], module=True)
        else:
            run_script(argv[0], argv[1:])
    except GuardError as error:
        print_error(error)
        return 1
    return 0


def _cannot_run(argv: list[str]) -> str | None:
    """Python's own message when the script or module does not exist (exit 2 or 1, as
    `python missing.py` and `python -m missing` do), instead of a traceback through the guard."""
    import os

    if argv[0] != "-m":
        path = argv[0]
        if os.path.isfile(path) or os.path.isdir(path):
            return None
        return (
            f"{_program()}: can't open file {os.path.abspath(path)!r}: "
            "[Errno 2] No such file or directory"
        )
    import importlib.util

    try:
        found = importlib.util.find_spec(argv[1])
    except (ImportError, ValueError):
        found = None
    return None if found is not None else f"{_program()}: No module named {argv[1]}"


def _program() -> str:
    """The interpreter as the user typed it (`python`), as Python names itself in errors."""
    return (getattr(sys, "orig_argv", None) or [sys.executable])[0]


def _explain(codes: list[str]) -> int:
    from rules import ALL_RULES

    for code in codes:
        rule = ALL_RULES.get(code.upper())
        if rule is None:
            print(f"unknown code {code!r}", file=sys.stderr)
            return 2
        print(f"{rule.code} ({rule.name}): {rule.summary}\n\n{rule.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
