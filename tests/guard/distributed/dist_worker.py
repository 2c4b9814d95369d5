"""Two gloo processes on CPU for the ACL308 / ACL309 / ACL403 cross-rank tests: run as a script;
each rank writes one JSON file with what the guard reported (raise mode) in each case.

Every case runs on both ranks in the same order (the guard's collectives must pair up)."""

from __future__ import annotations

import json
import math
import os
import socket
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

N = 2  # micro-batches per optimizer step
VOCAB, SEQ = 16, 8


# -- helpers -------------------------------------------------------------------------------------


def findings(guard) -> list[list]:
    return sorted([f.code, f.level, f.message] for f in guard.findings())


def token_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB))


def token_batches(lengths: list[int], seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of 2 sequences whose labels are valid for the first `length` positions."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for length in lengths:
        ids = torch.randint(1, VOCAB, (2, SEQ), generator=generator)
        labels = ids.clone()
        labels[:, length:] = -100
        batches.append((ids, labels))
    return batches


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def same_on_all_ranks(tensor: torch.Tensor) -> bool:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return all(torch.equal(parts[0], p) for p in parts)


def new_accelerator(**kwargs):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return Accelerator(cpu=True, **kwargs)


# -- ACL308 ----------------------------------------------------------------------------------------


def token_means_raw(guard, lengths: list[int], reduction: str = "mean") -> list:
    """A DDP loop with no_sync on the first micro-batch; each rank's own lengths are `lengths`."""
    guard.reset()
    model = DDP(token_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = token_batches(lengths, seed=dist.get_rank())
    n_tokens = torch.tensor(sum(int((labels != -100).sum()) for _, labels in batches))
    dist.all_reduce(n_tokens)  # the window's token count over all ranks (for the exact sum)
    for i, (ids, labels) in enumerate(batches):
        with nullcontext() if i + 1 == N else model.no_sync():
            logits = model(ids).flatten(0, 1)
            loss = F.cross_entropy(logits, labels.flatten(), reduction=reduction)
            scale = 1 / N if reduction == "mean" else dist.get_world_size() / n_tokens.item()
            (loss * scale).backward()
    opt.step()
    opt.zero_grad()
    return findings(guard)


def token_means_one_rank_only(guard) -> list:
    """Rank 0 trains on a token mean, rank 1 on an MSE: the gather still pairs up, no verdict."""
    guard.reset()
    model = DDP(token_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (ids, labels) in enumerate(token_batches([1, 8], seed=dist.get_rank())):
        with nullcontext() if i + 1 == N else model.no_sync():
            logits = model(ids).flatten(0, 1)
            if dist.get_rank() == 0:
                loss = F.cross_entropy(logits, labels.flatten())
            else:
                loss = logits.pow(2).mean()
            (loss / N).backward()
    opt.step()
    opt.zero_grad()
    return findings(guard)


def token_means_accelerate(guard, lengths: list[int]) -> list:
    """Accelerate's accumulation loop over a prepared loader of each rank's own batches."""
    guard.reset()
    accelerator = new_accelerator(gradient_accumulation_steps=N)
    model = token_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # The prepared loader shards batches across ranks: batch j goes to rank j % W.
    world = dist.get_world_size()
    per_rank = [token_batches(lengths, seed=r) for r in range(world)]
    batches = [per_rank[j % world][j // world] for j in range(world * len(lengths))]
    rows = [(ids[k], labels[k]) for ids, labels in batches for k in range(len(ids))]
    loader = DataLoader(rows, batch_size=len(batches[0][0]))
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for ids, labels in loader:
        with accelerator.accumulate(model):
            logits = model(ids).flatten(0, 1)
            accelerator.backward(F.cross_entropy(logits, labels.flatten()))
            opt.step()
            opt.zero_grad()
    return findings(guard)


# -- ACL309 ----------------------------------------------------------------------------------------


def two_towers(guard, entered: str) -> dict:
    """Two DDP towers trained by one optimizer; accumulate() entered with `entered` = "both",
    "one" (tower_b left out: it syncs every micro-step) or "one+no_sync" (tower_b also kept
    under no_sync(), so it never syncs)."""
    guard.reset()
    accelerator = new_accelerator(gradient_accumulation_steps=N)
    torch.manual_seed(0)
    tower_a, tower_b = nn.Linear(8, 1), nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD([*tower_a.parameters(), *tower_b.parameters()], lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=generator)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    tower_a, tower_b, opt, loader = accelerator.prepare(tower_a, tower_b, opt, loader)
    models = (tower_a, tower_b) if entered == "both" else (tower_a,)
    tower_b_context = tower_b.no_sync if entered == "one+no_sync" else nullcontext
    start = torch.cat([flat(tower_a), flat(tower_b)])
    try:
        for xb, yb in loader:
            with accelerator.accumulate(*models), tower_b_context():
                loss = F.mse_loss(tower_a(xb) + tower_b(xb), yb)
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
    except guard.GuardError as error:
        no_grads = all(p.grad is None for p in [*tower_a.parameters(), *tower_b.parameters()])
        unchanged = torch.equal(start, torch.cat([flat(tower_a), flat(tower_b)]))
        return {
            "raised": error.code,
            "message": str(error),
            "before_backward": no_grads,
            "params_unchanged": unchanged,
        }
    params = torch.cat([flat(tower_a), flat(tower_b)])
    return {
        "raised": None,
        "findings": findings(guard),
        "replicas_equal": same_on_all_ranks(params),
    }


# -- ACL403 ----------------------------------------------------------------------------------------


def _eval_data(samples: int):
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(samples, 8, generator=generator)
    return TensorDataset(x, (x[:, 0] > 0).long())


def accelerate_eval(guard, samples: int, batch_size: int, how: str) -> dict:
    """An evaluation pass over a prepared loader; `how` is the gather call the loop uses."""
    guard.reset()
    accelerator = new_accelerator()
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    loader = accelerator.prepare(DataLoader(_eval_data(samples), batch_size=batch_size))
    model.eval()
    seen = 0
    for inputs, targets in loader:
        with torch.no_grad():
            preds = model(inputs).argmax(-1)
        if how == "pair":
            preds, targets = accelerator.gather((preds, targets))
        elif how == "separate":
            preds, targets = accelerator.gather(preds), accelerator.gather(targets)
        elif how == "loss":  # one gathered scalar per batch: not a per-sample gather
            with torch.no_grad():
                accelerator.gather(F.cross_entropy(model(inputs), targets))
        else:
            preds, targets = accelerator.gather_for_metrics((preds, targets))
        seen += len(targets)
    return {"findings": findings(guard), "seen": seen}


def accelerate_train_gathers_losses(guard, samples: int, batch_size: int) -> list:
    """A training pass that gathers each batch's per-sample losses for logging: not evaluation."""
    guard.reset()
    accelerator = new_accelerator()
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(
        model, opt, DataLoader(_eval_data(samples), batch_size=batch_size)
    )
    for inputs, targets in loader:
        losses = F.cross_entropy(model(inputs), targets, reduction="none")
        accelerator.backward(losses.mean())
        opt.step()
        opt.zero_grad()
        accelerator.gather(losses.detach())
    return findings(guard)


def sampler_eval(guard, samples: int, batch_size: int, objects: bool = False) -> dict:
    """Plain torch.distributed evaluation: a DistributedSampler and all_gather of predictions."""
    guard.reset()
    world = dist.get_world_size()
    dataset = _eval_data(samples)
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    model.eval()
    gathered = 0
    for inputs, targets in loader:
        with torch.no_grad():
            preds = model(inputs).argmax(-1)
        if objects:
            parts = [None] * world
            dist.all_gather_object(parts, (preds.tolist(), targets.tolist()))
            gathered += sum(len(p[0]) for p in parts)
        else:
            parts = [torch.empty_like(preds) for _ in range(world)]
            dist.all_gather(parts, preds)
            labels = torch.empty(world * len(targets), dtype=targets.dtype)
            dist.all_gather_into_tensor(labels, targets)
            gathered += sum(len(p) for p in parts)
    return {"findings": findings(guard), "gathered": gathered}


# -- driver ----------------------------------------------------------------------------------------


def ignoring(code: str, case, guard, *args) -> dict:
    """Run `case` with `code` ignored (`guard.configure(ignore=...)`), then restore."""
    guard.configure(ignore=[code])
    try:
        return case(guard, *args)
    finally:
        guard.configure(ignore=[])


def cases(guard) -> dict:
    rank = dist.get_rank()
    uneven, even = 50, 48  # 50 % (2 ranks * 8) != 0; 48 % 16 == 0
    return {
        "rank": rank,
        # ACL308: rank 0 has short micro-batches, rank 1 long ones; each rank alone is uniform.
        "acl308_raw": token_means_raw(guard, [1, 1] if rank == 0 else [8, 8]),
        "acl308_raw_equal": token_means_raw(guard, [4, 4]),
        "acl308_raw_sum": token_means_raw(guard, [1, 1] if rank == 0 else [8, 8], "sum"),
        "acl308_one_rank": token_means_one_rank_only(guard),
        "acl308_accelerate": token_means_accelerate(guard, [1, 1] if rank == 0 else [8, 8]),
        "acl309_one_tower": two_towers(guard, "one"),
        "acl309_one_tower_no_sync": two_towers(guard, "one+no_sync"),
        "acl309_both_towers": two_towers(guard, "both"),
        "acl309_ignored_one_tower": ignoring("ACL309", two_towers, guard, "one"),
        "acl403": {
            f"{how}_{samples}": accelerate_eval(guard, samples, 8, how)
            for samples in (uneven, even)
            for how in ("pair", "separate", "for_metrics", "loss")
        },
        "acl403_train": accelerate_train_gathers_losses(guard, uneven, 8),
        "acl403_sampler": {
            f"{kind}_{samples}": sampler_eval(guard, samples, 8, objects=kind == "objects")
            for samples in (51, 50)
            for kind in ("tensors", "objects")
        },
    }


def run(rank: int, world: int, port: int) -> None:
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
    guard.configure(mode="raise", select=["ACL"])
    result = cases(guard)
    # One file per rank: two ranks printing to one pipe can interleave their lines.
    out = os.path.join(os.environ["ACCEL_DIST_RESULTS"], f"rank{rank}.json")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


def padded_total(samples: int, batch_size: int, world: int) -> int:
    """What a gather keeps over a padded pass: whole global batches (used by the test)."""
    return math.ceil(samples / (batch_size * world)) * batch_size * world


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(run, args=(2, free), nprocs=2)
    sys.exit(0)
