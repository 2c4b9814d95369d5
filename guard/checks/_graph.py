"""Reading a loss's autograd graph near its root: constant factors and the token-mean node.

Saved attributes such as `_saved_other` and `_saved_reduction` are not public API, so every read
is guarded: when a torch build lacks them the answer is "unknown" and the checks stay silent.
"""

from __future__ import annotations

from typing import Any

_FACTOR_NODES = {"DivBackward0": -1, "MulBackward0": 1}
_MAX_NODES = 32  # bound the walk: a loss graph's root chain is short, the graph behind it is not
_MAX_LOSS_NODES = 8  # a cross-entropy's NLL node sits within a few nodes of the loss
_NLL_NODES = ("NllLossBackward0", "NllLoss2DBackward0")


class _OnDevice(Exception):
    """A saved operand that lives on an accelerator: reading it would wait for the device."""


def _scalar(value: Any) -> float | None:
    """A Python number for a plain or 0-dim saved operand, else None. A Python number the user
    divided by is kept by torch as a CPU tensor whatever the loss's device, so reading it never
    waits for a GPU; an operand on another device raises `_OnDevice` instead of being read."""
    if getattr(getattr(value, "device", None), "type", "cpu") != "cpu":
        raise _OnDevice
    try:
        if hasattr(value, "numel") and value.numel() != 1:
            return None
        return float(value)
    except Exception:
        return None


def root_factor(loss: Any, scaled: bool = False) -> float | None:
    """The product of the constant factors at the root of `loss`'s graph (`/ 4` gives 0.25):
    1.0 when the root is not such a node, None when the graph cannot be read (`root_factors`)."""
    factors = root_factors(loss, scaled)
    if factors is None:
        return None
    product = 1.0
    for factor in factors:
        product *= factor
    return product


def root_factors(loss: Any, scaled: bool = False) -> list[float] | None:
    """The constant factors at the root of `loss`'s graph, root first (`loss / 4 * 2` gives
    [2.0, 0.25]).

    Walks the chain of `DivBackward0`/`MulBackward0` nodes whose other operand is a constant;
    empty when the root is not such a node, None when the graph cannot be read. `scaled`: the
    root is `GradScaler.scale`'s multiplication by S, which does not count.
    """
    node = getattr(loss, "grad_fn", None)
    factors: list[float] = []
    for index in range(_MAX_NODES):
        sign = _FACTOR_NODES.get(type(node).__name__) if node is not None else None
        if sign is None:
            return factors
        skip = scaled and index == 0  # S lives on the device: reading it would be a host sync
        try:
            other = 1.0 if skip else _scalar(node._saved_other)
            inputs = [fn for fn, _ in node.next_functions if fn is not None]
        except (AttributeError, RuntimeError, _OnDevice):  # attribute missing, graph freed,
            return None  # or a divisor on the device: unknown, not a host sync
        if other is None or other == 0 or len(inputs) != 1:
            return factors  # a tensor-by-tensor product: not a constant factor
        if not skip:
            factors.append(other if sign > 0 else 1.0 / other)
        node = inputs[0]
    return factors


def token_mean_count(loss: Any) -> tuple[Any, int] | None:
    """The valid-token count of a mean-reduced NLL/cross-entropy node near the root and the
    number of its targets, or None.

    Returns (the saved total weight, a 0-dim tensor read later to avoid a host sync; the
    targets' element count, from the shape, free) when the first `NllLossBackward0` found has
    `reduction == mean`; None for sums or non-token losses. Fewer valid tokens than targets
    means some were ignored (padding, -100 labels).
    """
    node = getattr(loss, "grad_fn", None)
    frontier = [node] if node is not None else []
    for seen, node in enumerate(frontier):  # breadth-first: the loop visits what it appends
        if seen == _MAX_LOSS_NODES:
            return None
        if type(node).__name__ in _NLL_NODES:
            try:
                reduction, total = node._saved_reduction, node._saved_total_weight
                targets = node._saved_target.numel()
            except (AttributeError, RuntimeError):
                return None
            return (total, targets) if reduction == 1 else None
        try:
            children = node.next_functions
        except (AttributeError, RuntimeError):
            return None
        for child, _ in children:  # plain loops: this runs every micro-step, generators cost
            if child is not None:
                frontier.append(child)
    return None
