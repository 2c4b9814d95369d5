"""The language server: diagnostics on open/change/save, code actions, hover, config reloads.

Linting runs on one worker thread so the connection keeps reading while a file is analysed. Per
document at most one lint is in flight: changes that arrive meanwhile are coalesced, and when the
lint ends the newest text is linted next, so a burst of keystrokes costs one stale lint at most
and no time-based delay is added to the latest one. A result is published only if the document
still holds the text it was computed from, and it carries that version: no stale diagnostics.

A document is read in its project: when another module is saved or changes on disk (a watched
file), the open documents that drew on it, or that it now imports, are linted again, their text
unchanged (`modules_changed`).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePath
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from linter import __version__
from linter.config import CONFIG_NAMES, ConfigError
from linter.server import actions
from linter.server.convert import Lines, to_lsp
from linter.server.documents import Linted, Linter, Snapshot, default_root, lintable

logger = logging.getLogger(__name__)
ACTION_KINDS = [types.CodeActionKind.QuickFix, actions.FIX_ALL_KIND]
CONFIG_GLOB = "**/{" + ",".join(CONFIG_NAMES) + "}"


class AccelLintServer(LanguageServer):
    def __init__(self):
        super().__init__("accel-lint", __version__)
        self.linter = Linter(default_root())
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="accel-lint")
        self.results: dict[str, Linted] = {}
        self._fixed: dict[str, tuple[Snapshot, str]] = {}
        self._running: dict[str, asyncio.Task] = {}
        self._stale: set[str] = set()  # documents whose running lint read a module since changed
        self._shown_errors: set[str] = set()

    # --- documents and their results ---

    def snapshot(self, uri: str) -> Snapshot | None:
        """The open document's current text, or None once it is closed or not a Python file.

        Notebook cells (`vscode-notebook-cell:` ...) are left alone: linted one by one, a loop
        that spans cells would be judged without its setup."""
        document = self.workspace.text_documents.get(unquote(uri))
        if document is None or urlparse(uri).scheme not in ("file", "untitled"):
            return None
        path = Path(to_fs_path(uri) or document.path or "untitled.py")
        if not lintable(path, document.language_id):
            return None
        return Snapshot(document.uri, document.version, document.source, path)

    def lines(self, text: str) -> Lines:
        return Lines(text, self.workspace.position_codec)

    def schedule(self, uri: str) -> None:
        """Lint the document's latest text soon (coalesced with a lint already running)."""
        if uri not in self._running:
            self._running[uri] = asyncio.ensure_future(self._lint_latest(uri))

    async def _lint_latest(self, uri: str) -> None:
        try:
            while (snapshot := self.snapshot(uri)) is not None:
                self._stale.discard(uri)
                linted = await self.lint(snapshot)
                if snapshot.same_as(self.snapshot(uri)) and uri not in self._stale:
                    if linted is not None:
                        self.results[uri] = linted
                        self.publish(linted)
                    return
        finally:
            self._running.pop(uri, None)

    def relint(self, uri: str) -> None:
        """Lint the document again though its text is the same (a module it reads changed)."""
        self.forget(uri)
        if uri in self._running:
            self._stale.add(uri)
        else:
            self.schedule(uri)

    async def modules_changed(self, paths: list[Path]) -> None:
        """Modules saved or changed on disk: the open documents that read them, or that they
        now import, are linted again (the projects re-read them on the worker, in order with
        the lints)."""
        documents = []
        for document in list(self.workspace.text_documents.values()):
            snapshot = self.snapshot(document.uri)
            if snapshot is not None:
                documents.append((document.uri, snapshot.path))
        for uri in await self._on_worker(self._readers, paths, documents):
            self.relint(uri)

    def _readers(self, paths: list[Path], documents: list[tuple[str, Path]]) -> list[str]:
        for path in paths:
            self.linter.changed(path)
        return [
            uri for uri, where in documents if any(self.linter.reads(where, path) for path in paths)
        ]

    async def lint(self, snapshot: Snapshot) -> Linted | None:
        """Lint on the worker; a config or internal error is shown, never raised."""
        try:
            return await self._on_worker(self.linter.lint, snapshot)
        except ConfigError as exc:
            self._show_once(types.MessageType.Error, f"accel-lint: {exc}")
            return Linted(snapshot, [], False)
        except Exception as exc:  # a bug in a rule must not take the editor's server down
            logger.error("lint failed: %s", "".join(traceback.format_exception(exc)))
            self._show_once(types.MessageType.Error, f"accel-lint: internal error: {exc!r}")
            return None

    async def current(self, uri: str) -> Linted | None:
        """The result for the document's current text (linting it now if needed)."""
        running = self._running.get(uri)
        if running is not None:  # the lint of the newest text is on its way: wait, not lint twice
            await asyncio.shield(running)
        snapshot = self.snapshot(uri)
        if snapshot is None:
            return None
        known = self.results.get(uri)
        if known is not None and known.snapshot.same_as(snapshot):
            return known
        return await self.lint(snapshot)

    async def fixed_text(self, linted: Linted) -> str:
        """The document with all offered fixes applied (remembered per version)."""
        uri = linted.snapshot.uri
        known = self._fixed.get(uri)
        if known is not None and known[0].same_as(linted.snapshot):
            return known[1]
        text = await self._on_worker(self.linter.fix_all, linted.snapshot, linted.unsafe_fixes)
        self._fixed[uri] = (linted.snapshot, text)
        return text

    def _on_worker(self, function, *args):
        return asyncio.get_running_loop().run_in_executor(self.worker, function, *args)

    def publish(self, linted: Linted) -> None:
        lines = self.lines(linted.snapshot.text)
        found = [to_lsp(d, lines) for d in linted.diagnostics]
        self.clear(linted.snapshot.uri, linted.snapshot.version, found)

    def clear(self, uri: str, version: int | None = None, found: list | None = None) -> None:
        params = types.PublishDiagnosticsParams(uri=uri, diagnostics=found or [], version=version)
        self.text_document_publish_diagnostics(params)

    def forget(self, uri: str) -> None:
        self.results.pop(uri, None)
        self._fixed.pop(uri, None)

    def config_changed(self) -> None:
        """A config file changed: re-read configs and lint every open document again."""
        self.linter.config_changed()
        self._shown_errors.clear()
        for document in list(self.workspace.text_documents.values()):
            self.schedule(document.uri)

    def _show_once(self, kind: types.MessageType, message: str) -> None:
        if message not in self._shown_errors:
            self._shown_errors.add(message)
            self.window_show_message(types.ShowMessageParams(type=kind, message=message))


def is_config(uri: str) -> bool:
    return PurePath(to_fs_path(uri) or uri).name in CONFIG_NAMES
