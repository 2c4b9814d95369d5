"""The server reads a document in its project, and lints the open documents again when a
module they draw on is saved or changes on disk (a watched file), their text unchanged."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types
from pygls.uris import from_fs_path

from .conftest import Session

ENGINE = """\
import torch


def train_one_epoch(model, data_loader, optimizer, update_freq):
    for step, (samples, targets) in enumerate(data_loader):
        loss = torch.nn.functional.cross_entropy(model(samples), targets)
        (loss / update_freq).backward()
        if (step + 1) % update_freq == 0 or step + 1 == len(data_loader):
            optimizer.step()
            optimizer.zero_grad()
"""
MAIN = """\
import torch

from engine import train_one_epoch
from util.misc import wrap_model


def main(args, model, loader):
    model = wrap_model(model, args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        train_one_epoch(model, loader, optimizer, args.update_freq)
"""
MISC = """\
import torch


def wrap_model(model, args):
    return model.cuda(args.gpu)
"""
WRAPPED = MISC.replace(
    "    return model.cuda(args.gpu)",
    "    return torch.nn.parallel.DistributedDataParallel(model.cuda(args.gpu))",
)
OTHER = "import torch\n\n\ndef step(loss):\n    loss.backward()\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A server whose workspace is a small project: engine.py, main.py, util/misc.py."""
    root = tmp_path_factory.mktemp("project")
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (root / "util").mkdir()
    (root / "util" / "__init__.py").write_text("")
    for name, text in {"engine.py": ENGINE, "main.py": MAIN, "util/misc.py": MISC,
                       "other.py": OTHER}.items():  # fmt: skip
        (root / name).write_text(text)
    loop = asyncio.new_event_loop()
    session = loop.run_until_complete(Session.start(root))
    session.loop, session.root = loop, root
    yield session
    try:
        assert loop.run_until_complete(session.stop()) == 0
    finally:
        loop.close()


def _ddp(diagnostics) -> list[tuple[str, int]]:
    return [(d.code, d.range.start.line) for d in diagnostics if d.code == "ACL401"]


def _settled(lsp: Session, uri: str) -> int:
    """The publications of `uri` so far, once any lint of it already on its way has landed
    (a request on the document waits for that lint, and is answered after its publication)."""
    lsp.run(lsp.hover(uri, 0, 0))
    return len(lsp.publications(uri))


def test_a_saved_module_relints_the_documents_that_read_it(project):
    lsp = project
    engine = lsp.open(lsp.root / "engine.py", ENGINE)
    other = lsp.open(lsp.root / "other.py", OTHER)
    assert _ddp(lsp.run(lsp.diagnostics(engine, 1))) == []
    lsp.run(lsp.diagnostics(other, 1))
    seen, others = len(lsp.publications(engine)), _settled(lsp, other)
    # util/misc.py edited and saved: wrap_model now wraps in DDP, which main() hands to
    # train_one_epoch (engine.py's text is unchanged)
    (lsp.root / "util" / "misc.py").write_text(WRAPPED)
    misc = lsp.open(lsp.root / "util" / "misc.py", WRAPPED)
    lsp.save(misc)
    again = lsp.run(lsp.next_publication(engine, after=seen))
    assert again.version == 1 and _ddp(again.diagnostics) == [("ACL401", 5)]
    assert _settled(lsp, other) == others  # other.py reads nothing of util/misc.py
    lsp.close(misc)


def test_a_watched_file_that_changed_relints_the_documents_that_read_it(project):
    lsp = project
    engine = from_fs_path(str(lsp.root / "engine.py"))
    (lsp.root / "util" / "misc.py").write_text(WRAPPED)
    (lsp.root / "main.py").write_text(MAIN)
    seen = _settled(lsp, engine)
    # a `git checkout`: main.py no longer wraps (it skips wrap_model), no editor saved it
    (lsp.root / "main.py").write_text(MAIN.replace("wrap_model(model, args)", "model"))
    change = types.FileEvent(uri=from_fs_path(str(lsp.root / "main.py")),
                             type=types.FileChangeType.Changed)  # fmt: skip
    lsp.client.workspace_did_change_watched_files(
        types.DidChangeWatchedFilesParams(changes=[change])
    )
    again = lsp.run(lsp.next_publication(engine, after=seen))
    assert again.version == 1 and _ddp(again.diagnostics) == []


def test_a_new_caller_relints_the_file_it_imports(project):
    """A module created on disk that imports the open document (and calls its loop with a
    DDP model) is read too."""
    lsp = project
    engine = from_fs_path(str(lsp.root / "engine.py"))
    (lsp.root / "main.py").write_text("x = 1\n")
    created = lsp.root / "launch.py"
    seen = _settled(lsp, engine)
    wrapped_here = "torch.nn.parallel.DistributedDataParallel(model)"
    created.write_text(MAIN.replace("wrap_model(model, args)", wrapped_here))
    change = types.FileEvent(uri=from_fs_path(str(created)), type=types.FileChangeType.Created)
    lsp.client.workspace_did_change_watched_files(
        types.DidChangeWatchedFilesParams(changes=[change])
    )
    again = lsp.run(lsp.next_publication(engine, after=seen))
    assert again.version == 1 and _ddp(again.diagnostics) == [("ACL401", 5)]
