"""The LSP methods the server answers, each a thin handler over `AccelLintServer`; `build` and
`start` give the server with them registered (this module sits above `app`, never below it)."""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types

from linter.server import actions
from linter.server.app import ACTION_KINDS, CONFIG_GLOB, AccelLintServer, is_config
from linter.server.convert import contains


def build() -> AccelLintServer:
    """The server with its features registered."""
    server = AccelLintServer()
    register(server)
    return server


PY_GLOB = "**/*.py"


def start(root: Path | None = None) -> None:
    server = build()
    if root is not None:
        server.linter.root = root
    server.start_io()


def register(server: AccelLintServer) -> None:
    @server.feature(types.INITIALIZED)
    async def initialized(ls: AccelLintServer, params: types.InitializedParams) -> None:
        root = ls.workspace.root_path
        if root:
            ls.linter.root = Path(root)
        from linter.analysis import load

        ls.worker.submit(load)  # libcst and the rules, imported before the first file opens
        ls.linter.enable_projects()
        if _can_watch(ls.client_capabilities):
            await _watch_configs(ls)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: AccelLintServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: AccelLintServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    async def did_save(ls: AccelLintServer, params: types.DidSaveTextDocumentParams) -> None:
        uri = params.text_document.uri
        if is_config(uri):
            ls.config_changed()
            return
        ls.schedule(uri)
        path = _python_file(uri)
        if path is not None:
            await ls.modules_changed([path])

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: AccelLintServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.forget(params.text_document.uri)
        ls.clear(params.text_document.uri)

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    async def watched(ls: AccelLintServer, params: types.DidChangeWatchedFilesParams) -> None:
        if any(is_config(change.uri) for change in params.changes):
            ls.config_changed()
        paths = [path for c in params.changes if (path := _python_file(c.uri)) is not None]
        if paths:
            await ls.modules_changed(paths)

    options = types.CodeActionOptions(code_action_kinds=ACTION_KINDS, resolve_provider=True)

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION, options)
    async def code_action(ls: AccelLintServer, params: types.CodeActionParams):
        linted = await ls.current(params.text_document.uri)
        if linted is None:
            return None
        lines = ls.lines(linted.snapshot.text)
        only = params.context.only
        found = []
        if actions.wanted(types.CodeActionKind.QuickFix, only):
            start = lines.linter_position(params.range.start)
            end = lines.linter_position(params.range.end)
            found += actions.quick_fixes(linted, lines, start, end)
        if actions.wanted(actions.FIX_ALL_KIND, only) and actions.fixable(linted):
            fix_all = await _fix_all(ls, linted, lines)
            found += [fix_all] if fix_all else []
        return found or None

    @server.feature(types.CODE_ACTION_RESOLVE)
    async def resolve(ls: AccelLintServer, action: types.CodeAction) -> types.CodeAction:
        uri = (action.data or {}).get("uri")
        linted = await ls.current(uri) if uri else None
        if linted is None or action.kind != actions.FIX_ALL_KIND:
            return action
        fixed = await ls.fixed_text(linted)
        resolved = actions.fix_all(linted, fixed, ls.lines(linted.snapshot.text))
        return resolved or action

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def hover(ls: AccelLintServer, params: types.HoverParams) -> types.Hover | None:
        linted = await ls.current(params.text_document.uri)
        if linted is None:
            return None
        lines = ls.lines(linted.snapshot.text)
        at = lines.linter_position(params.position)
        found = [d for d in linted.diagnostics if contains(d, at) and d.code != actions.PARSE_ERROR]
        if not found:
            return None
        from linter.explain import explain_markdown

        codes = dict.fromkeys(d.code for d in found)
        text = "\n---\n\n".join(explain_markdown(code) for code in codes)
        content = types.MarkupContent(kind=types.MarkupKind.Markdown, value=text)
        return types.Hover(contents=content, range=lines.range(found[0].start, found[0].end))

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: AccelLintServer, params: None) -> None:
        ls.worker.shutdown(wait=False, cancel_futures=True)


async def _fix_all(ls: AccelLintServer, linted, lines) -> types.CodeAction | None:
    """Resolved later where the client can (editors ask for code actions at every cursor move;
    the fix loop runs only when the action is chosen), else computed now."""
    if _can_resolve_edits(ls.client_capabilities):
        return types.CodeAction(
            title=actions.FIX_ALL_TITLE,
            kind=actions.FIX_ALL_KIND,
            data={"uri": linted.snapshot.uri, "version": linted.snapshot.version},
        )
    return actions.fix_all(linted, await ls.fixed_text(linted), lines)


def _can_resolve_edits(capabilities: types.ClientCapabilities) -> bool:
    document = capabilities.text_document
    support = document and document.code_action and document.code_action.resolve_support
    return bool(support and "edit" in support.properties)


def _can_watch(capabilities: types.ClientCapabilities) -> bool:
    workspace = capabilities.workspace
    watched = workspace and workspace.did_change_watched_files
    return bool(watched and watched.dynamic_registration)


def _python_file(uri: str) -> Path | None:
    """The path of a `file:` URI naming a Python module (a module other documents may read)."""
    from pygls.uris import to_fs_path

    path = to_fs_path(uri) if uri.startswith("file:") else None
    return Path(path) if path and path.endswith(".py") else None


async def _watch_configs(ls: AccelLintServer) -> None:
    """Ask the client to tell us when a config file changes on disk (a `git pull`, a branch),
    and a Python module (what the open documents read from their projects)."""
    watchers = [types.FileSystemWatcher(glob_pattern=glob) for glob in (CONFIG_GLOB, PY_GLOB)]
    options = types.DidChangeWatchedFilesRegistrationOptions(watchers=watchers)
    registration = types.Registration(
        id="accel-lint-configs",
        method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
        register_options=options,
    )
    params = types.RegistrationParams(registrations=[registration])
    await ls.client_register_capability_async(params)
