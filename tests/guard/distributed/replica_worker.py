"""Two gloo processes on CPU for ACL405's replica-consistency check: run as a script; each rank
writes one JSON file with, per case, what the guard reported (warn mode, so the loop trains on
and the replicas really drift) and whether the replicas' parameters are equal at the end.

Every case runs on both ranks in the same order (the guard's collectives must pair up). Each rank
draws its own batches, as a DistributedSampler would hand out different samples."""

from __future__ import annotations

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 6
WIDTH = 8


def make_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 2))


def batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(100 + rank)
    return [
        (torch.randn(4, WIDTH, generator=generator), torch.randint(0, 2, (4,), generator=generator))
        for _ in range(STEPS)
    ]


def train(model: nn.Module, params, rank: int, before_step=None) -> None:
    """A correct loop: forward through `model`, backward, SGD step on `params`."""
    opt = torch.optim.SGD(params, lr=0.5)
    for step, (x, y) in enumerate(batches(rank)):
        F.cross_entropy(model(x), y).backward()
        if before_step is not None:
            before_step(step)
        opt.step()
        opt.zero_grad()


def replicas_equal(module: nn.Module) -> bool:
    """Whether every rank holds the same parameters (all_gather of the flattened weights)."""
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, flat)
    return all(torch.equal(parts[0], p) for p in parts)


# -- the cases: each returns the module whose replicas are compared ------------------------------


def correct(rank: int) -> nn.Module:
    model = DDP(make_net())
    train(model, model.parameters(), rank)
    return model.module


def batchnorm_convnet(rank: int) -> nn.Module:
    """The published ResNet-18 examples' shape, small: convolutions with BatchNorm (running
    statistics broadcast by DDP at each forward), SGD with momentum and weight decay, a
    comparison after every step."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 2),
    )
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    generator = torch.Generator().manual_seed(200 + rank)
    for _ in range(STEPS):
        x = torch.randn(4, 3, 8, 8, generator=generator)
        y = torch.randint(0, 2, (4,), generator=generator)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return net


def dtype_round_trip(rank: int) -> nn.Module:
    """After wrapping, the model goes to float64 and back (on a GPU: .cpu() then .cuda()): its
    parameters get new tensors, DDP's gradient hooks sit on the old ones (pytorch#104336)."""
    model = DDP(make_net())
    model.double()
    model.float()
    train(model, model.parameters(), rank)
    return model.module


def sync_flag_left_false(rank: int) -> nn.Module:
    """`require_backward_grad_sync` switched off by hand (an accumulation helper) and never
    switched back."""
    model = DDP(make_net())
    model.require_backward_grad_sync = False
    train(model, model.parameters(), rank)
    return model.module


def params_replaced(rank: int) -> nn.Module:
    """A new head put into the wrapped module after wrapping (fine-tuning): DDP never registered
    its parameters, so their gradients stay local."""
    model = DDP(make_net(), find_unused_parameters=True)  # the old head gets no gradient
    torch.manual_seed(1)  # the same new head on every rank
    model.module[2] = nn.Linear(WIDTH, 2)
    train(model, model.parameters(), rank)
    return model.module


def no_initial_broadcast(rank: int) -> nn.Module:
    """Each rank seeds its own model and DDP skips the broadcast of rank 0's weights."""
    model = DDP(make_net(seed=rank), init_sync=False)
    train(model, model.parameters(), rank)
    return model.module


def fresh_wrapper_on_some_paths(rank: int) -> nn.Module:
    """Halfway through, the loop takes a code path that calls the inner module instead of the
    DDP wrapper: the gradients of those steps are never all-reduced."""
    net = make_net()
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step, (x, y) in enumerate(batches(rank)):
        forward = model if step < STEPS // 2 else net  # the other path skips the wrapper
        F.cross_entropy(forward(x), y).backward()
        opt.step()
        opt.zero_grad()
    return net


def rewrapped_every_run(rank: int) -> nn.Module:
    """HF-Trainer-style re-wrapping done right: every rank wraps the model again (a resumed
    run); the new wrapper broadcasts rank 0's weights and registers its own hooks."""
    net = make_net()
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step, (x, y) in enumerate(batches(rank)):
        if step == STEPS // 2:
            model = DDP(net)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return net


def ignored_head_local_on_purpose(rank: int) -> nn.Module:
    """A per-rank head that DDP is told to leave alone (`parameters_to_ignore`): it differs
    across ranks by design, the shared trunk stays equal."""
    net = make_net()
    torch.manual_seed(10 + rank)
    net[2] = nn.Linear(WIDTH, 2)
    DDP._set_params_and_buffers_to_ignore_for_model(net, ["2.weight", "2.bias"])
    model = DDP(net)
    train(model, model.parameters(), rank)
    return net  # the heads differ, by design


def spawn_handed_models(rank: int) -> nn.Module:
    """The published DDP examples' way on CPU: the model built in the launching process and handed
    to mp.spawn as an argument, so every rank's parameters are the same tensors in shared memory;
    AdamW, a barrier after each step. Run a few times: the checksums used to race with the other
    rank's step."""
    for net in HANDED["spawn_handed_models"]:
        model = DDP(net)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for x, y in batches(rank)[:3]:
            F.cross_entropy(model(x), y).backward()
            opt.step()
            dist.barrier()
            opt.zero_grad()
    return net


def cast_after_wrapping_single_step(rank: int) -> nn.Module:
    """pytorch#104336 with one optimizer step: the spawn-handed model cast to float64 after
    wrapping (each rank gets tensors of its own, out of DDP's hooks), then the program ends."""
    net = HANDED["cast_after_wrapping_single_step"][0]
    model = DDP(net)
    model.double()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = batches(rank)[0]
    F.cross_entropy(model(x.double()), y).backward()
    opt.step()
    return net


def drift_at_the_last_step(rank: int) -> nn.Module:
    """Each rank nudges its weights by hand after step 1 (a per-rank update outside DDP), and the
    run ends at step 2, a checked step: that comparison is read at exit (the guard's exit hook
    emits `finish`, emitted here since the case does not end the process)."""
    model = DDP(make_net())
    train(model, model.parameters(), rank, before_step=lambda step: _nudge(model, rank, step))
    from guard._tracker import TRACKER

    TRACKER.emit("finish")
    return model.module


def _nudge(model: nn.Module, rank: int, step: int) -> None:
    if step == 1:
        with torch.no_grad():
            model.module[0].bias.add_(0.01 * (rank + 1))


HANDED: dict = {}  # case -> the models built by the launching process for its current run
HANDED_COUNTS = {"spawn_handed_models": 3, "cast_after_wrapping_single_step": 1}


CASES = {
    "ignored_head_local_on_purpose": ignored_head_local_on_purpose,
    "rewrapped_every_run": rewrapped_every_run,
    "correct": correct,
    "batchnorm_convnet": batchnorm_convnet,
    "dtype_round_trip": dtype_round_trip,
    "sync_flag_left_false": sync_flag_left_false,
    "params_replaced": params_replaced,
    "no_initial_broadcast": no_initial_broadcast,
    "fresh_wrapper_on_some_paths": fresh_wrapper_on_some_paths,
    "spawn_handed_models": spawn_handed_models,
    "cast_after_wrapping_single_step": cast_after_wrapping_single_step,
    "drift_at_the_last_step": drift_at_the_last_step,
}


# Checks every 2 steps here, so the drift that starts at step 4 is seen within the 6 steps.
CASE_OPTIONS = {
    "fresh_wrapper_on_some_paths": {"replica_every": 2},
    "drift_at_the_last_step": {"replica_every": STEPS},
    "batchnorm_convnet": {"replica_every": 1},
}


def run_case(guard, name: str, rank: int, handed: list) -> dict:
    HANDED[name] = handed
    guard.reset()
    guard.configure(**{"replica_every": 100, **CASE_OPTIONS.get(name, {})})
    module = CASES[name](rank)
    found = [
        {"code": f.code, "message": f.message, "count": f.count, "level": f.level}
        for f in guard.findings()
    ]
    return {"findings": found, "replicas_equal": replicas_equal(module)}


def run(rank: int, world: int, port: int, names: list[str], handed: dict, repeat: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import guard

    guard.install()
    guard.configure(mode="warn", select=["ACL"])
    result = {"rank": rank}
    for i in range(repeat):  # a repetition is named name/i, the first run plain name
        for name in names:
            key = name if i == 0 else f"{name}/{i}"
            result[key] = run_case(guard, name, rank, handed.get(name, [[]] * repeat)[i])
    out = os.path.join(os.environ["ACCEL_DIST_RESULTS"], f"rank{rank}.json")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    names = sys.argv[1:] or list(CASES)
    repeat = int(os.environ.get("ACCEL_REPLICA_REPEAT", "1"))  # each case, in one launch
    handed = {
        name: [[make_net() for _ in range(count)] for _ in range(repeat)]
        for name, count in HANDED_COUNTS.items()
    }
    mp.spawn(run, args=(2, free, names, handed, repeat), nprocs=2)
    sys.exit(0)
