"""What the catalogue (`CATALOG.md`) says about a generated loop, written from the rules' text.

- `static_findings`: the (code, line) pairs the linter must report, nothing more;
- `runtime_codes`: the codes the guard must report while the program runs;
- `corrected`: the same loop with every statically reported defect repaired, spelled the way
  the rule's fix spells it, so `--fix --unsafe-fixes` must train to exactly its parameters.

Runtime-only defects (a tail left over by a cross-epoch counter) stay in `corrected`: no fix can
see them, and the guard must still report them.
"""

from __future__ import annotations

from loop_parts import Loop, Program

# Every generated loop gates its step (raw) or enters `accumulate()` (frameworks). The catalogue's
# static exemptions are for loops *without* gating or `accumulate()` (ACL303, ACL304, ACL305), so a
# loop configured with K = 1 is judged by its code: the defect is there and bites as soon as K
# changes. At runtime K = 1 has no window to get wrong (see `runtime_codes`). The one exception
# is ACL302, whose text speaks of K > 1: a division by K = 1 is not drawn (loop_strategies.py).


def defects(loop: Loop) -> set[tuple[str, str]]:
    """(code, tag) for every static finding: the tag names the line the finding points at."""
    found: set[tuple[str, str]] = set()
    if loop.raw:
        if loop.division == "none":
            found.add(("ACL301", "backward"))  # the gate steps every K, nothing divides by K
        if loop.clip == "ungated":
            found.add(("ACL303", "clip"))  # clipping partial sums on every micro-step
            if loop.precision == "fp16":
                found.add(("ACL303", "unscale"))  # and unscaling them: torch refuses the 2nd
        if loop.gate == "enumerate" and not loop.last_batch:
            found.add(("ACL307", "gate"))  # enumerate index over a sized loader, no clause
        if loop.gate == "enumerate" and loop.gate_form == "off_by_one":
            found.add(("ACL312", "gate"))  # `i % K == 0` with a 0-based index
        if loop.scheduler == "ungated":
            found.add(("ACL305", "scheduler"))  # steps K times per optimizer step
    else:
        if loop.division in ("by_k", "by_k_inverse", "by_engine_attr"):
            found.add(("ACL302", "backward"))  # the engine divides as well
        if loop.clip == "ungated":
            found.add(("ACL303", "clip"))
        if loop.clip == "torch_gated" and loop.framework == "engine" and loop.precision == "fp16":
            found.add(("ACL104", "clip"))  # torch's clip skips the engine's unscale
    if loop.clip == "gated_scaled":
        found.add(("ACL104", "clip"))  # raw fp16: clipping S * g
    if loop.zero_grad == "top":
        found.add(("ACL304", "zero_grad"))  # wipes the window's earlier micro-steps
    return found


def static_findings(loop: Loop, program: Program) -> set[tuple[str, int]]:
    found = defects(loop)
    if loop.gate == "micro" and loop.zero_grad == "top":
        # A micro-step loop that zeroes inside itself has no window for the linter (its
        # contract: tests/linter/rules/test_acl301.py::
        # test_zero_grad_inside_the_micro_step_loop_is_not_accumulation): ACL304 is the one
        # finding, and the window rules (ACL301/303/305) report in the fix's next round. The
        # catalogue defines those rules by the window, so which reading is right is open; an
        # enumerate-gated loop that zeroes every batch gets all of them at once.
        found = {(code, tag) for code, tag in found if code not in ("ACL301", "ACL303", "ACL305")}
    return {(code, line) for code, tag in found for line in program.lines[tag]}


def crashes(loop: Loop) -> bool:
    """Raw fp16 unscaling every micro-step: torch raises at the second `unscale_` of a window."""
    return loop.raw and loop.precision == "fp16" and loop.clip == "ungated" and loop.k > 1


def runtime_codes(loop: Loop) -> set[str]:
    codes = {code for code, _ in defects(loop)}
    if loop.k == 1:
        # One micro-step per step: no window to get wrong. Clipping scaled gradients still
        # bites, and so does a scheduler stepped before the optimizer in every iteration (its
        # first step comes before the optimizer's first).
        codes &= {"ACL104", "ACL305"}
    codes.discard("ACL307")  # the static signal is the gate's form; at runtime, a real tail
    if _tail_left(loop):
        codes.add("ACL307")
    if loop.raw and loop.zero_grad == "top":
        # Windows of one micro-batch each: the off-by-one first window does not stand out.
        codes.discard("ACL312")
    if loop.raw and loop.zero_grad == "top":
        # Each micro-step's zero_grad leaves the clip one micro-batch's gradients, which the
        # step then uses as they are: no partial sum is clipped (ACL304 is the finding).
        codes.discard("ACL303")
    if loop.raw and (loop.zero_grad == "top" or loop.clip != "none"):
        # ACL301's runtime signal is a heuristic: k > 1 backward passes per step, none divided,
        # and no reduction of the gradient norm between the last backward and the step. A
        # zero_grad at the top leaves one pass per step; a clip reduces the norm (the guard
        # cannot tell it from a deliberate normalisation). Either way nothing is observable.
        codes.discard("ACL301")
    if crashes(loop):
        # Dies at the second unscale_ of a window, reported just before. Only the micro-steps
        # before it ran: a scheduler there already stepped ahead of the optimizer. A zero_grad
        # at the top discarded once, which the guard allows before the first step (a sanity-
        # check backward); after one, it is a discard: with `i % K == 0` the first step comes
        # after micro-step 1 and the crash at micro-step 3, whose zero_grad drops micro-step 2.
        early_step = loop.gate == "enumerate" and loop.gate_form == "off_by_one"
        return {"ACL303"} | ({"ACL305"} & codes) | ({"ACL304"} & codes if early_step else set())
    return codes


def _tail_left(loop: Loop) -> bool:
    """Whether gradients of a partial window are thrown away: by a zero_grad after a loader pass
    ended mid-window, or by the end of the run."""
    if not loop.raw or loop.k == 1:
        return False  # Accelerate and the engine flush the tail themselves
    # The micro-batches after a pass's last step: `i % K == 0` steps after micro-batch 1, K + 1, ..
    after_last_step = loop.batches - 1 if loop.gate_form == "off_by_one" else loop.batches
    partial_pass = after_last_step % loop.k != 0
    if loop.gate == "enumerate":  # windows restart with every pass
        return not loop.last_batch and partial_pass
    # A counter or a micro-step loop over `itertools.cycle` runs its windows across passes: a
    # partial window at a pass's end is lost only if a zero_grad at the top wipes it (which
    # the guard sees as that pass's tail thrown away), or at the end of the run.
    if loop.zero_grad == "top" and partial_pass:
        return True
    # A counter's last partial window at the end of the run is not expected either way: the
    # catalogue exempts cross-epoch counters statically ("windows span epochs on purpose") and
    # names the engine's exit, not a plain loop's end, for the end-of-run check.
    return False


def corrected(loop: Loop) -> Loop:
    """Every static defect repaired the way its (unsafe) fix repairs it."""
    fixed = loop
    if loop.raw and loop.division == "none":
        fixed = fixed.but(division="assign")  # ACL301 inserts `loss = loss / K`
    if not loop.raw and loop.division != "none":
        fixed = fixed.but(division="none")  # ACL302 removes the manual division
    if loop.clip == "ungated":
        fixed = fixed.but(clip="gated")  # ACL303 moves it under the step condition
    if loop.clip == "gated_scaled":
        fixed = fixed.but(clip="gated")  # ACL104 inserts scaler.unscale_(opt) first
    if loop.clip == "torch_gated" and loop.framework == "engine" and loop.precision == "fp16":
        fixed = fixed.but(clip="gated")  # ACL104 rewrites to engine.clip_grad_norm_
    if loop.zero_grad == "top":
        fixed = fixed.but(zero_grad="after_step")  # ACL304 moves it after the step
    if loop.raw and loop.scheduler == "ungated":
        fixed = fixed.but(scheduler="gated")  # ACL305 moves it under the step condition
    if loop.gate == "enumerate" and not loop.last_batch:
        fixed = fixed.but(last_batch=True)  # ACL307 adds `or i + 1 == len(loader)`
    if loop.gate_form == "off_by_one":
        fixed = fixed.but(gate_form="plus_one")  # ACL312 rewrites the test to `(i + 1) % K`
    return fixed
