"""Loss scaling and the loss of a backward: which tensor a backward starts from, and whether it
went through `scaler.scale` (directly, in an arm of a conditional, or through a name)."""

from __future__ import annotations

import libcst as cst

from linter.model.cst_util import code, dotted, method_call, positional, strip_parens
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import Scope, Stmt
from linter.model.kinds import SiteKind
from linter.model.loops import Site
from linter.model.roles import Roles


class Scaling:
    def __init__(self, roles: Roles, imports) -> None:
        self.roles = roles
        self.imports = imports

    def is_backward_function(self, call: cst.Call) -> bool:
        """`torch.autograd.backward(loss)` rather than `loss.backward()`."""
        return self.imports.qualify(call.func) == "torch.autograd.backward"

    def loss_expr(self, site: Site) -> cst.BaseExpression | None:
        """The loss a backward site starts from (inside `scaler.scale(...)` when scaled)."""
        call = site.call
        if call is None or site.loss is not None:
            return site.loss
        if site.kind == SiteKind.ENGINE_BACKWARD or self.is_backward_function(call):
            args = positional(call)
            return args[0] if args else None
        receiver = call.func.value
        scaled = self.scaled_loss(receiver, site.stmt.scope)
        return scaled if scaled is not None else receiver

    def scaled_loss(self, node: cst.CSTNode, scope: Scope) -> cst.BaseExpression | None:
        """`X` in `scaler.scale(X)`."""
        pair = method_call(node)
        if pair is not None and pair[1] == "scale" and positional(node):
            if self.roles.scaler_role(dotted(pair[0]), scope) is not None or "scal" in code(
                pair[0]
            ):
                return positional(node)[0]
        return None

    def is_scaled_loss(self, node: cst.CSTNode, scope: Scope, order: int) -> bool:
        """Whether the tensor a backward starts from (at statement `order`) went through
        `scaler.scale`: directly, in an arm of `scaler.scale(loss) if amp else loss` (the other
        arm is a deliberate fp32 path), or through a name bound to one."""
        return self._scaled_value(node, scope, order, 0)

    def scale_loss_source(self, name: str, scope: Scope) -> cst.BaseExpression | None:
        """`X` for a name bound by apex's `with amp.scale_loss(X, opt) as name:`."""
        for with_node, _ in scope.withs:
            for item in with_node.items:
                target = item.asname.name if item.asname is not None else None
                pair = method_call(item.item)
                if dotted(target) == name and pair is not None and pair[1] == "scale_loss":
                    args = positional(item.item)
                    return args[0] if args else None
        return None

    def names_a_sequence(self, expr: cst.BaseExpression, stmt: Stmt) -> bool:
        """A name bound to a list or tuple of losses (`torch.autograd.backward(losses)`): a fix
        that divides it (`losses / K`) or hands it to an engine would not run."""
        if not isinstance(expr, cst.Name):
            return False
        defs = stmt.scope.defs_before(expr.value, stmt.order)
        if not defs or defs[-1].op != "=" or defs[-1].tuple_index is not None:
            return False
        value = defs[-1].value
        if isinstance(value, cst.Call):
            return dotted(value.func) in ("list", "tuple")
        return isinstance(value, (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp))

    def _names_a_scaled_loss(self, node: cst.CSTNode, scope: Scope, order: int, depth: int) -> bool:
        """A name last bound (before statement `order`) to a scaled loss, also after arithmetic:
        `scaled = scaler.scale(loss)`, `scaled = scaled / K` (or `scaled /= K`), then
        `scaled.backward()`."""
        text = dotted(node)
        defs = scope.defs_before(text, order) if text else []
        if not defs or defs[-1].tuple_index is not None or depth > FOLLOW_DEPTH:
            return False
        d = defs[-1]
        if d.op != "=":  # `scaled /= K` keeps what `scaled` held
            return self._names_a_scaled_loss(node, scope, d.stmt.order, depth + 1)
        return self._scaled_value(d.value, scope, d.stmt.order, depth + 1)

    def _scaled_value(self, value: cst.CSTNode, scope: Scope, order: int, depth: int) -> bool:
        value = strip_parens(value)
        if self.scaled_loss(value, scope) is not None:
            return True
        if isinstance(value, cst.BinaryOperation):
            sides = (value.left, value.right)
            return any(self._scaled_value(side, scope, order, depth) for side in sides)
        if isinstance(value, cst.IfExp):
            arms = (value.body, value.orelse)
            return any(self._scaled_value(arm, scope, order, depth) for arm in arms)
        return dotted(value) is not None and self._names_a_scaled_loss(value, scope, order, depth)
