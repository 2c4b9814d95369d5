"""`accel-lint server` end to end: a real client over stdio, one server for the module.

Positions in the asserts are LSP's: 0-based lines, columns in UTF-16 code units (the line with
the emoji shows the difference from the linter's character columns).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from lsprotocol import types
from pygls.uris import from_fs_path

from linter.explain import explain_markdown

TRAIN = """\
import torch
from torch import nn

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(2, 4), torch.randn(2, 1)) for _ in range(8)]
accum = 4
for step, (x, y) in enumerate(loader):
    with torch.cuda.amp.autocast():
        loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    print(f"🔥 loss {loss.item()}")
    if (step + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
"""
CLEAN = """\
import torch
from torch import nn

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = [(torch.randn(2, 4), torch.randn(2, 1)) for _ in range(8)]
accum = 4
for step, (x, y) in enumerate(loader):
    loss = nn.functional.mse_loss(model(x), y)
    (loss / accum).backward()
    if (step + 1) % accum == 0 or step + 1 == len(loader):
        optimizer.step()
        optimizer.zero_grad()
"""
ERROR, WARNING, INFO = (
    types.DiagnosticSeverity.Error,
    types.DiagnosticSeverity.Warning,
    types.DiagnosticSeverity.Information,
)


def summary(diagnostics) -> list[tuple]:
    return [
        (d.code, d.range.start.line, d.range.start.character, d.range.end.character, d.severity)
        for d in diagnostics
    ]


def codes(diagnostics) -> list[str]:
    return [d.code for d in diagnostics]


def titled(actions, title: str):
    matching = [a for a in actions if a.title == title]
    assert len(matching) == 1, [a.title for a in actions]
    return matching[0]


def test_open_publishes_findings_with_severity_link_and_source(lsp):
    project = lsp.root / "with_hints"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.accel-lint]\nhints = true\n")
    uri = lsp.open(project / "open.py", TRAIN)
    found = lsp.run(lsp.diagnostics(uri, 1))
    assert summary(found) == [
        ("ACL106", 8, 9, 34, ERROR),
        ("ACL203", 8, 9, 32, WARNING),
        ("ACL301", 10, 4, 19, ERROR),
        # The emoji is one character but two UTF-16 code units: the end is 35, not 34.
        ("ACL504", 11, 4, 35, INFO),
        ("ACL307", 12, 7, 30, ERROR),
    ]
    assert {d.source for d in found} == {"accel-lint"}
    acl301 = found[2]
    assert acl301.message.startswith("`loss` is backpropagated undivided")
    href = acl301.code_description.href
    assert href.startswith("file://") and href.endswith("/rules/acl301_missing_loss_division.py")
    assert Path(urllib.parse.unquote(urllib.parse.urlparse(href).path)).is_file()  # no dead link


def test_hints_are_published_only_where_the_project_asks_for_them(lsp):
    uri = lsp.open(lsp.root / "default.py", TRAIN)
    assert codes(lsp.run(lsp.diagnostics(uri, 1))) == ["ACL106", "ACL203", "ACL301", "ACL307"]


def test_quick_fix_applied_then_the_finding_is_gone(lsp):
    uri = lsp.open(lsp.root / "quickfix.py", TRAIN)
    lsp.run(lsp.diagnostics(uri, 1))
    actions = lsp.run(lsp.code_actions(uri, lsp.whole_line(11)))
    fix = titled(actions, "ACL301: Divide the loss by `accum`")
    assert fix.kind == types.CodeActionKind.QuickFix and fix.is_preferred
    assert [d.code for d in fix.diagnostics] == ["ACL301"]
    fixed = lsp.apply(TRAIN, fix.edit, uri)
    assert fixed == TRAIN.replace("    loss.backward()", "    (loss / accum).backward()")
    lsp.change(uri, 2, fixed)
    assert codes(lsp.run(lsp.diagnostics(uri, 2))) == ["ACL106", "ACL203", "ACL307"]


def test_unsafe_fix_not_offered_without_the_project_setting(lsp):
    uri = lsp.open(lsp.root / "safe_only.py", TRAIN)
    lsp.run(lsp.diagnostics(uri, 1))
    titles = [a.title for a in lsp.run(lsp.code_actions(uri, lsp.whole_line(13)))]
    assert titles == ["Disable ACL307 for this line", "Fix all accel-lint findings"]


def test_fix_all_applies_the_safe_fixes_as_the_cli_does(lsp):
    uri = lsp.open(lsp.root / "fix_all.py", TRAIN)
    lsp.run(lsp.diagnostics(uri, 1))
    actions = lsp.run(lsp.code_actions(uri, lsp.whole_line(1), only=["source.fixAll"]))
    fix_all = titled(actions, "Fix all accel-lint findings")
    assert fix_all.kind == "source.fixAll.accel-lint"
    fixed = lsp.apply(TRAIN, fix_all.edit, uri)
    # ACL203 and ACL301 (safe) are fixed; ACL307's fix is unsafe and stays out.
    assert fixed == TRAIN.replace(
        "torch.cuda.amp.autocast()", 'torch.amp.autocast("cuda")'
    ).replace("    loss.backward()", "    (loss / accum).backward()")
    lsp.change(uri, 2, fixed)
    assert codes(lsp.run(lsp.diagnostics(uri, 2))) == ["ACL106", "ACL307"]


def test_unsafe_fixes_offered_where_the_project_enables_them(lsp):
    project = lsp.root / "unsafe_project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.accel-lint]\nunsafe-fixes = true\n")
    uri = lsp.open(project / "train.py", TRAIN)
    lsp.run(lsp.diagnostics(uri, 1))
    actions = lsp.run(lsp.code_actions(uri, lsp.whole_line(13)))
    unsafe = titled(
        actions, "ACL307: Also step on the last batch (`step + 1 == len(loader)`) (unsafe)"
    )
    assert not unsafe.is_preferred
    fixed = lsp.apply(TRAIN, unsafe.edit, uri)
    assert fixed == TRAIN.replace(
        "if (step + 1) % accum == 0:", "if (step + 1) % accum == 0 or step + 1 == len(loader):"
    )
    actions = lsp.run(lsp.code_actions(uri, lsp.whole_line(1), only=["source.fixAll"]))
    everything = lsp.apply(TRAIN, titled(actions, "Fix all accel-lint findings").edit, uri)
    assert "or step + 1 == len(loader):" in everything and "(loss / accum)" in everything


def test_project_config_applies_and_reloads_when_saved(lsp):
    project = lsp.root / "configured"
    project.mkdir()
    config = project / "pyproject.toml"
    config.write_text('[tool.accel-lint]\nignore = ["ACL307"]\n')
    uri = lsp.open(project / "train.py", TRAIN)
    assert codes(lsp.run(lsp.diagnostics(uri, 1))) == ["ACL106", "ACL203", "ACL301"]
    seen = len(lsp.publications(uri))
    config.write_text('[tool.accel-lint]\nignore = ["ACL307", "ACL2"]\n')
    lsp.save(from_fs_path(str(config)))  # the editor saved the config: every open file again
    again = lsp.run(lsp.next_publication(uri, after=seen))
    assert again.version == 1
    assert codes(again.diagnostics) == ["ACL106", "ACL301"]
    lsp.close(uri)


def test_disable_for_this_line_adds_then_merges_the_noqa(lsp):
    uri = lsp.open(lsp.root / "noqa.py", TRAIN)
    lsp.run(lsp.diagnostics(uri, 1))
    actions = lsp.run(lsp.code_actions(uri, lsp.whole_line(9)))
    disable = titled(actions, "Disable ACL106 for this line")
    first = lsp.apply(TRAIN, disable.edit, uri)
    with_106 = "    with torch.cuda.amp.autocast():  # noqa: ACL106\n"
    assert first == TRAIN.replace("    with torch.cuda.amp.autocast():\n", with_106)
    lsp.change(uri, 2, first)
    assert codes(lsp.run(lsp.diagnostics(uri, 2))) == ["ACL203", "ACL301", "ACL307"]
    actions = lsp.run(lsp.code_actions(uri, lsp.whole_line(9)))
    merged = lsp.apply(first, titled(actions, "Disable ACL203 for this line").edit, uri)
    assert merged == first.replace("# noqa: ACL106", "# noqa: ACL106, ACL203")
    lsp.change(uri, 3, merged)
    assert codes(lsp.run(lsp.diagnostics(uri, 3))) == ["ACL301", "ACL307"]


def test_hover_shows_the_rules_explain_text(lsp):
    uri = lsp.open(lsp.root / "hover.py", TRAIN)
    lsp.run(lsp.diagnostics(uri, 1))
    hover = lsp.run(lsp.hover(uri, 10, 8))  # inside `loss.backward()`
    assert hover.contents.kind == types.MarkupKind.Markdown
    assert hover.contents.value == explain_markdown("ACL301")
    assert (hover.range.start.line, hover.range.start.character) == (10, 4)
    both = lsp.run(lsp.hover(uri, 8, 12)).contents.value  # ACL106 and ACL203 share the span
    assert both == explain_markdown("ACL106") + "\n---\n\n" + explain_markdown("ACL203")
    assert lsp.run(lsp.hover(uri, 0, 3)) is None  # `import torch`: no finding there


def test_typing_through_syntax_errors_gives_at_most_one_acl000(lsp):
    uri = lsp.open(lsp.root / "typing.py", CLEAN)
    assert lsp.run(lsp.diagnostics(uri, 1)) == []
    line = CLEAN.splitlines().index("    (loss / accum).backward()") + 1
    typed = "    y = loss.detach(\n"
    version = 1
    for column, char in enumerate(typed):
        version += 1
        at = types.Position(line=line, character=column)
        lsp.edit(uri, version, types.Range(start=at, end=at), char)
        found = lsp.run(lsp.diagnostics(uri, version))
        broken = [d for d in found if d.code == "ACL000"]
        assert len(broken) <= 1 and (not broken or found == broken), (typed[: column + 1], found)
    assert [d.message for d in found] == ["SyntaxError: '(' was never closed"]
    end = types.Position(line=line, character=len(typed) - 1)
    lsp.edit(uri, version + 1, types.Range(start=end, end=end), ")")
    assert lsp.run(lsp.diagnostics(uri, version + 1)) == []


def test_broken_files_never_crash_the_server(lsp):
    texts = [
        'def f(:\n    """unterminated\n',
        "for step in range(3):\n\tif step:\n        loss.backward()\n",  # tabs and spaces
        "x = 1\n\x00\n",
        "with torch.autocast('cpu'):\n",
        "",
    ]
    for index, text in enumerate(texts):
        uri = lsp.open(lsp.root / f"broken_{index}.py", text)
        found = lsp.run(lsp.diagnostics(uri, 1))
        assert codes(found) == ([] if not text else ["ACL000"]), (text, found)
    uri = lsp.open(lsp.root / "after_broken.py", TRAIN)  # and it still answers
    assert (
        len(lsp.run(lsp.diagnostics(uri, 1))) == 4
    )  # TRAIN: its four findings (no hint by default)


def test_a_burst_of_changes_is_answered_for_the_latest_version(lsp):
    uri = lsp.open(lsp.root / "burst.py", TRAIN)
    lsp.run(lsp.diagnostics(uri, 1))
    for version in range(2, 8):  # sent back to back, as fast typing does
        lsp.change(uri, version, CLEAN if version % 2 else TRAIN)
    # Asked mid-burst, a code action answers for the newest text (CLEAN: nothing to offer).
    assert lsp.run(lsp.code_actions(uri, lsp.whole_line(11))) == []
    assert lsp.run(lsp.diagnostics(uri, 7)) == []  # version 7 holds CLEAN
    lsp.run(lsp.hover(uri, 0, 0))  # a round trip: anything published before it has arrived
    versions = [p.version for p in lsp.publications(uri)]
    assert versions == sorted(set(versions)) and versions[-1] == 7, versions
    for publication in lsp.publications(uri):  # each one describes the text of its version
        holds_clean = publication.version > 1 and publication.version % 2 == 1
        assert (not publication.diagnostics) == holds_clean, publication.version


def test_save_lints_again_and_close_clears(lsp):
    uri = lsp.open(lsp.root / "closed.py", TRAIN)
    first = lsp.run(lsp.diagnostics(uri, 1))
    seen = len(lsp.publications(uri))
    lsp.save(uri)
    saved = lsp.run(lsp.next_publication(uri, after=seen))
    assert saved.version == 1 and list(saved.diagnostics) == first
    seen += 1
    lsp.close(uri)
    cleared = lsp.run(lsp.next_publication(uri, after=seen))
    assert list(cleared.diagnostics) == [] and cleared.version is None


def test_untitled_buffers_are_linted_notebook_cells_and_other_languages_not(lsp):
    def open_as(uri: str, language: str) -> None:
        item = types.TextDocumentItem(uri=uri, language_id=language, version=1, text=TRAIN)
        lsp.client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=item))

    cell = f"vscode-notebook-cell:{lsp.root}/train.ipynb#W0sZmlsZQ%3D%3D"
    open_as(cell, "python")  # one cell alone would be judged without the others
    text_file = from_fs_path(str(lsp.root / "notes.txt"))
    open_as(text_file, "plaintext")
    open_as("untitled:Untitled-1", "python")
    # Lints run one at a time in the order asked: had the others been linted, their
    # diagnostics would have arrived before these.
    assert len(lsp.run(lsp.diagnostics("untitled:Untitled-1", 1))) == 4
    assert lsp.publications(cell) == [] and lsp.publications(text_file) == []


def test_an_invalid_config_is_shown_once_and_nothing_stale_stays(lsp):
    project = lsp.root / "invalid_config"
    project.mkdir()
    (project / "pyproject.toml").write_text('[tool.accel-lint]\nselect = ["NOPE"]\n')
    first = lsp.open(project / "a.py", TRAIN)
    assert lsp.run(lsp.diagnostics(first, 1)) == []
    second = lsp.open(project / "b.py", TRAIN)
    assert lsp.run(lsp.diagnostics(second, 1)) == []
    shown = [m for m in lsp.messages if "NOPE" in m.message]
    assert len(shown) == 1 and shown[0].type == types.MessageType.Error
    assert "unknown rule selector" in shown[0].message
    lsp.messages.remove(shown[0])
    lsp.close(first)
    lsp.close(second)


def test_requests_on_an_unknown_document_answer_nothing(lsp):
    uri = from_fs_path(str(lsp.root / "never_opened.py"))
    assert lsp.run(lsp.code_actions(uri, lsp.whole_line(1))) == []
    assert lsp.run(lsp.hover(uri, 0, 0)) is None
    assert not lsp.messages  # nothing went wrong enough to tell the user
