"""`accel-lint server` as an editor starts it: the whole session in order, and a light import."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from lsprotocol import types

from linter.explain import explain_markdown

BUGGY = """\
import torch

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    loss = torch.nn.functional.mse_loss(model(torch.randn(4, 2)), torch.zeros(4, 1))
    loss.backward()
    if (step + 1) % 4 == 0:
        optimizer.step()
        optimizer.zero_grad()
"""
FIXED = BUGGY.replace("    loss.backward()", "    loss = loss / 4\n    loss.backward()")


def test_accel_lint_server_session_from_initialize_to_exit(tmp_path, start_server):
    async def session_steps() -> int:
        command = (sys.executable, "-m", "linter.cli", "server")  # what `accel-lint server` runs
        lsp = await start_server(tmp_path, *command)
        capabilities = lsp.initialized.capabilities
        assert lsp.initialized.server_info.name == "accel-lint"
        assert capabilities.hover_provider and capabilities.code_action_provider.resolve_provider
        assert list(capabilities.code_action_provider.code_action_kinds) == [
            "quickfix",
            "source.fixAll.accel-lint",
        ]
        uri = lsp.open(tmp_path / "train.py", BUGGY)
        found = await lsp.diagnostics(uri, 1)
        assert [(d.code, d.range.start.line) for d in found] == [("ACL301", 6)]
        hover = await lsp.hover(uri, 6, 6)
        assert hover.contents.value == explain_markdown("ACL301")
        actions = await lsp.code_actions(uri, lsp.whole_line(7))
        assert [a.title for a in actions] == [
            "ACL301: Divide the loss by `4`",
            "Disable ACL301 for this line",
            "Fix all accel-lint findings",
        ]
        fixed = lsp.apply(BUGGY, actions[0].edit, uri)
        assert fixed == FIXED
        lsp.change(uri, 2, fixed)
        assert await lsp.diagnostics(uri, 2) == []  # cleared
        assert await lsp.hover(uri, 6, 6) is None
        return await lsp.stop()

    assert asyncio.run(session_steps()) == 0


def test_fix_all_resolved_lazily_for_clients_that_can(tmp_path, start_server):
    """Editors ask for code actions at every cursor move: a client that resolves edits gets the
    fix-all action without its edit, and the fix loop runs only when it is chosen."""
    resolve = types.ClientCodeActionResolveOptions(properties=["edit"])
    code_action = types.CodeActionClientCapabilities(resolve_support=resolve)
    capabilities = types.ClientCapabilities(
        text_document=types.TextDocumentClientCapabilities(code_action=code_action)
    )

    async def session_steps() -> int:
        lsp = await start_server(tmp_path, capabilities=capabilities)
        uri = lsp.open(tmp_path / "train.py", BUGGY)
        await lsp.diagnostics(uri, 1)
        only = [types.CodeActionKind.SourceFixAll]
        (lazy,) = await lsp.code_actions(uri, lsp.whole_line(1), only=only)
        assert lazy.title == "Fix all accel-lint findings" and lazy.edit is None
        resolved = await lsp.resolve(lazy)
        assert lsp.apply(BUGGY, resolved.edit, uri) == FIXED
        return await lsp.stop()

    assert asyncio.run(session_steps()) == 0


def test_importing_the_server_loads_neither_libcst_nor_rich():
    probe = (
        "import sys, linter.server, linter.server.app, linter.server.features\n"
        "heavy = ('libcst', 'rich', 'typer', 'linter.analysis')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
    package_only = "import sys, linter.server; print('pygls' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", package_only], capture_output=True, text=True)
    assert result.stdout.strip() == "False"  # `accel-lint server` loads pygls only when started
