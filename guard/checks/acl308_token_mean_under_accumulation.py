"""ACL308 (heuristic warning): per-micro-batch token means averaged over an accumulation window.

At each backward the loss graph is searched near its root for a mean-reduced NLL/cross-entropy
node; its saved total weight is that micro-batch's valid-token count T_i (kept as a tensor, read
at the step boundary, so there is no host sync per micro-step). At the step, a token of
micro-batch i weighs 1/(k*T_i) instead of 1/T; the measured bias max_i |mean(T)/T_i - 1| is
reported when it exceeds `token_bias` (default 0.25; `guard.configure(token_bias=...)`). Counts
are local to this process. Sum-reduced losses normalised by a token count stay silent.
"""

from __future__ import annotations

from guard import _report
from guard.checks import _graph
from guard.checks._common import report

CODES = ("ACL308",)
OPTIONS = {"token_bias": 0.25}
_KEY = "ACL308_counts"


def install(tracker) -> None:
    pending: dict = {}

    def before_backward(tensors, via, **_) -> None:
        if tensors and via != "engine" and _report.enabled("ACL308"):
            pending["count"] = _graph.token_mean_count(tensors[0])

    def after_backward(states, **_) -> None:
        count = pending.pop("count", None)
        if count is None:
            return
        for st in states:
            st.extra.setdefault(_KEY, []).append(count)

    tracker.subscribe("backward_pre", before_backward)
    tracker.subscribe("backward", after_backward)
    tracker.subscribe("optimizer_step_pre", _before_step)
    tracker.subscribe("zero_grad", _forget)


def _forget(states, **_) -> None:
    for st in states:
        st.extra.pop(_KEY, None)


def _before_step(state, **_) -> None:
    counts = state.extra.pop(_KEY, None)
    if not counts or len(counts) < 2 or len(counts) != state.backwards:
        return
    tokens = [float(c) for c in counts]
    if min(tokens) <= 0:
        return
    mean = sum(tokens) / len(tokens)
    bias = max(abs(mean / t - 1) for t in tokens)
    if bias <= float(_report.option("token_bias", OPTIONS["token_bias"])):
        return
    shortest, longest = min(tokens), max(tokens)
    report(
        "ACL308",
        f"{len(tokens)} micro-batches with {shortest:g} to {longest:g} valid tokens were each "
        f"averaged over their own tokens, then over the window: a token of the shortest weighs "
        f"{longest / shortest:.1f}x one of the longest (bias {bias:.0%}); sum the token losses "
        "(reduction='sum') and divide by the window's token count",
        level="warning",
    )
