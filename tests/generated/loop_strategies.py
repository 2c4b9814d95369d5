"""The hypothesis strategy that draws a `Loop`; simpler parts come first, so failures shrink to
the plainest loop that still shows them."""

from __future__ import annotations

import os

from hypothesis import strategies as st
from loop_parts import (
    FRAMEWORK_DIVISIONS,
    GATE_FORMS,
    PARAM_LOSS_DIVISIONS,
    RAW_DIVISIONS,
    Loop,
)


@st.composite
def loops(draw, frameworks=("raw", "accelerate", "engine")) -> Loop:
    framework = draw(st.sampled_from(frameworks))
    # Accelerate on a CPU ignores fp16 (it trains in fp32 and says fp16: ACL602, which has its
    # own fixtures); the engine applies fp16 on a CPU, so it is drawn there.
    precisions = ("fp32", "bf16") if framework == "accelerate" else ("fp32", "fp16", "bf16")
    precision = draw(st.sampled_from(precisions))
    k = draw(st.integers(1, 5))
    batches = draw(st.integers(max(k, 3), k + 3))
    structure = draw(st.sampled_from(("inline", "helper", "trainer")))
    k_source = draw(st.sampled_from(("constant", "config")))
    zero_grad = draw(st.sampled_from(("after_step", "top")))
    if framework == "raw":
        gate = draw(st.sampled_from(("enumerate", "counter", "micro")))
        last_batch = draw(st.booleans()) if gate == "enumerate" else True
        gate_form = draw(st.sampled_from(GATE_FORMS)) if gate == "enumerate" else "plus_one"
        # Doubled division in a raw loop (the loss and the gradients both divided) is no
        # catalogue code (ACL302 is about an engine's backward): nothing to expect, not drawn.
        # A loss from a callable handed to `train` (helper structure), divided after the call:
        # undivided half the time, which no safe fix can repair (the callable may divide).
        loss_fn = draw(st.sampled_from(("inline", "param"))) if structure == "helper" else "inline"
        if loss_fn == "inline":
            division = draw(st.sampled_from(RAW_DIVISIONS))
        else:
            division = draw(st.one_of(st.just("none"), st.sampled_from(PARAM_LOSS_DIVISIONS)))
        clips = ("none", "gated", "ungated") + (("gated_scaled",) if precision == "fp16" else ())
        scheduler = draw(st.sampled_from(("none", "gated", "ungated")))
    else:
        gate, last_batch, gate_form, loss_fn = "accumulate", True, "plus_one", "inline"
        # With K = 1 a division by K divides by 1: the catalogue's ACL302 speaks of K > 1, and
        # the division is harmless, so it is not drawn (ambiguous, not a contract).
        division = draw(st.sampled_from(FRAMEWORK_DIVISIONS if k > 1 else ("none",)))
        clips = ("none", "gated", "ungated", "torch_gated")
        scheduler = draw(st.sampled_from(("none", "gated")))  # prepared: the wrapper gates it
    clip = draw(st.sampled_from(clips))
    amp = framework == "raw" and precision != "fp32"
    cast_scope = draw(st.sampled_from(("forward", "loss", "backward"))) if amp else "forward"
    ddp = framework == "raw" and gate != "micro" and draw(st.booleans())
    return Loop(
        framework=framework,
        precision=precision,
        k=k,
        gate=gate,
        last_batch=last_batch,
        gate_form=gate_form,
        k_source=k_source,
        division=division,
        clip=clip,
        zero_grad=zero_grad,
        scheduler=scheduler,
        structure=structure,
        batches=batches,
        loss_fn=loss_fn,
        cast_scope=cast_scope,
        ddp=ddp,
    )


def examples(ci: int) -> int:
    """`ci` examples per property in CI; the bench multiplies them (ACCEL_GENERATED_SCALE)."""
    return ci * int(os.environ.get("ACCEL_GENERATED_SCALE", "1"))
