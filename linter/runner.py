"""Lint many files: cache look-up, prefilter, analysis, `# noqa`, fixes; a process pool if many.

The prefilter is one compiled regex over the raw bytes: a file mentioning none of the words below
cannot violate any rule, so it is never decoded or parsed. Workers receive the file's bytes and
return plain values; the main process owns the cache and all printing.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from linter.config import Settings
from linter.reporting import file_error, shown_path, unified_diff
from linter.source import FileChanged, SourceError, decode, read_bytes, write_atomic
from linter.types import Diagnostic

if TYPE_CHECKING:
    from linter.cache import Cache

# "backward" only as a call: prose such as "backward compatible" fills half the files of a library.
# `(cuda|cpu).amp` and `custom_fwd/bwd` for ACL203 (a model file with only `@custom_fwd`), and
# `weight_decay` on a line that names an accumulation value for ACL311 (an optimizer factory),
# `DistributedSampler` for ACL404 (a main that hands the loader to an imported train_one_epoch).
PREFILTER = re.compile(
    rb"backward\s*\(|autocast|GradScaler|clip_grad|Accelerator|no_sync|zero_grad|gradient_accumulation"
    rb"|(?:cuda|cpu)(?:\.| import )amp|custom_[fb]wd|weight_decay[^\n]*acc|DistributedSampler"
)
POOL_THRESHOLD = 32  # files to analyse before a process pool pays for its start-up
FixMode = Literal["none", "write", "diff"]


@dataclass(frozen=True)
class Job:
    shown: str  # the path as the user sees it (relative when under the working directory)
    absolute: str
    data: bytes
    codes: frozenset[str]
    mode: FixMode
    unsafe: bool
    hints: bool = False  # report hint-level findings (off by default)


@dataclass
class FileResult:
    shown: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    fixed: int = 0
    diff: str = ""
    error: str | None = None  # an internal error: reported with the file name, exit 2
    cacheable: bool = True
    deps: list = field(default_factory=list)  # project modules read: (path, summary key)
    notes: list = field(default_factory=list)  # the project's (a module it could not read)


@dataclass
class Report:
    results: list[FileResult] = field(default_factory=list)
    files_checked: int = 0

    @property
    def diagnostics(self) -> list[Diagnostic]:
        found = [d for r in self.results for d in r.diagnostics]
        return sorted(found, key=lambda d: (d.path, d.start, d.code))

    @property
    def fixed(self) -> int:
        return sum(r.fixed for r in self.results)

    @property
    def errors(self) -> list[tuple[str, str]]:
        return [(r.shown, r.error) for r in self.results if r.error]

    @property
    def diffs(self) -> list[str]:
        return [r.diff for r in sorted(self.results, key=lambda r: r.shown) if r.diff]


@dataclass
class _Pending:
    """A file that must be analysed, with what its cache entry will need."""

    job: Job
    stat: os.stat_result | None
    digest: str
    key: str


def run(
    files: Iterable[tuple[Path, Settings]],
    mode: FixMode = "none",
    cache: Cache | None = None,
    named: frozenset[str] = frozenset(),
) -> Report:
    """Lint `files` (each with its settings) and return every file's result.

    `named` holds the absolute paths the user named: those are always analysed, a syntax error
    in one of them included, even where the prefilter would skip the file in a directory walk."""
    report = Report()
    pending: list[_Pending] = []
    for path, settings in files:
        report.files_checked += 1
        planned = _plan(path, settings, mode, cache, os.path.abspath(path) in named)
        if isinstance(planned, FileResult):
            report.results.append(planned)
        else:
            pending.append(planned)
    try:
        results = _execute([p.job for p in pending])
    except KeyboardInterrupt:  # files are replaced atomically: none is left half-written
        message = "interrupted"
        if mode == "write":
            message += ": every file holds either its old text or its fixed text"
        sys.stderr.write(f"error: {message}\n")
        raise
    for item, result in zip(pending, results, strict=True):
        report.results.append(result)
        if cache and item.stat and result.cacheable:
            _remember(cache, item, result)
    report.results.sort(key=lambda r: r.shown)
    return report


def _plan(
    path: Path, settings: Settings, mode: FixMode, cache, named: bool = False
) -> FileResult | _Pending:
    """A file's result when the cache or the prefilter already knows it, else its job."""
    shown, absolute = shown_path(path), os.path.abspath(path)
    codes = settings.codes_for(path)
    if cache:  # the cache module (hashlib, json) is loaded only by runs that use it
        from linter import cache as cache_mod
        from linter import project

        key = cache_mod.codes_key(codes, settings.hints, project.current() is not None)
    else:
        key = ""
    try:
        stat = os.stat(absolute)
    except OSError:
        stat = None
    # A named file is read even when unchanged: the prefilter's cached "nothing" skipped its syntax.
    cached = cache.by_stat(absolute, stat, key, shown) if cache and stat and not named else None
    if cached is not None and not _needs_fixing(cached, mode, settings.unsafe_fixes):
        return FileResult(shown, cached)
    try:
        data = read_bytes(absolute)
    except SourceError as exc:
        return FileResult(shown, [file_error(shown, str(exc))], cacheable=False)
    # The prefilter is for directory walks: a file the user names is always analysed (an
    # evaluation script with no backward can still hold ACL502, ACL403 ...).
    if not codes or (not named and not PREFILTER.search(data)):
        if cache and stat:
            cache.store(absolute, stat, "", cache_mod.ANY_CODES, [])
        return FileResult(shown)
    digest = cache_mod.digest(data) if cache else ""
    cached = cache.by_content(absolute, digest, key, shown) if cache and stat else None
    if cached is not None and not _needs_fixing(cached, mode, settings.unsafe_fixes):
        cache.store(absolute, stat, digest, key, cached, cache.deps_of(absolute))  # new mtime
        return FileResult(shown, cached)
    job = Job(shown, absolute, data, codes, mode, settings.unsafe_fixes, settings.hints)
    return _Pending(job, stat, digest, key)


def _needs_fixing(diagnostics: list[Diagnostic], mode: FixMode, unsafe: bool) -> bool:
    if mode == "none":  # a plain check never loads the fixer
        return False
    from linter import fixer

    return any(fixer.applicable(d, unsafe) for d in diagnostics)


def _remember(cache, item: _Pending, result: FileResult) -> None:
    job, stat, digest = item.job, item.stat, item.digest
    if result.fixed and job.mode == "write":
        from linter import cache as cache_mod

        stat = os.stat(job.absolute)  # the file now holds the fixed text
        digest = cache_mod.digest(read_bytes(job.absolute))
    elif result.fixed:
        return  # --diff: the remaining diagnostics are those of text that was not written
    cache.store(job.absolute, stat, digest, item.key, result.diagnostics, result.deps)


def _execute(jobs: list[Job]) -> list[FileResult]:
    if len(jobs) <= POOL_THRESHOLD:
        return [lint_job(job) for job in jobs]
    import multiprocessing

    from linter.analysis import load

    load()  # libcst, the model and the rules: imported once here, inherited by forked workers
    from linter import project

    if project.current() is not None:
        project.current().prepare()  # the importer index, built once for every worker

    workers = min(os.cpu_count() or 1, max(1, len(jobs) // 8))
    method = "fork" if sys.platform == "linux" else None
    context = multiprocessing.get_context(method)
    # Largest first, one file at a time: a file's cost grows with its size, and the run ends
    # when the last worker does, so the big files must not share a chunk or come last.
    order = sorted(range(len(jobs)), key=lambda i: len(jobs[i].data), reverse=True)
    results: list[FileResult | None] = [None] * len(jobs)
    pool = context.Pool(workers, initializer=_leave_interrupts_to_the_parent)
    try:
        done = pool.imap(lint_job, [jobs[i] for i in order])
        for index, result in zip(order, done, strict=True):
            results[index] = result
    except BaseException:
        # Ctrl-C: the workers ignore it, so none dies holding the pool's queue (which hung
        # the run); terminated, each finishes the file it is writing (`source._signals_held`)
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()
    return results


def _leave_interrupts_to_the_parent() -> None:
    """A pool worker's start: a terminal's Ctrl-C reaches the whole process group, and the
    parent alone stops the run."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def lint_job(job: Job) -> FileResult:
    """Analyse (and maybe fix) one file. Never raises: failures become diagnostics or errors."""
    from linter.screen import unanalysable
    from linter.text import check_source

    if job.absolute.endswith(".ipynb"):
        return _guarded(job, _lint_notebook)
    try:
        source = decode(job.data)
    except SourceError as exc:
        return FileResult(job.shown, [file_error(job.shown, str(exc), exc.line)])

    def lint(job: Job) -> FileResult:
        problem = unanalysable(source.text, len(job.data), job.shown)
        if problem is not None:  # libcst would take minutes on it, or overflow its stack
            return FileResult(job.shown, [file_error(job.shown, *problem)])
        fix = "none" if job.mode == "none" else "unsafe" if job.unsafe else "safe"
        checked = check_source(
            source.text, job.shown, job.codes, fix, source.newline, hints=job.hints
        )
        result = FileResult(job.shown, checked.diagnostics, checked.fixes_applied)
        result.deps, result.notes = _project_deps(job.absolute), _project_notes()
        result.error = checked.error
        result.cacheable = checked.error is None  # a fix error is reported again on every run
        if checked.fixed is not None and checked.fixed != source.text:
            new_data = source.encode(checked.fixed)
            if job.mode == "write":
                if not _write(job.absolute, new_data, result, expected=job.data):
                    result.fixed = 0  # the file still holds the unfixed text and its findings
                    unfixed = check_source(source.text, job.shown, job.codes, hints=job.hints)
                    result.diagnostics = unfixed.diagnostics
            else:
                result.diff = unified_diff(job.shown, source.text, checked.fixed)
        return result

    return _guarded(job, lint)


def _lint_notebook(job: Job) -> FileResult:
    """A notebook's job: read, lint, and write or diff the changed cells."""
    from linter import notebooks

    try:
        text = job.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        error = notebooks.NotebookError(f"not UTF-8 ({exc.reason} at byte {exc.start})")
        return FileResult(job.shown, [notebooks.notebook_error(job.shown, error)])
    fix = "none" if job.mode == "none" else "unsafe" if job.unsafe else "safe"
    checked = notebooks.lint_notebook_text(text, job.shown, job.codes, fix, job.hints)
    result = FileResult(job.shown, checked.diagnostics, checked.fixes_applied)
    result.error = checked.error
    result.cacheable = checked.error is None
    if checked.fixed is not None and checked.fixed != text:
        if job.mode == "write":
            if not _write(job.absolute, checked.fixed.encode("utf-8"), result, expected=job.data):
                result.fixed = 0  # the notebook still holds the unfixed cells and their findings
                unfixed = notebooks.lint_notebook_text(text, job.shown, job.codes, hints=job.hints)
                result.diagnostics = unfixed.diagnostics
        else:
            result.diff = notebooks.cell_diff(job.shown, text, checked.fixed)
    return result


def _project_deps(path: str) -> list:
    from linter import project

    current = project.current()
    return list(current.used.get(path, ())) if current is not None else []


def _project_notes() -> list[str]:
    from linter import project

    current = project.current()
    if current is None or not current.notes:
        return []
    notes, current.notes = current.notes, []
    return notes


def _guarded(job: Job, lint) -> FileResult:
    """`lint(job)`, with a bug in a rule or the fixer made an error for this file only."""
    try:
        return lint(job)
    except RecursionError:  # nesting under the screen's limit that a visitor still cannot walk
        problem = "too deeply nested to analyse: the analysis ran out of recursion depth"
        return FileResult(job.shown, [file_error(job.shown, problem)], cacheable=False)
    except Exception as exc:  # a bug in a rule or the fixer must not stop the other files
        import traceback

        detail = "".join(traceback.format_exception_only(exc)).strip()
        if os.environ.get("ACCEL_LINT_DEBUG"):
            detail = "".join(traceback.format_exception(exc))
        return FileResult(job.shown, error=f"internal error: {detail}", cacheable=False)


def _write(path: str, data: bytes, result: FileResult, expected: bytes | None = None) -> bool:
    """Write the fixed file unless it no longer holds `expected` (the bytes that were read); a
    failure is an error for this file, not a crash of the run. Returns whether it was written."""
    try:
        write_atomic(path, data, expected=expected)
    except FileChanged:
        result.error = "not fixed: the file changed on disk while it was being checked; run again"
    except OSError as exc:
        result.error = f"cannot write fixes: {exc.strerror or exc}"
    else:
        return True
    result.cacheable = False
    return False
