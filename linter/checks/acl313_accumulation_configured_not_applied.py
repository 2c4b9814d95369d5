"""ACL313: K sizes the schedule, the learning rate or the batch, but no loop accumulates."""

from __future__ import annotations

from linter.context import RuleContext
from linter.model import accumulation, k_reads
from linter.model.config_space import k_configuration
from linter.model.cst_util import code
from linter.model.kinds import ReadKind

# Reads that show K is applied somewhere (or may be, out of sight).
_APPLIED = (ReadKind.ENGINE, ReadKind.GATE, ReadKind.DIVISION, ReadKind.CALL)


def check(ctx: RuleContext) -> None:
    """Report the first arithmetic read of K in a module whose training loops step every batch."""
    model = ctx.model
    stepping = [loop for loop in model.loops if loop.backwards and loop.steps]
    if not stepping or any(loop.gate is not None for loop in model.loops):
        return
    if any(c.accumulates is not False for c in accumulation.configurations(model).values()):
        return  # an engine accumulates (or its configuration is out of sight)
    reads = k_reads.k_reads(model)
    if any(r.kind in _APPLIED for r in reads):
        return
    arithmetic = [r for r in reads if r.kind == ReadKind.ARITHMETIC]
    if not arithmetic:
        return
    read = arithmetic[0]
    sized = f"`{read.target}`" if read.target else "the step arithmetic"
    where = ctx.line_of(stepping[0].node)
    ctx.report(
        read.node,
        f"`{code(read.node)}` sizes {sized}, but no loop accumulates: the loop at line {where} "
        "steps the optimizer on every micro-batch, so the schedule, learning rate or batch size "
        "computed with it describes batches that never exist; gate the step on it and divide "
        "the loss, or drop it from the arithmetic",
        configuration=k_configuration(model, read.node, read.stmt.scope),
    )
