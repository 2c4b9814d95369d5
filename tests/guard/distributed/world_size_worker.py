"""Raw DDP loops on 2 gloo processes for ACL402 (a loss divided by the world size): launched as
`torchrun --standalone --nproc-per-node 2 -m guard world_size_worker.py` in warn mode; each rank
writes one JSON file with, per case, what the guard reported and whether the trained weights
equal a single-process reference trained on both ranks' batches (with or without the extra 1/W).

Every case runs on both ranks in the same order. Lines marked `# W-division` are where a finding
belongs; the test reads them from this file."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 3
K = 2  # the accumulation cases' window, equal to the world size on purpose
LR = 0.1


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def batches(rank: int, count: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's own batches, as a DistributedSampler would hand out different samples."""
    generator = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(count):
        x = torch.randn(4, 8, generator=generator)
        out.append((x, x.sum(dim=1, keepdim=True)))
    return out


def reference(divisor: float, micro: int = 1) -> list[torch.Tensor]:
    """One process, every rank's batches: per step, the mean over ranks of each rank's loss
    summed over `micro` micro-batches, divided by `divisor`; what DDP's average computes."""
    model = make_net()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    world = dist.get_world_size()
    per_rank = [batches(r, STEPS * micro) for r in range(world)]
    for step in range(STEPS):
        total = 0
        for r in range(world):
            for x, y in per_rank[r][step * micro : (step + 1) * micro]:
                total = total + F.mse_loss(model(x), y)
        (total / world / divisor).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def same_weights(model: nn.Module, expected: list[torch.Tensor]) -> bool:
    got = [p.detach() for p in model.parameters()]
    pairs = zip(got, expected, strict=True)
    return all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in pairs)


# -- the cases: each returns the model it trained and the reference divisor it should match ----


def divided_by_world_size(rank: int):
    model = DDP(make_net())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches(rank):
        loss = F.mse_loss(model(x), y)
        loss = loss / dist.get_world_size()  # W-division
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.module, reference(dist.get_world_size())


def correct(rank: int):
    model = DDP(make_net())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches(rank):
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model.module, reference(1)


def logged_average(rank: int):
    """The loss averaged over ranks for logging only: a detached, all-reduced copy / W."""
    model = DDP(make_net())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    world_size = dist.get_world_size()
    for x, y in batches(rank):
        loss = F.mse_loss(model(x), y)
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        logged /= world_size
        reported = loss.item() / world_size  # noqa: F841  (a host copy)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.module, reference(1)


def accumulation_divided_by_k_equal_to_w(rank: int):
    """loss / K with K = W = 2 and no_sync on the first micro-step: the 1/2 is the window's."""
    model = DDP(make_net())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    world_size = dist.get_world_size()
    for i, (x, y) in enumerate(batches(rank, STEPS * K)):
        last = (i + 1) % K == 0
        with model.no_sync() if not last else torch.enable_grad():
            (F.mse_loss(model(x), y) / K).backward()
        if last:
            opt.step()
            opt.zero_grad()
            logged = torch.tensor(float(i + 1))
            logged /= world_size  # a count averaged for logging
    return model.module, reference(K, micro=K)


def accumulation_divided_by_k_and_w(rank: int):
    model = DDP(make_net())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    world_size = int(os.environ["WORLD_SIZE"])
    for i, (x, y) in enumerate(batches(rank, STEPS * K)):
        last = (i + 1) % K == 0
        with model.no_sync() if not last else torch.enable_grad():
            (F.mse_loss(model(x), y) / (K * world_size)).backward()  # W-division
        if last:
            opt.step()
            opt.zero_grad()
    return model.module, reference(K * world_size, micro=K)


def manual_gradient_sum(rank: int):
    """No DDP: the gradients are summed by hand, so the loss needs its 1/W."""
    model = make_net()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    world_size = dist.get_world_size()
    for x, y in batches(rank):
        (F.mse_loss(model(x), y) / world_size).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
    return model, reference(1)


def _sum_hook(state, bucket):
    """A communication hook that sums the gradients instead of averaging them."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def comm_hook_that_sums(rank: int):
    model = DDP(make_net())
    model.register_comm_hook(None, _sum_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches(rank):
        loss = F.mse_loss(model(x), y) / dist.get_world_size()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.module, reference(1)


def global_token_normalisation(rank: int):
    """A summed loss times W over the tokens of every rank: the 1/n over all ranks is meant."""
    model = DDP(make_net())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    world_size = dist.get_world_size()
    for x, y in batches(rank):
        n_items = torch.tensor(float(y.numel()))
        dist.all_reduce(n_items)
        loss = F.mse_loss(model(x), y, reduction="sum") * world_size / n_items
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.module, reference(1)


def two_terms_averaged(rank: int):
    """(a + b) / 2 on 2 ranks: a divisor equal to W by coincidence, with the world size read
    in the same function."""
    model = DDP(make_net())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    world_size = dist.get_world_size()
    for x, y in batches(rank):
        out = model(x)
        loss = (F.mse_loss(out, y) + F.l1_loss(out, y)) / 2
        loss.backward()
        opt.step()
        opt.zero_grad()
        logged = loss.detach() / world_size  # noqa: F841
    return model.module, None


CASES = {
    "divided_by_world_size": divided_by_world_size,
    "correct": correct,
    "logged_average": logged_average,
    "accumulation_divided_by_k_equal_to_w": accumulation_divided_by_k_equal_to_w,
    "accumulation_divided_by_k_and_w": accumulation_divided_by_k_and_w,
    "manual_gradient_sum": manual_gradient_sum,
    "comm_hook_that_sums": comm_hook_that_sums,
    "global_token_normalisation": global_token_normalisation,
    "two_terms_averaged": two_terms_averaged,
}


def run_case(guard, name: str, rank: int) -> dict:
    guard.reset()
    model, expected = CASES[name](rank)
    found = [
        {"code": f.code, "level": f.level, "location": f.location, "count": f.count}
        for f in guard.findings()
    ]
    matches = expected is None or same_weights(model, expected)
    return {"findings": found, "matches_reference": matches}


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    import guard

    guard.configure(mode="warn", select=["ACL"])
    result = {"rank": rank, **{name: run_case(guard, name, rank) for name in CASES}}
    out = os.path.join(os.environ["ACCEL_DIST_RESULTS"], f"rank{rank}.json")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
