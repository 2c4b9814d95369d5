"""Checkpoint facts: what each `torch.save` of a training state holds.

A checkpoint dict is read as Python builds it: a literal (`{"model": ..., "optimizer": ...}`),
`dict(model=..., ...)`, or a name bound to one and grown step by step before the save
(`ckpt["scaler"] = scaler.state_dict()`, `ckpt.update(...)`). Engine checkpoints
(`accelerator.save_state(...)`) hold the scaler themselves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from linter.model.cst_util import code, dotted, method_call, positional, string_value, walk
from linter.model.functions import Stmt
from linter.model.kinds import CheckpointKind

_SAVE_FUNCTIONS = {"torch.save"}
_ENGINE_SAVES = {"save_state", "save_checkpoint"}
# `"scaler"`, `"grad_scaler"`, `loss_scaler`, `"amp"` (apex), not `"timestamp"` or `"sample"`.
_SCALER_TEXT = re.compile(r"scal(er|ing)|(^|[^a-z])amp([^a-z]|$)")


@dataclass(eq=False)
class Checkpoint:
    """One save call and what its state holds (None fields: not statically known)."""

    call: cst.Call
    stmt: Stmt
    kind: CheckpointKind
    keys: list[str] = field(default_factory=list)  # key texts, in the order they were added
    values: list[cst.BaseExpression] = field(default_factory=list)
    # Whether every entry of the saved dict can be read here; False for `**extra`, a helper's
    # result, a dict handed to a call before the save. Says nothing about what the dict holds.
    fully_visible: bool = True
    binding: Stmt | None = None  # `ckpt = {...}` when the save names a dict built before it

    def state_dicts_of(self, predicate) -> list[str]:
        """Receivers of `.state_dict()` calls in the values for which `predicate(text)` holds."""
        found = []
        for value in self.values:
            for node in walk(value):
                pair = method_call(node)
                if pair is not None and pair[1] == "state_dict" and predicate(dotted(pair[0])):
                    found.append(dotted(pair[0]))
        return found

    def mentions(self, predicate) -> bool:
        """Whether a key or any name in a value satisfies `predicate` (a scaler under any key,
        `"scaler": scaler` saved as an object, `"amp": amp.state_dict()`)."""
        texts = list(self.keys)
        for value in self.values:
            texts += [
                dotted(n) or "" for n in walk(value) if isinstance(n, (cst.Name, cst.Attribute))
            ]
        return any(predicate(text) for text in texts)


def checkpoints(model) -> list[Checkpoint]:
    return model.memo("checkpoints.checkpoints", _find_checkpoints)


def _find_checkpoints(model) -> list[Checkpoint]:
    found = []
    for call in model.calls:
        qual = model.imports.qualify(call.call.func) or ""
        if call.method in _ENGINE_SAVES and model.engine_for(call.receiver, call.stmt.scope):
            saved = Checkpoint(call.call, call.stmt, CheckpointKind.ENGINE, fully_visible=False)
            found.append(saved)
        elif qual in _SAVE_FUNCTIONS and positional(call.call):
            found.append(_torch_save(model, call))
    return sorted(found, key=lambda c: c.stmt.order)


def _torch_save(model, call) -> Checkpoint:
    checkpoint = Checkpoint(call.call, call.stmt, CheckpointKind.TORCH_SAVE)
    _read_state(model, positional(call.call)[0], call.stmt, checkpoint, 0)
    return checkpoint


def _read_state(model, value, stmt: Stmt, checkpoint: Checkpoint, depth: int) -> None:
    if isinstance(value, cst.Dict):
        _read_dict(value, checkpoint)
    elif isinstance(value, cst.Call) and dotted(value.func) == "dict":
        _read_dict_call(value, checkpoint)
    elif isinstance(value, cst.Name) and depth < 3:
        _read_named_state(model, value.value, stmt, checkpoint, depth)
    else:
        checkpoint.fully_visible = False  # `model.state_dict()` alone, a helper's result, ...
        checkpoint.values.append(value)


def _read_dict(node: cst.Dict, checkpoint: Checkpoint) -> None:
    for element in node.elements:
        if isinstance(element, cst.DictElement):
            checkpoint.keys.append(_key_text(element.key))
            checkpoint.values.append(element.value)
        else:
            checkpoint.fully_visible = False  # `**extra`
            checkpoint.values.append(element.value)


def _read_dict_call(call: cst.Call, checkpoint: Checkpoint) -> None:
    for arg in call.args:
        if arg.keyword is not None:
            checkpoint.keys.append(arg.keyword.value)
            checkpoint.values.append(arg.value)
        else:
            checkpoint.fully_visible = False
            checkpoint.values.append(arg.value)


def _read_named_state(model, name: str, stmt: Stmt, checkpoint: Checkpoint, depth: int) -> None:
    """A dict bound to `name` before the save, plus what is added to it in between."""
    scope = stmt.scope
    defs = [d for d in scope.defs_before(name, stmt.order) if d.op == "="]
    if not defs or defs[-1].tuple_index is not None:
        checkpoint.fully_visible = False
        return
    start = defs[-1]
    if checkpoint.binding is None:
        checkpoint.binding = start.stmt
    _read_state(model, start.value, start.stmt, checkpoint, depth + 1)
    for between in scope.stmts:
        if start.stmt.order < between.order < stmt.order:
            _read_addition(between.node, name, checkpoint)
            if _hands_over(between.node, name):
                checkpoint.fully_visible = False  # `callback.on_save(ckpt)` may add the scaler


def _read_addition(node, name: str, checkpoint: Checkpoint) -> None:
    """`name[key] = value` and `name.update({...})` / `name.update(key=value)`."""
    if isinstance(node, cst.Assign):
        for target in node.targets:
            subscript = target.target
            if isinstance(subscript, cst.Subscript) and dotted(subscript.value) == name:
                key = subscript.slice[0].slice if subscript.slice else None
                key_text = _key_text(key.value) if isinstance(key, cst.Index) else ""
                checkpoint.keys.append(key_text)
                checkpoint.values.append(node.value)
    elif isinstance(node, cst.Expr):
        pair = method_call(node.value)
        if pair is not None and pair[1] == "update" and dotted(pair[0]) == name:
            for arg in node.value.args:
                if isinstance(arg.value, cst.Dict):
                    _read_dict(arg.value, checkpoint)
                elif arg.keyword is not None:
                    checkpoint.keys.append(arg.keyword.value)
                    checkpoint.values.append(arg.value)
                else:
                    checkpoint.fully_visible = False
                    checkpoint.values.append(arg.value)


def _hands_over(node, name: str) -> bool:
    """Whether the statement passes the dict itself to a call (which may add to it)."""
    for sub in walk(node):
        if isinstance(sub, cst.Call) and any(dotted(a.value) == name for a in sub.args):
            pair = method_call(sub)
            return not (pair is not None and pair[1] == "update" and dotted(pair[0]) == name)
    return False


def _key_text(node) -> str:
    text = string_value(node)
    return text if text is not None else code(node) if node is not None else ""


def is_scaler_text(text: str) -> bool:
    """A key or name that stands for scaler state (`"scaler"`, `"amp_scaler"`, `loss_scaler`)."""
    return bool(_SCALER_TEXT.search(text.lower()))


def enabled_scalers(model) -> list[str]:
    """GradScalers built in the module that are not literally disabled (`enabled=False`)."""
    return [s.name for s in model.setup.scalers.values() if s.enabled is not False]


def describe(model) -> list[dict]:
    """The checkpoint calls found and the state each holds (`--show-loops`)."""
    entries = []
    for checkpoint in checkpoints(model):
        entry = {"kind": checkpoint.kind, "line": model.line(checkpoint.call)}
        if checkpoint.kind == CheckpointKind.TORCH_SAVE:
            entry["keys"] = [k for k in checkpoint.keys if k]
            entry["fully_visible"] = checkpoint.fully_visible
        entries.append(entry)
    return entries
