"""ACL308: a per-micro-batch token mean averaged again over the accumulation window."""

from __future__ import annotations

from linter.context import RuleContext
from linter.model.config_space import gate_configuration
from linter.model.cst_util import code
from linter.model.losses import accumulates, token_means


def check(ctx: RuleContext) -> None:
    """Report each token-level mean loss that reaches a backward inside an accumulation window
    (once per loss, however many backwards it feeds)."""
    model = ctx.model
    reported: set[int] = set()
    for loop in model.loops:
        for site in loop.backwards:
            gate = model.gate_for(loop, site.stmt)
            if not accumulates(model, gate):
                continue
            k = gate.k if gate.k is not None else model.engine_k()
            for found in token_means(model, site):
                if id(found.node) not in reported:
                    reported.add(id(found.node))
                    config = gate_configuration(model, gate, site.stmt.scope)
                    ctx.report(found.node, _message(found, k), configuration=config)


def _message(found, k) -> str:
    window = f"K = `{code(k)}`" if k is not None else "K"
    return (
        f"{found.what} averages over the valid tokens of each micro-batch, and the window of "
        f"{window} micro-batches averages those means again: a token of a short micro-batch "
        "weighs more than one of a long micro-batch, which biases the gradient. Sum the token "
        'losses (`reduction="sum"`) and divide by the valid-token count of the whole window '
        "(gathered across processes), or pass `num_items_in_batch=` to a model that takes it; "
        "packed or equal-length batches have no bias (then mark the line `# noqa: ACL308`)"
    )
