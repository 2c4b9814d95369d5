"""ACL308 (heuristic warning): per-micro-batch token means averaged over an accumulation window.

At each backward the loss graph is searched near its root for a mean-reduced NLL/cross-entropy
node; its saved total weight is that micro-batch's valid-token count T_i (kept as a tensor, read
at the step boundary, so there is no host sync per micro-step). At the step, a token of
micro-batch i weighs 1/(k*T_i) instead of 1/T; the measured bias max_i |mean(T)/T_i - 1| is
reported when it exceeds `token_bias` (default 0.25; `guard.configure(token_bias=...)`).
Sum-reduced losses normalised by a token count stay silent, and so do windows in which no target
was ignored: their counts differ only by the number of targets, i.e. a short last batch of the
epoch (an HF Trainer sequence-classification run), which weighs its samples as any loop without
accumulation does; that is the loader's tail, not a token mean (each count keeps its number of
targets, from the shape, so this costs no read). Windows are measured on a sample:
the first 8 optimizer steps and every 16th after (the tracker's sampled windows).

Under DDP (W > 1, an optimizer of a DDP model) the window spans all ranks: at every step of such
an optimizer each rank contributes [complete, n, sum, min, max] of its own T_i to one small
all_gather, whether or not it saw a token mean (a collective must be entered by every rank, and
ranks may differ in what they saw), so all ranks judge the same numbers and report alike. The
bias needs only those five numbers: mean(T)/T_i is monotonic in T_i, so its extremes sit at the
shortest and the longest micro-batch. Windows where some rank had a backward without a token mean
are not judged. Optimizers of the guard's own Engine are left to the engine, which does the same.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass

import torch

from guard import _report, distributed, sources
from guard._tracker_state import sampled_window
from guard.checks import _graph
from guard.checks._common import report

CODES = ("ACL308",)
OPTIONS = {"token_bias": 0.25}


@dataclass
class TokenCounts:
    """ACL308's state of one optimizer (`OptState.of`)."""

    counts: list | None = None  # (token count, targets) of this window's backward passes
    ddp_known: int = -1  # the number of DDP modules known when `trains_ddp` was computed
    trains_ddp: bool = False


def install(tracker) -> None:
    sources.ensure(tracker, "ddp")
    pending: dict = {}
    ddp_modules: weakref.WeakSet = weakref.WeakSet()

    def before_backward(tensors, via, **_) -> None:
        if not tensors or via == "engine":
            return
        if _report.enabled("ACL308"):
            pending["count"] = _graph.token_mean_count(tensors[0])

    def after_backward(states, **_) -> None:
        count = pending.pop("count", None)
        if count is None:
            return
        for st in states:
            tokens = st.of(TokenCounts)
            if tokens.counts is None:
                tokens.counts = []
            tokens.counts.append(count)

    def saw_ddp(module, **_) -> None:
        ddp_modules.add(module)

    def before_step(optimizer, state, **_) -> None:
        tokens = state.of(TokenCounts)
        counts, tokens.counts = tokens.counts, None
        if not sampled_window(state.steps):
            return
        complete = bool(counts) and len(counts) == state.backwards
        if _across_ranks(state, optimizer, ddp_modules):
            judge(gathered_rows(counts if complete else None), distributed.world_size())
        elif complete and len(counts) >= 2:  # judged at the step's one host read
            targets = _targets(counts)
            tracker.reads.defer(
                [total for total, _ in counts], lambda values: judge([_row_of(values, targets)], 1)
            )

    tracker.subscribe("backward_pre", before_backward, sampled=True)
    tracker.subscribe("backward", after_backward, sampled=True)
    tracker.subscribe("ddp_created", saw_ddp)
    tracker.subscribe("ddp_forward", saw_ddp)
    # counts exist only from sampled windows, and sampling changes only at a step: the step and a
    # zero_grad of the same window see the same answer
    tracker.subscribe("optimizer_step_pre", before_step, sampled=True)
    tracker.subscribe("zero_grad", _forget, sampled=True)


def _forget(states, **_) -> None:
    for st in states:
        st.of(TokenCounts).counts = None


def _across_ranks(state, optimizer, ddp_modules) -> bool:
    """Whether this step's counts are gathered: the same answer on every rank of a DDP run."""
    if distributed.world_size() < 2 or not _report.enabled("ACL308") or _engine_owned(state):
        return False
    tokens = state.of(TokenCounts)
    if not tokens.trains_ddp and tokens.ddp_known != len(ddp_modules):  # a new DDP model
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        tokens.trains_ddp = any(id(p) in owned for m in list(ddp_modules) for p in m.parameters())
        tokens.ddp_known = len(ddp_modules)
    return tokens.trains_ddp


def _engine_owned(state) -> bool:
    engine = sys.modules.get("guard.engine")
    return engine is not None and isinstance(state.prepared_by, engine.Engine)


def _targets(counts: list) -> float:
    return float(sum(targets for _, targets in counts))


def _row(counts: list) -> torch.Tensor:
    """[complete, n, sum, min, max, ignored] of one rank's (token count, targets) pairs, on
    their device (no host read); `ignored` is the number of targets that were not counted."""
    tokens = torch.stack([torch.as_tensor(total) for total, _ in counts]).double()
    n = torch.full((1,), float(len(counts)), dtype=torch.float64, device=tokens.device)
    stats = torch.stack([tokens.sum(), tokens.min(), tokens.max(), _targets(counts) - tokens.sum()])
    return torch.cat([torch.ones_like(n), n, stats])


def local_row(counts: list) -> list[float]:
    """`_row` for one process from one kernel and one host read (`_row` runs eight kernels)."""
    tokens = torch.stack([torch.as_tensor(total) for total, _ in counts]).tolist()
    return [
        1.0,
        float(len(tokens)),
        sum(tokens),
        min(tokens),
        max(tokens),
        _targets(counts) - sum(tokens),
    ]


def _row_of(values: list[list[float]], targets: float) -> list[float]:
    """`local_row` from token counts already read (`StepReads` values)."""
    tokens = [row[0] for row in values]
    return [1.0, float(len(tokens)), sum(tokens), min(tokens), max(tokens), targets - sum(tokens)]


def gathered_rows(counts: list | None) -> list[list[float]]:
    """Every rank's row (zeros for a rank with no complete window): one all_gather, one read."""
    device = distributed.collective_device()
    row = _row(counts).to(device) if counts else torch.zeros(6, dtype=torch.float64, device=device)
    return distributed.gather(row.unsqueeze(0)).tolist()


RAW_ADVICE = "sum the token losses (reduction='sum') and divide by the window's token count"


def judge(rows: list[list[float]], world: int, advice: str = RAW_ADVICE) -> None:
    """Report when every rank's window is complete and the measured bias exceeds `token_bias`."""
    if not all(complete for complete, *_ in rows):
        return
    if not any(row[5] != 0 for row in rows):
        return  # no target ignored anywhere: the counts differ by batch size only (a short tail)
    n = int(sum(row[1] for row in rows))
    shortest, longest = min(row[3] for row in rows), max(row[4] for row in rows)
    if n < 2 or shortest <= 0:
        return
    mean = sum(row[2] for row in rows) / n
    bias = max(mean / shortest - 1, 1 - mean / longest)
    if bias <= float(_report.option("token_bias", OPTIONS["token_bias"])):
        return
    where = f" (all {world} ranks)" if world > 1 else ""
    report(
        "ACL308",
        f"{n} micro-batches{where} with {shortest:g} to {longest:g} valid tokens were each "
        f"averaged over their own tokens, then over the window: a token of the shortest weighs "
        f"{longest / shortest:.1f}x one of the longest (bias {bias:.0%}); {advice}",
        level="warning",
    )


ENGINE_ADVICE = "use engine.backward(loss_sum, num_items=valid_tokens) for the exact token mean"


class EngineTokenMeans:
    """The engine's case: token means averaged over a window (and ranks) with very different
    token counts.

    Each backward's mean-reduced NLL node gives that micro-batch's valid-token count T_i (a
    tensor, no host read); at the update step the counts of all ranks are gathered and the bias
    max_i |mean(T) / T_i - 1| is reported above `token_bias` (the guard's option, default 0.25).
    """

    def __init__(self) -> None:
        self._counts: list[torch.Tensor] = []
        self._calls = 0

    def record(self, loss: torch.Tensor) -> None:
        self._calls += 1
        count = _graph.token_mean_count(loss)
        if count is not None:
            self._counts.append(count)

    def check(self, world: int) -> None:
        """Once per update step. With W > 1 every rank enters the gather, whatever it saw (a
        collective entered by some ranks only would pair with the next one, or hang)."""
        counts, calls = self._counts, self._calls
        self._counts, self._calls = [], 0
        if not _report.enabled("ACL308"):  # the same answer on every rank
            return
        complete = bool(counts) and len(counts) == calls
        if world > 1:
            rows = gathered_rows(counts if complete else None)
            judge(rows, world, ENGINE_ADVICE)
        elif complete and len(counts) >= 2:
            judge([local_row(counts)], 1, ENGINE_ADVICE)
