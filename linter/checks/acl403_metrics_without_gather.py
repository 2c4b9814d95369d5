"""ACL403: evaluation metrics fed by `accelerator.gather` (padding counted) or by one shard."""

from __future__ import annotations

from linter.context import RuleContext, make_fix
from linter.model.gathers import metric_gathers, ungathered_metrics
from linter.types import Configuration


def check(ctx: RuleContext) -> None:
    """Report metric-bound gathers (fixed to `gather_for_metrics`) and un-gathered metrics."""
    for found in metric_gathers(ctx.model):
        attr = found.call.func.attr
        fix = make_fix("Use `gather_for_metrics`", ctx.replace(attr, "gather_for_metrics"))
        ctx.report(
            found.call,
            f"`{found.engine}.gather` in evaluation feeds {found.sink}: it keeps the samples "
            "repeated to pad the last batch, so the metric counts them (use "
            f"`{found.engine}.gather_for_metrics`)",
            fix,
        )
    for found in ungathered_metrics(ctx.model):
        if not found.counter:
            ctx.report(
                found.node,
                f"`{found.metric}` is updated from this process's predictions only: over a "
                "prepared loader each process sees 1/W of the data (gather them first with "
                "`accelerator.gather_for_metrics`)",
                configuration=_MULTI_PROCESS,
            )
            continue
        ctx.report(
            found.node,
            f"`{found.metric}` counts the correct predictions of this process's shard only: "
            "over a prepared loader each process evaluates 1/W of the data, so the metric "
            "computed from it describes one shard (gather predictions and labels with "
            "`accelerator.gather_for_metrics` first, or `accelerator.reduce` the counts)",
            configuration=_MULTI_PROCESS,
        )


# One process evaluates the whole loader: the metric is then the dataset's.
_MULTI_PROCESS = Configuration(
    affects_default=False,
    condition="under a multi-process launch (`accelerate launch`, `torchrun`), where each "
    "process evaluates its own shard",
    knobs=("num_processes",),
)
