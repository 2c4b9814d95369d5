"""ACL404 (warning): a shuffling `DistributedSampler` starting a new pass with the same epoch.

The sampler seeds its permutation with seed + epoch; without `set_epoch(epoch)` every epoch
repeats the same order and the same split between ranks. Judged when a pass has handed out
all its indices, against the previous complete pass: a peek such as PyTorch's DDP example's
`next(iter(self.train_data))` (to print the batch size) before `set_epoch` starts a pass that
is never finished, and is not an epoch that repeats an order.
"""

from __future__ import annotations

import weakref

from guard import sources
from guard.checks._common import report

CODES = ("ACL404",)


def install(tracker) -> None:
    sources.ensure(tracker, "sampler")
    last_epoch: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def pass_ended(sampler, epoch, **_) -> None:
        if not getattr(sampler, "shuffle", False):
            return
        previous = last_epoch.get(sampler, _NONE)
        last_epoch[sampler] = epoch
        if previous == epoch:
            report(
                "ACL404",
                f"a shuffling DistributedSampler finished two passes in a row with "
                f"epoch={epoch}: the second repeats the order and the split between ranks of "
                "the first; call sampler.set_epoch(epoch) at the start of every epoch",
                level="warning",
            )

    tracker.subscribe("sampler_end", pass_ended)


_NONE = object()  # no complete pass yet
