"""How far the model follows a value or a call before it answers "cannot tell".

The model's questions follow a name through its assignments, a parameter to the arguments the
module's callers pass, and a call into the module's own helpers. Each hop is one level of
depth; past the cap the question gives its "cannot tell" answer (no finding rests on it), so a
recursive or mutually recursive module ends quickly. `FOLLOW_DEPTH` is that cap; the others are
longer or shorter on purpose, and each says why.
"""

from __future__ import annotations

FOLLOW_DEPTH = 4
"""Assignments, callers' arguments and helper calls followed: a helper's helper, or a value
rebound a few times (`K = ACCUM = 4`), is seen; a cycle ends after four hops."""

LOSS_DEPTH = 6
"""A loss's terms are followed further: it is rebound in steps (`loss = ce(...)`,
`loss /= n_tokens`, `return loss`) inside the helper that computes it, then scaled by the caller
(`loss * K * world_size`); four hops stop before the token count is reached."""

SCHEDULE_DEPTH = 6
"""A schedule's length is computed in several bindings (`per_epoch = ceil(len(dl) / K)`,
`total = per_epoch * epochs`, `num_training_steps=total * world_size`), and the power of K is
needed at the end of each."""

LOADER_DEPTH = 8
"""A loader is built through chains of calls and rebindings (`load_dataset(...).shuffle(...)
.map(...)`, `DataLoader(ds)`, `prepare(dl)`) and class hierarchies, each link one hop, before
it is known to have no length."""

CONFIG_VALUE_DEPTH = 12
"""A precision setting is computed from knobs through many small steps (`dtype = 'bfloat16' if
cuda and bf16_supported() else 'float16'`, `ptdtype = {...}[dtype]`, `autocast(dtype=ptdtype)`):
every operation and binding is a hop of its own."""

METHOD_CALL_DEPTH = 3
"""Levels of method calls whose update-step sites count at the call (classes.py inlines them,
scaler_protocol.py reads the kinds a helper holds): both must stop at the same level, or a
site seen by one and not the other is reported inside the helper instead of at the call."""
