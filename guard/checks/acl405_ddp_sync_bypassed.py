"""ACL405 (error): data-parallel replicas whose weights silently differ across ranks.

DDP averages the gradients only of the parameters it registered when it was built, and only
when its gradient hooks fire. Loops that train "fine" on every rank while the replicas drift
apart: the model cast or moved after wrapping (`.double()`/`.float()`, `.cpu()`/`.cuda()`:
the hooks stay on the old tensors, pytorch/pytorch#104336), parameters put into the model after
wrapping, `require_backward_grad_sync` left False, forwards that bypass the wrapper on some code
path, and initial weights never broadcast (`DDP(..., init_sync=False)` with per-rank seeds).

So, with more than one process, for each optimizer that trains a DDP model's parameters: before
its first step, after its first step and then after every `replica_every`-th step (default 100;
`guard.configure(replica_every=M)` or ACCEL_GUARD_REPLICA_EVERY), one float64 checksum of those
parameters is compared across ranks with one all-reduce of four numbers (MAX of [c, -c, n, -n],
n the number of parameters summed). Every rank enters it at the same step counts (steps
attempted, fp16 skips included), whatever it saw, so the collectives pair up. The result stays on
the device and joins the step's one host read (`guard._step_reads`), so the finding may come a
step later; it names the step at which the replicas were first seen to differ and the last
checked step at which they agreed, and the likely cause when the guard saw one. The first
comparison after a step is read at once (one extra read per run), so a program that makes a
single step is judged; one still unread at exit is read then. Cost: a pass over the parameters
and a four-number all-reduce every M steps, far below 1% of a step at the default.

Only parameters each rank holds in its own memory are summed. A CPU parameter in shared memory
(`is_shared()`: a model built in the launching process and handed to `torch.multiprocessing.spawn`
as an argument) is one tensor for all the ranks, which every rank's optimizer writes, so its sum
on one rank races with the other ranks' steps and says nothing about replicas (there is one).
Ranks that summed different numbers of parameters (none, or only some in shared memory) are not
judged: every rank sees the counts in the same all-reduce and skips alike.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass, field

import torch

from guard import _report, distributed, sources
from guard.checks._common import report

CODES = ("ACL405",)
OPTIONS = {"replica_every": 100}


@dataclass
class _Replicas:
    """One optimizer's replica checks (`OptState.of`)."""

    attempts: int = 0  # steps attempted (fp16 steps the scaler skipped included)
    agreed_at: int | None = None  # the last checked step at which the ranks agreed
    differed: bool = False
    synced: bool = False  # a synced DDP forward ran since the last step
    unsynced_steps: list = field(default_factory=list)  # steps that followed no synced forward


@dataclass
class _Wrapped:
    """What a DDP wrapper registered when it was built."""

    params: set = field(default_factory=set)  # ids of the parameters DDP registered
    accumulators: dict = field(default_factory=dict)  # id -> the gradient accumulator DDP hooked


def install(tracker) -> None:
    sources.ensure(tracker, "ddp", "finish")
    wrappers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DDP module -> _Wrapped

    def created(module, **_) -> None:
        wrappers[module] = _registered(module)

    def forward(module, sync, **_) -> None:
        wrappers.setdefault(module, _Wrapped())
        if sync:
            for st in tracker.owners(_first_param(module)):
                _replicas(st).synced = True

    def before_step(optimizer, state, **_) -> None:
        rep = _replicas(state)
        if state.backwards and not rep.synced and wrappers:
            rep.unsynced_steps.append(rep.attempts + 1)
        rep.synced = False
        if rep.attempts == 0 and rep.agreed_at is None:
            _compare(tracker.reads, optimizer, rep, wrappers, step=0)

    def after_step(optimizer, state, **_) -> None:
        rep = _replicas(state)
        rep.attempts += 1
        every = max(1, int(_report.option("replica_every", OPTIONS["replica_every"])))
        if rep.attempts == 1 or rep.attempts % every == 0:
            _compare(tracker.reads, optimizer, rep, wrappers, step=rep.attempts)

    def after_scaler_step(optimizer, state, ran, **_) -> None:
        if not ran:  # a skipped fp16 step is an attempt too: every rank counts it alike
            after_step(optimizer, state)

    def at_finish(**_) -> None:
        try:  # a comparison of the last steps, already all-reduced: a read, no collective
            tracker.reads.flush()
        except _report.GuardError as error:  # raise mode: nothing left to stop, so say it
            print(f"accel-guard: {error}", file=sys.stderr)
            raise

    tracker.subscribe("ddp_created", created)
    tracker.subscribe("ddp_forward", forward)
    tracker.subscribe("optimizer_step_pre", before_step, when="ddp")
    tracker.subscribe("optimizer_step", after_step, when="ddp")
    tracker.subscribe("scaler_step", after_scaler_step, when="ddp")
    tracker.subscribe("finish", at_finish, when="ddp")


def _replicas(state) -> _Replicas:
    return state.of(_Replicas)


def _first_param(module) -> list:
    first = next(module.parameters(), None)
    return [first] if first is not None else []


def _synced_params(module) -> list:
    """The parameters a DDP wrapper keeps equal across its ranks: trainable, not in its
    `parameters_to_ignore` (left local on purpose), not sharded (a DTensor differs by rank)."""
    ignored = getattr(module, "parameters_to_ignore", ()) or ()
    return [
        p
        for name, p in module.module.named_parameters()
        if p.requires_grad and name not in ignored and not hasattr(p, "device_mesh")
    ]


def _registered(module) -> _Wrapped:
    params = _synced_params(module)
    return _Wrapped({id(p) for p in params}, {id(p): _accumulator(p) for p in params})


def _accumulator(param):
    """The autograd node that accumulates `param`'s gradient, which DDP's hooks hang on. Casting
    or moving a parameter in place (`module.double()`, `.cpu()` after wrapping) gives it a new
    node, so comparing nodes tells exactly which parameters DDP no longer hears (their storage
    address cannot: the allocator may hand the new tensor the old address)."""
    with torch.enable_grad():
        return param.view_as(param).grad_fn.next_functions[0][0]


def _replicated_params(optimizer, modules) -> list:
    """The optimizer's parameters that its DDP models keep equal now (in the optimizer's order,
    the same on every rank); parameters of models that are not DDP-wrapped may differ across
    ranks on purpose and are left out."""
    in_ddp = {id(p) for m in modules for p in _synced_params(m)}
    return [p for g in optimizer.param_groups for p in g["params"] if id(p) in in_ddp]


def _own_memory(param) -> bool:
    """Whether this rank's copy is its own: a CPU tensor in shared memory may be every rank's
    (CUDA storages always say shared, and each rank's GPU holds its own)."""
    return param.device.type != "cpu" or not param.is_shared()


def _collective_device(group) -> torch.device:
    if torch.distributed.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _compare(reads, optimizer, rep: _Replicas, wrappers, step: int) -> None:
    """Enter the all-reduce of the checksum (every rank at the same step) and defer its read."""
    if rep.differed or distributed.world_size() < 2 or not _report.enabled("ACL405"):
        return
    modules = [m for m in list(wrappers) if _trains(m, optimizer)]
    params = _replicated_params(optimizer, modules)
    if not params:
        return
    group = getattr(modules[-1], "process_group", None)  # the ranks that replicate this model
    own = [p for p in params if _own_memory(p)]
    device = _collective_device(group)
    if own:
        local = torch.stack([p.detach().sum(dtype=torch.float64) for p in own]).sum().to(device)
    else:  # nothing of its own to compare: still enter the collective, as every rank does
        local = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.tensor(float(len(own)), dtype=torch.float64, device=device)
    # MAX of [c, -c, n, -n]: the extreme checksums and the extreme numbers of parameters summed
    values = torch.stack([local, -local, count, -count])
    torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX, group=group)
    opt_ref = weakref.ref(optimizer)
    reads.defer([values], lambda read: _judge(read[0], rep, step, opt_ref(), wrappers))
    if step == 1:  # the first step's comparison is judged now, even if the program ends here
        reads.read()


def _judge(values: list[float], rep: _Replicas, step: int, optimizer, wrappers) -> None:
    highest, lowest, most, fewest = values[0], -values[1], values[2], -values[3]
    if fewest == 0 or most != fewest:
        return  # some rank's weights are (partly) in shared memory: not replicas to compare
    if highest == lowest:
        rep.agreed_at = step
        return
    rep.differed = True
    when = "before the first optimizer step" if step == 0 else f"after optimizer step {step}"
    since = (
        ""
        if step == 0
        else " (first check)"
        if rep.agreed_at is None
        else f" (they agreed after step {rep.agreed_at})"
        if rep.agreed_at
        else " (they agreed before the first step)"
    )
    causes = _likely_causes(rep, step, optimizer, wrappers) if optimizer is not None else []
    cause = "; ".join(causes) if causes else _UNKNOWN
    report(
        "ACL405",
        f"the data-parallel replicas' weights differ across ranks {when}{since}: checksums "
        f"{lowest:.17g} to {highest:.17g}; every rank now trains a different model. "
        f"Likely cause: {cause}",
    )


_UNKNOWN = (
    "not seen by the guard (look for a model cast or moved after wrapping, parameters put in "
    "after wrapping, require_backward_grad_sync, forwards that bypass the DDP wrapper, or a "
    "per-rank update outside DDP)"
)


def _likely_causes(rep: _Replicas, step: int, optimizer, wrappers) -> list[str]:
    causes = []
    if step == 0:
        causes.append(
            "the ranks started from different weights: the initial weights were not broadcast "
            "(DDP(..., init_sync=False) with a per-rank seed); seed every rank alike or let DDP "
            "broadcast rank 0's weights"
        )
    modules = [m for m in list(wrappers) if _trains(m, optimizer)]
    if any(not getattr(m, "require_backward_grad_sync", True) for m in modules):
        causes.append(
            "require_backward_grad_sync is False on the DDP model (set by hand and never set "
            "back), so its backward passes never all-reduce"
        )
    causes.extend(_registration_causes(modules, optimizer, wrappers))
    if rep.unsynced_steps:
        causes.append(
            f"optimizer step(s) {_steps(rep.unsynced_steps)} followed no forward through the DDP "
            "wrapper with gradient sync on (a code path that calls the inner module)"
        )
    return causes


def _registration_causes(modules, optimizer, wrappers) -> list[str]:
    causes = []
    for module in modules:
        wrapped = wrappers.get(module)
        if wrapped is None or not wrapped.params:
            continue  # built before the guard was installed: unknown
        params = [p for p in module.parameters() if p.requires_grad]
        moved = [
            p
            for p in params
            if id(p) in wrapped.accumulators and wrapped.accumulators[id(p)] is not _accumulator(p)
        ]
        added = [p for p in params if id(p) not in wrapped.params]
        if moved:
            causes.append(
                f"{len(moved)} parameter(s) of the wrapped model got new tensors after wrapping "
                "(the model was cast or moved: .double()/.float(), .cpu()/.cuda(), .to(...)), "
                "so DDP's gradient hooks no longer fire (pytorch/pytorch#104336); cast and "
                "move the model before wrapping it"
            )
        if added:
            causes.append(
                f"{len(added)} trainable parameter(s) were put into the model after wrapping "
                "(e.g. a replaced layer): DDP never registered them and their gradients stay "
                "local; wrap the model after changing it"
            )
    return causes


def _trains(module, optimizer) -> bool:
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return any(id(p) in owned for p in module.parameters())


def _steps(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:5]))
    return shown + (f" and {len(steps) - 5} more" if len(steps) > 5 else "")
