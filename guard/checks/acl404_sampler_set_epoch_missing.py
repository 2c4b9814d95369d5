"""ACL404 (warning): a shuffling `DistributedSampler` starting a new pass with the same epoch.

The sampler seeds its permutation with seed + epoch; without `set_epoch(epoch)` every epoch
repeats the same order and the same split between ranks. Checked when a pass starts.
"""

from __future__ import annotations

import weakref

from guard.checks import _sources
from guard.checks._common import report

CODES = ("ACL404",)


def install(tracker) -> None:
    _sources.ensure(tracker, "sampler")
    last_epoch: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def pass_starts(sampler, **_) -> None:
        if not getattr(sampler, "shuffle", False):
            return
        epoch = getattr(sampler, "epoch", None)
        previous = last_epoch.get(sampler)
        last_epoch[sampler] = epoch
        if previous is not None and previous == epoch:
            report(
                "ACL404",
                f"a shuffling DistributedSampler starts another pass with epoch={epoch}, the "
                "same as the previous pass: it repeats the same order and the same split "
                "between ranks; call sampler.set_epoch(epoch) at the start of every epoch",
                level="warning",
            )

    tracker.subscribe("sampler_iter", pass_starts)
