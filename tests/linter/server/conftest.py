"""A real LSP client session with `accel-lint server` over stdio (pygls's LanguageClient).

The tests drive the server exactly as an editor does: they start it as a subprocess, send
JSON-RPC messages through its stdin and read its stdout. `apply` edits a text the way an editor
applies a WorkspaceEdit (positions in UTF-16 code units, the LSP default), so a test can check
the exact text a code action produces.

One server serves the whole module (`lsp` fixture): starting one costs about a second of CPU.
Each test opens its own documents, so the tests stay independent of each other's order.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.lsp.client import LanguageClient
from pygls.uris import from_fs_path

TIMEOUT = 30.0  # seconds for any one answer (a loaded CI machine, libcst's first import)


class Session:
    def __init__(self, client: LanguageClient):
        self.client = client
        self.loop: asyncio.AbstractEventLoop | None = None
        self.published: list[types.PublishDiagnosticsParams] = []
        self.messages: list[types.ShowMessageParams] = []
        self._arrived = asyncio.Condition()

    @classmethod
    async def start(cls, root: Path, *command: str, capabilities=None) -> Session:
        """Start the server (`python -m linter.server` unless `command` says otherwise) and
        initialize it with `root` as the workspace."""
        client = LanguageClient("accel-lint-tests", "1")
        session = cls(client)

        @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        async def published(params: types.PublishDiagnosticsParams) -> None:
            async with session._arrived:
                session.published.append(params)
                session._arrived.notify_all()

        @client.feature(types.WINDOW_SHOW_MESSAGE)
        def shown(params: types.ShowMessageParams) -> None:
            session.messages.append(params)

        @client.feature(types.CLIENT_REGISTER_CAPABILITY)
        def register(params: types.RegistrationParams) -> None:
            return None

        command = command or (sys.executable, "-m", "linter.server")
        await client.start_io(*command)
        params = types.InitializeParams(
            process_id=None,
            root_uri=from_fs_path(str(root)),
            capabilities=capabilities or types.ClientCapabilities(),
        )
        session.initialized = await asyncio.wait_for(client.initialize_async(params), TIMEOUT)
        client.initialized(types.InitializedParams())
        return session

    # --- documents ---

    def open(self, path: Path, text: str, version: int = 1) -> str:
        uri = from_fs_path(str(path))
        item = types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=item))
        return uri

    def change(self, uri: str, version: int, text: str) -> None:
        """A whole-text change, as editors send for a replace-all (or a paste)."""
        document = types.VersionedTextDocumentIdentifier(uri=uri, version=version)
        change = types.TextDocumentContentChangeWholeDocument(text=text)
        params = types.DidChangeTextDocumentParams(text_document=document, content_changes=[change])
        self.client.text_document_did_change(params)

    def edit(self, uri: str, version: int, range_: types.Range, text: str) -> None:
        """An incremental change (a keystroke)."""
        document = types.VersionedTextDocumentIdentifier(uri=uri, version=version)
        change = types.TextDocumentContentChangePartial(range=range_, text=text)
        params = types.DidChangeTextDocumentParams(text_document=document, content_changes=[change])
        self.client.text_document_did_change(params)

    def save(self, uri: str) -> None:
        document = types.TextDocumentIdentifier(uri=uri)
        self.client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=document))

    def close(self, uri: str) -> None:
        document = types.TextDocumentIdentifier(uri=uri)
        self.client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=document)
        )

    async def diagnostics(self, uri: str, version: int | None) -> list[types.Diagnostic]:
        """The diagnostics published for `uri` at `version` (waits for them)."""

        def found():
            return next((p for p in self.publications(uri) if p.version == version), None)

        return list((await self._wait(found)).diagnostics)

    async def next_publication(self, uri: str, after: int) -> types.PublishDiagnosticsParams:
        """The first publication for `uri` beyond the `after` ones already seen."""

        def found():
            later = self.publications(uri)[after:]
            return later[0] if later else None

        return await self._wait(found)

    async def _wait(self, found):
        async with self._arrived:
            return await asyncio.wait_for(self._arrived.wait_for(found), TIMEOUT)

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def publications(self, uri: str) -> list[types.PublishDiagnosticsParams]:
        return [p for p in self.published if p.uri == uri]

    # --- requests ---

    async def code_actions(self, uri: str, range_: types.Range, only=None) -> list:
        context = types.CodeActionContext(diagnostics=[], only=only)
        document = types.TextDocumentIdentifier(uri=uri)
        params = types.CodeActionParams(text_document=document, range=range_, context=context)
        found = await asyncio.wait_for(self.client.text_document_code_action_async(params), TIMEOUT)
        return found or []

    async def resolve(self, action: types.CodeAction) -> types.CodeAction:
        request = self.client.code_action_resolve_async(action)
        return await asyncio.wait_for(request, TIMEOUT)

    async def hover(self, uri: str, line: int, character: int) -> types.Hover | None:
        document = types.TextDocumentIdentifier(uri=uri)
        position = types.Position(line=line, character=character)
        params = types.HoverParams(text_document=document, position=position)
        return await asyncio.wait_for(self.client.text_document_hover_async(params), TIMEOUT)

    async def stop(self) -> int:
        """shutdown, exit; the server's exit status."""
        await asyncio.wait_for(self.client.shutdown_async(None), TIMEOUT)
        self.client.exit(None)
        await asyncio.wait_for(self.client.stop(), TIMEOUT)
        return self.client._server.returncode

    @staticmethod
    def whole_line(line: int) -> types.Range:
        """Line `line` (1-based, as the linter counts) as an LSP range."""
        start = types.Position(line=line - 1, character=0)
        return types.Range(start=start, end=types.Position(line=line, character=0))

    @staticmethod
    def apply(text: str, edit: types.WorkspaceEdit, uri: str) -> str:
        """`text` after the WorkspaceEdit's edits for `uri`, applied as an editor applies them:
        all ranges refer to the original text, columns count UTF-16 code units."""
        edits = edit.changes[uri]
        starts = _line_starts(text)
        spans = sorted(
            (_offset(text, starts, e.range.start), _offset(text, starts, e.range.end), e.new_text)
            for e in edits
        )
        for (_, end, _), (start, _, _) in zip(spans, spans[1:], strict=False):
            assert end <= start, "overlapping edits in one WorkspaceEdit"
        for start, end, new_text in reversed(spans):
            text = text[:start] + new_text + text[end:]
        return text


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for index, char in enumerate(text):
        if char == "\n":
            starts.append(index + 1)
    return starts


def _offset(text: str, starts: list[int], position: types.Position) -> int:
    if position.line >= len(starts):
        return len(text)
    offset, units = starts[position.line], 0
    while units < position.character and offset < len(text) and text[offset] != "\n":
        units += 2 if ord(text[offset]) > 0xFFFF else 1
        offset += 1
    return offset


@pytest.fixture(scope="module")
def lsp(tmp_path_factory):
    """A started, initialized server for the module's tests; shut down (and exited) after them.

    `lsp.run(coroutine)` runs a test's steps on the session's event loop."""
    loop = asyncio.new_event_loop()
    root = tmp_path_factory.mktemp("workspace")
    session = loop.run_until_complete(Session.start(root))
    session.loop, session.root = loop, root
    yield session
    try:
        assert loop.run_until_complete(session.stop()) == 0
    finally:
        loop.close()


@pytest.fixture
def start_server():
    """`await start_server(root, *command, capabilities=...)`: a session of its own, for tests
    that need another command line or other client capabilities."""
    return Session.start
