"""ACL105: a GradScaler in a module that trains in bf16 and has no fp16 path."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.model import precision_runs
from linter.model.cst_util import children, dotted, keyword, method_call, positional, string_value
from linter.model.param_dtypes import param_casts
from linter.model.precision import (
    BF16,
    autocasts,
    bf16_sources,
    engines,
    has_fp16_path,
    live_scalers,
    scalers_on_under_bf16,
)
from linter.types import Configuration, Edit, Position

_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)


def check(ctx: RuleContext) -> None:
    """Report scalers that are on whenever the run is bf16, when the module's only low
    precision is bf16: a bf16 autocast or a bf16 engine, and nothing that runs fp16. A warning
    (wasted work), an error where `unscale_` fails: trained bf16 parameters on CUDA."""
    model = ctx.model
    scalers = scalers_on_under_bf16(model)
    sources = bf16_sources(model)
    if not scalers or not sources or has_fp16_path(model):
        for scaler in live_scalers(model):
            _report_configured(ctx, scaler)
        return
    bf16_params = _trained_bf16(model)
    for scaler in scalers:
        fix = make_fix(
            f"Remove `{scaler.name}` and call the optimizer directly",
            *_removal(ctx, scaler),
        )
        helper_call = _helper_building(model, scaler)
        how = (
            ""
            if fix is not None
            else f"; it is built by `{dotted(helper_call.func)}()`, so remove it by hand"
            if helper_call is not None
            else "; it is used in other ways too (state_dict, arguments), so remove it by hand"
        )
        crash = bf16_params if bf16_params and not _on_cpu(ctx, scaler.node) else None
        ctx.report(
            scaler.node if helper_call is None else helper_call,  # where the name gets it
            f"GradScaler `{scaler.name}` in a bf16 run ({sources[0]}): "
            + (_crash_text(ctx, crash) if crash else _waste_text())
            + f" (drop the scaler: `loss.backward()`, `opt.step()`{how})",
            fix,
            severity="error" if crash else None,
        )


def _helper_building(model, scaler) -> cst.Call | None:
    """The call of a module (or project) function the scaler's name is bound to, when the
    construction is in that helper (`scaler = get_grad_scaler()`): the line to change is the
    caller's, since the helper may serve other callers."""
    for d in model.module_defs(scaler.name):
        value = d.value
        if isinstance(value, cst.Call) and value is not scaler.node:
            if model.local_function(value.func, d.stmt.scope) is not None:
                return value
    return None


def _report_configured(ctx: RuleContext, scaler) -> None:
    """A scaler on in the runs whose precision is bf16 only for some settings: `enabled=(dtype
    in ['float16', 'bfloat16'])`, an inverted `== 'bfloat16'`, a scaler built for a
    `--mixed_precision` the Accelerator also takes. No fix: under fp16 the scaler is needed."""
    model = ctx.model
    casts = [c for c in autocasts(model) if not c.by_engine and c.enabled is not False]
    built = engines(model)
    exprs = [precision_runs.construction_expr(model, scaler.node)]
    exprs += [precision_runs.cast_expr(model, c) for c in casts]
    exprs += precision_runs.engine_exprs(model, built)
    count = len(casts)

    def bad(values) -> bool:
        if not precision_runs.scaler_on(values[0]):
            return False
        regions, engine_values = values[1 : 1 + count], values[1 + count :]
        precisions = [precision_runs.engine_precision(v) for v in engine_values]
        bf16 = any(precision_runs.bf16_autocast(v) for v in regions) or "bf16" in precisions
        fp16 = any(precision_runs.may_be_fp16(v) for v in regions)
        return bf16 and not fp16 and all(p in ("bf16", "no") for p in precisions)

    verdict = precision_runs.runs_where(model, exprs, bad)
    if verdict is None or not verdict.condition.depends:
        return
    condition = verdict.condition
    ctx.report(
        scaler.node,
        f"GradScaler `{scaler.name}` is on in a bf16 run {condition.text}: "
        + _waste_text()
        + " (enable it for float16 only, keyed on the same setting as the autocast dtype)",
        configuration=Configuration(condition.affects_default, condition.text, condition.knobs),
    )


def _waste_text() -> str:
    return (
        "bf16 has fp32's range, so loss scaling gains nothing, adds a host sync per step and may "
        "skip steps that hold a real inf"
    )


def _crash_text(ctx: RuleContext, cast) -> str:
    return (
        f"`{cast.name}` is trained in bf16 (line {ctx.line_of(cast.node)}), so its gradients are "
        "bf16 and unscale_ fails at the first step (torch's CUDA unscale kernel is not "
        "implemented for BFloat16); loss scaling gains nothing under bf16 anyway"
    )


def _trained_bf16(model):
    """The first model cast to bf16 whose parameters an optimizer trains (not frozen)."""
    for cast in param_casts(model):
        if cast.dtype == BF16 and cast.trained and not cast.frozen:
            return cast
    return None


def _on_cpu(ctx: RuleContext, construction) -> bool:
    """`GradScaler("cpu")` / `torch.cpu.amp.GradScaler()`: the CPU kernel unscales bf16."""
    if not isinstance(construction, cst.Call):
        return False
    qual = ctx.model.imports.qualify(construction.func) or ""
    if qual.startswith("torch.cpu."):
        return True
    device = keyword(construction, "device")
    args = positional(construction)
    if device is None and args:
        device = args[0]
    return string_value(device) == "cpu" if device is not None else False


# the fix: delete the construction, rewrite its uses ---------------------------------------------
def _removal(ctx: RuleContext, scaler) -> list[Edit | None]:
    """The edits that take the scaler out, or `[None]` when one of its uses is not one of the
    four the fix knows (`scale(loss).backward()`, `step(opt)`, `update()`, `unscale_(opt)`) or
    a block would be left empty."""
    name = scaler.name
    edits: list[Edit | None] = []
    deleted = []
    handled = 0
    for scope in ctx.model.scopes:
        for stmt in scope.stmts:
            count = _occurrences(stmt.node, name)
            if not count:
                continue
            action = _rewrite(ctx, stmt, name, scaler.node)
            if action is None or count != 1:
                return [None]
            handled += 1
            if action == "delete":
                deleted.append(stmt)
            else:
                edits.append(action)
    if handled != _occurrences(ctx.model.module, name):
        return [None]  # a parameter, an `if scaler:` test, a keyword of that name ...
    edits.extend(_deletions(ctx, deleted))
    return edits


def _rewrite(ctx: RuleContext, stmt, name: str, construction) -> Edit | str | None:
    node = stmt.node
    if isinstance(node, cst.Assign):
        targets = [dotted(t.target) for t in node.targets]
        return "delete" if targets == [name] and node.value is construction else None
    if not isinstance(node, cst.Expr) or not isinstance(node.value, cst.Call):
        return None
    call = node.value
    pair = method_call(call)
    if pair is None:
        return None
    receiver, method = pair
    if dotted(receiver) == name:
        args = positional(call)
        if method == "update" and not call.args:
            return "delete"
        if method == "unscale_" and len(call.args) == 1 and len(args) == 1:
            return "delete"
        if method == "step" and len(call.args) == 1 and len(args) == 1:
            return ctx.replace(call, f"{_operand(ctx, args[0])}.step()")
        return None
    inner = method_call(receiver)
    if method == "backward" and inner is not None and dotted(inner[0]) == name:
        args = positional(receiver)
        if inner[1] == "scale" and len(receiver.args) == 1 and len(args) == 1:
            return ctx.replace(receiver, _operand(ctx, args[0]))
    return None


def _operand(ctx: RuleContext, node: cst.BaseExpression) -> str:
    """The text of an expression that becomes a method's receiver (parenthesised if needed)."""
    text = ctx.text(node)
    return text if isinstance(node, _ATOMS) or node.lpar else f"({text})"


def _occurrences(root: cst.CSTNode, name: str) -> int:
    """How often the scaler's name is read or bound in `root` (whole dotted names only)."""
    count = 0
    stack = [root]
    while stack:
        node = stack.pop()
        text = dotted(node)
        if text is not None:
            count += text == name or text.startswith(name + ".")
            continue
        stack.extend(children(node))
    return count


def _deletions(ctx: RuleContext, stmts) -> list[Edit | None]:
    """Remove whole small statements: their line when nothing else is on it, else the statement
    and its `;`. A block left with no statement cannot be fixed this way."""
    by_line: dict[int, list] = {}
    for stmt in stmts:
        by_line.setdefault(id(stmt.line), []).append(stmt)
    emptied: dict[int, int] = {}
    edits: list[Edit | None] = []
    for group in by_line.values():
        line = group[0].line
        if len(group) == len(line.body):
            block = _block_of(ctx, line)
            if block is None:
                return [None]
            emptied[id(block)] = emptied.get(id(block), 0) + 1
            if emptied[id(block)] >= len(block):
                return [None]
            first, last = ctx.span(line)[0].line, ctx.span(line)[1].line
            edits.append(Edit(Position(first, 0), Position(last + 1, 0), ""))
        else:
            edits.extend(_delete_small(ctx, line, stmt.index) for stmt in group)
    return edits


def _delete_small(ctx: RuleContext, line, index: int) -> Edit:
    smalls = line.body
    if index > 0:
        start = ctx.span(smalls[index - 1])[1]
        return Edit(start, ctx.span(smalls[index])[1], "")
    return Edit(ctx.span(smalls[0])[0], ctx.span(smalls[1])[0], "")


def _block_of(ctx: RuleContext, line) -> list | None:
    """The statements of the block that holds a statement line."""
    blocks = ctx.model.memo("acl105.blocks", _blocks)
    return blocks.get(id(line))


def _blocks(model) -> dict[int, list]:
    found: dict[int, list] = {}
    stack: list[cst.CSTNode] = [model.module]
    while stack:
        node = stack.pop()
        body = getattr(node, "body", None)
        if isinstance(node, (cst.Module, cst.IndentedBlock)):
            for statement in body:
                found[id(statement)] = list(body)
        for child in children(node):
            if isinstance(child, (cst.BaseCompoundStatement, cst.BaseSuite, cst.Else)):
                stack.append(child)
            elif isinstance(child, (cst.ExceptHandler, cst.Finally, cst.MatchCase)):
                stack.append(child)
    return found
