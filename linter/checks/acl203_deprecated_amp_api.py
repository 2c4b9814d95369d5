"""ACL203: deprecated `torch.cuda.amp` / `torch.cpu.amp` references, rewritten to `torch.amp`.

A full chain (`torch.cuda.amp.GradScaler(...)`) is one finding with its own fix. A name bound by
an import (`from torch.cuda.amp import autocast, GradScaler`, `from torch.cuda import amp`) is
one finding per imported name, at the import: its fix rewrites every use of the name in the module
and the import together, or is declined when a use cannot be rewritten. An import line with two
deprecated names thus gives two findings; their fixes share the import line, so `--fix` applies
them one after the other (each round re-reads the file).
"""

from __future__ import annotations

import re

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.edits import (
    merged,
    remove_statement,
    replace_statement,
    statement_before,
    without_names,
)
from linter.model.amp_api import TORCH_AMP_NAMES, Binding, Use, amp_api
from linter.model.cst_util import dotted
from linter.types import Edit, Position

# The old autocast's positional order; the new one starts with `device_type`.
_AUTOCAST_ORDER = ("enabled", "dtype", "cache_enabled")
_EMPTY_ARGS = re.compile(r"\(\s*\)")
_EMPTY = cst.Module(body=[])


class _Declined(Exception):
    """A use the fix cannot rewrite; the message says why."""


def check(ctx: RuleContext) -> None:
    """Report deprecated AMP references outside compatibility fallbacks."""
    api = amp_api(ctx.model, ctx.source)
    for use in api.chains:
        if not use.fallback:
            _report_chain(ctx, api, use)
    _report_bindings(ctx, api)


# --- full chains: torch.cuda.amp.X ---------------------------------------------------------


def _report_chain(ctx, api, use: Use) -> None:
    device, name = use.target
    head = dotted(use.node).split(".", 1)[0]
    prefix = head if api.imported.get(head) == {"torch"} else api.torch_name()
    spelled = dotted(use.node)
    fix = None
    reason = ""
    try:
        if prefix is None:
            raise _Declined("is reached without a name bound to `torch`")
        edits = _rewrite(ctx, use, f"{prefix}.amp.{name}", device, name)
        fix = make_fix(f"Use `{_modern(name, device)}`", *merged(edits))
    except _Declined as declined:
        reason = f" (not fixed: it {declined})"
    ctx.report(use.node, f"`{spelled}` is deprecated: use `{_modern(name, device)}`{reason}", fix)


# --- names bound by an import ----------------------------------------------------------------


def _report_bindings(ctx, api) -> None:
    """One finding per imported name. Every fixable one carries the same fix, which rewrites all
    of them at once: one edit per import statement (two names on one line leave together) and
    at most one `import torch` per block."""
    bindings = [b for b in api.bindings if not b.fallback]
    use_edits: dict[Binding, list[Edit]] = {}
    reasons: dict[Binding, str] = {}
    for binding in bindings:
        try:
            use_edits[binding] = _use_edits(ctx, api, binding)
        except _Declined as declined:
            reasons[binding] = str(declined)
    fix = None
    if use_edits:
        statement_edits = _statement_edits(ctx, api, list(use_edits))
        edits = [e for es in use_edits.values() for e in es] + statement_edits
        fix = make_fix("Import from `torch.amp` instead", *merged(edits))
    for binding in bindings:
        reason = f" (not fixed: {reasons[binding]})" if binding in reasons else ""
        uses = api.uses_of(binding)
        message = _binding_message(ctx, binding, uses) + reason
        ctx.report(binding.alias, message, None if reason else fix)


def _binding_message(ctx, binding: Binding, uses: list[Use]) -> str:
    module = _deprecated_module(binding)
    lines = sorted({ctx.line_of(u.node) for u in uses})
    where = f" (used on line{'s' if len(lines) > 1 else ''} {_join(lines)})" if lines else ""
    if binding.is_module:
        return (
            f"`{binding.local}` is the deprecated `{module}`{where}: use `torch.amp`, whose "
            f'autocast and GradScaler take the device type first (`"{_device(binding)}"`)'
        )
    name = binding.target[1]
    shown = binding.local if binding.local == name else f"{name}` as `{binding.local}"
    modern = _modern(name, _device(binding))
    return f"`{shown}` is imported from the deprecated `{module}`{where}: use `{modern}`"


def _use_edits(ctx, api, binding: Binding) -> list[Edit]:
    """The edits for every use of the bound name, or `_Declined` when the name escapes."""
    uses = api.uses_of(binding)
    _refuse_escapes(ctx, api, binding, uses)
    edits: list[Edit] = []
    for use in uses:
        try:
            edits += _rewrite_bound(api, ctx, binding, use)
        except _Declined as declined:
            where = f"`{dotted(use.node)}` on line {ctx.line_of(use.node)}"
            raise _Declined(f"{where} {declined}") from None
    return edits


def _rewrite_bound(api, ctx, binding: Binding, use: Use) -> list[Edit]:
    if binding.is_module:  # `amp.X(...)` keeps its spelling: `amp` comes to mean `torch.amp`
        target = use.target
        if target is None or target[1] not in TORCH_AMP_NAMES:
            raise _Declined("has no `torch.amp` twin")
        return _rewrite(ctx, use, None, target[0], target[1])
    if use.full != binding.full:
        raise _Declined("reads an attribute of it")
    device, name = binding.target
    prefix = api.torch_name(binding.function) or "torch"
    return _rewrite(ctx, use, f"{prefix}.amp.{name}", device, name)


def _refuse_escapes(ctx, api, binding: Binding, uses: list[Use]) -> None:
    """Decline when rewriting the uses could miss one or change what a name means: the name is
    bound to something else too, seen by other modules, probed as a feature, or used in a
    fallback."""
    local = binding.local
    if api.ambiguous(local):
        raise _Declined(f"`{local}` is also bound to something else in this module")
    if local in api.exported or ctx.path.endswith("__init__.py"):
        raise _Declined(f"`{local}` is re-exported, so other modules may import it from here")
    if binding.guarded:
        raise _Declined("the import is a feature probe in a `try` block")
    for use in uses:
        if use.fallback:
            raise _Declined(f"the use on line {ctx.line_of(use.node)} is compatibility code")


def _statement_edits(ctx, api, bindings: list[Binding]) -> list[Edit]:
    """One edit per import statement, adding `import torch` ahead of the first statement of each
    block whose names are rewritten to `torch.amp...` where nothing binds `torch`."""
    by_statement: dict[int, list[Binding]] = {}
    for binding in bindings:
        by_statement.setdefault(id(binding.statement), []).append(binding)
    needs_torch: set[int] = set()
    for group in by_statement.values():
        first = group[0]
        wants = any(not b.is_module and api.torch_name(b.function) is None for b in group)
        if wants and first.block not in needs_torch:
            needs_torch.add(first.block)
            group[0] = _Carrier(first)
    return [e for group in by_statement.values() for e in _statement_edit(ctx, group)]


class _Carrier:
    """Marks the binding whose statement edit also brings in `import torch`."""

    def __init__(self, binding: Binding) -> None:
        self.binding = binding


def _statement_edit(ctx, group: list) -> list[Edit]:
    add_torch = isinstance(group[0], _Carrier)
    bindings = [g.binding if isinstance(g, _Carrier) else g for g in group]
    first = bindings[0]
    if first.is_module:
        return _retarget_modules(ctx, bindings)
    return [_drop_aliases(ctx, first, {id(b.alias) for b in bindings}, add_torch)]


# --- rewriting one use ------------------------------------------------------------------------


def _rewrite(ctx, use: Use, callee: str | None, device: str, name: str) -> list[Edit]:
    """Edits turning one use into its `torch.amp` form; `callee` None keeps the spelling."""
    spelled = callee or dotted(use.node)
    renamed = [ctx.replace(use.node, callee)] if callee else []
    if use.role == "annotation":
        return renamed
    if use.role == "decorator":
        if not name.startswith("custom_"):
            raise _Declined("is a bare decorator")
        return [ctx.replace(use.node, f'{spelled}(device_type="{device}")')]
    if use.role == "partial":
        return renamed + [_partial_device(ctx, use, device, name)]
    if use.role != "call":
        raise _Declined("is used as a value, not called")
    if name == "autocast":
        return renamed + _autocast_args(ctx, use.call, device)
    if name == "GradScaler":
        return renamed + _device_first(ctx, use.call, device, [])
    return renamed + [_append_device_type(ctx, use.call, device)]


def _partial_device(ctx, use: Use, device: str, name: str) -> Edit:
    """`partial(torch.cuda.amp.autocast, dtype=d)` -> `partial(torch.amp.autocast, "cuda",
    dtype=d)`: the device becomes the first bound argument (only keywords may follow, since the
    positional order changed)."""
    if name.startswith("custom_"):
        raise _Declined("is bound by `partial`")
    bound = use.call.args[1:]
    if name == "autocast" and any(a.keyword is None for a in bound):
        raise _Declined("is bound by `partial` with positional arguments, whose order changed")
    end = ctx.span(use.node)[1]
    return Edit(end, end, f', "{device}"')


def _autocast_args(ctx, call: cst.Call, device: str) -> list[Edit]:
    """`autocast(a, b)` -> `autocast("cuda", enabled=a, dtype=b)`: each positional argument
    gets its keyword from the old order."""
    if any(arg.star == "*" for arg in call.args):
        raise _Declined("unpacks `*args`, whose order changed")
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    if len(positional) > len(_AUTOCAST_ORDER):
        raise _Declined("passes more positional arguments than autocast takes")
    keywords = [f"{_AUTOCAST_ORDER[i]}=" for i in range(len(positional))]
    return _device_first(ctx, call, device, keywords)


def _device_first(ctx, call: cst.Call, device: str, keywords: list[str]) -> list[Edit]:
    """Insert the device as the first argument, and `keywords[i]` before positional `i`."""
    if not call.args:
        return [_fill_empty_args(ctx, call, f'"{device}"')]
    edits = []
    for index, arg in enumerate(call.args):
        start = ctx.span(arg)[0]
        keyword = keywords[index] if index < len(keywords) else ""
        text = (_device_argument(ctx, call, start, device) if index == 0 else "") + keyword
        if text:
            edits.append(Edit(start, start, text))
    return edits


def _device_argument(ctx, call: cst.Call, start: Position, device: str) -> str:
    """`"cuda", ` before the first argument, on a line of its own when the arguments are
    written one per line."""
    lead = ctx.lines[start.line - 1][: start.column]
    if start.line != ctx.span(call.func)[1].line and not lead.strip():
        return f'"{device}",\n{lead}'
    return f'"{device}", '


def _append_device_type(ctx, call: cst.Call, device: str) -> Edit:
    if not call.args:
        return _fill_empty_args(ctx, call, f'device_type="{device}"')
    end = ctx.span(call.args[-1].value)[1]
    return Edit(end, end, f', device_type="{device}"')


def _fill_empty_args(ctx, call: cst.Call, content: str) -> Edit:
    start = ctx.span(call.func)[1]
    end = ctx.span(call)[1]
    if start.line != end.line or not _EMPTY_ARGS.fullmatch(_slice(ctx, start, end).strip()):
        raise _Declined("has empty parentheses over several lines")
    return Edit(start, end, f"({content})")


# --- rewriting the import ----------------------------------------------------------------------


def _drop_aliases(ctx, binding: Binding, dropped: set[int], add_torch: bool) -> Edit:
    """Remove the names from their `from ... import` (the whole statement when none is left),
    with `import torch` in their place when nothing binds `torch` there."""
    statement = binding.statement
    line = binding.line
    kept = without_names(statement, dropped)
    if kept is not None:
        text = _EMPTY.code_for_node(kept)
        if add_torch:
            text = statement_before(ctx, statement, line, "import torch") + text
        return replace_statement(ctx, statement, line, text)
    if add_torch:
        return replace_statement(ctx, statement, line, "import torch")
    return remove_statement(ctx, statement, line, binding.alone_in_block)


def _retarget_modules(ctx, bindings: list[Binding]) -> list[Edit]:
    """`import torch.cuda.amp as amp` -> `import torch.amp as amp`; `from torch.cuda import
    amp` -> `from torch import amp` (split off when the statement imports more)."""
    first = bindings[0]
    statement = first.statement
    if isinstance(statement, cst.Import):
        return [ctx.replace(b.alias.name, "torch.amp") for b in bindings]
    kept = without_names(statement, {id(b.alias) for b in bindings})
    if kept is None:
        return [ctx.replace(statement.module, "torch")]
    moved = [b.alias.with_changes(comma=cst.MaybeSentinel.DEFAULT) for b in bindings]
    names = ", ".join(_EMPTY.code_for_node(a).strip() for a in moved)
    text = statement_before(ctx, statement, first.line, f"from torch import {names}")
    return [replace_statement(ctx, statement, first.line, text + _EMPTY.code_for_node(kept))]


# --- text helpers ---------------------------------------------------------------------------


def _device(binding: Binding) -> str:
    return binding.target[0] if binding.target else binding.full.split(".")[1]


def _modern(name: str, device: str) -> str:
    if name.startswith("custom_"):
        return f'torch.amp.{name}(..., device_type="{device}")'
    return f'torch.amp.{name}("{device}", ...)'


def _deprecated_module(binding: Binding) -> str:
    return ".".join(binding.full.split(".")[:3])


def _slice(ctx, start: Position, end: Position) -> str:
    return ctx.lines[start.line - 1][start.column : end.column]


def _join(numbers: list[int]) -> str:
    return ", ".join(str(n) for n in numbers)
