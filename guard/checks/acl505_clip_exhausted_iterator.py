"""ACL505: a clip call that receives no parameters while optimizers hold trainable ones.

The tracker materialises the clip's argument; an empty list there almost always means a
`filter(...)`/generator already consumed by the optimizer's constructor, so clipping silently
does nothing. Raised before the clip (and so before the unclipped step).
"""

from __future__ import annotations

from guard.checks._common import report

CODES = ("ACL505",)


def install(tracker) -> None:
    def before_clip(kind, parameters, **_) -> None:
        if parameters:
            return
        trainable = sum(
            1
            for st in list(tracker.optimizers.values())
            if st.optimizer is not None
            for g in st.optimizer.param_groups
            for p in g["params"]
            if p.requires_grad
        )
        if trainable:
            report(
                "ACL505",
                f"clip_grad_{kind}_ received no parameters while the optimizers hold {trainable} "
                "trainable ones: the iterator passed to it (filter, map, a generator or "
                "model.parameters() kept in a variable) was already consumed, so nothing is "
                "clipped; bind the parameters to a list: params = [p for p in ... ]",
            )

    tracker.subscribe("clip", before_clip)
