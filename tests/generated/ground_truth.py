"""What the catalogue (`CATALOG.md`) says about a generated loop, written from the rules' text.

- `static_findings`: the (code, line) pairs the linter must report, nothing more;
- `runtime_codes`: the codes the guard must report while the program runs;
- `corrected`: the same loop with every statically reported defect repaired, spelled the way
  the rule's fix spells it, so `--fix --unsafe-fixes` must train to exactly its parameters;
  `corrected(loop, codes)` repairs only the defects of those codes;
- `fix_safety`: per defect, whether the catalogue's fix for it is safe (`--fix` applies it),
  unsafe (`--unsafe-fixes` only), absent, or `optional` (a safe fix is allowed, not promised);
  `safe_fixes` says which codes plain `--fix` must repair in this loop, so it must train to
  exactly `corrected(loop, safe_fixes(loop))`.

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
            # clipping partial sums on every micro-step; in fp16 the `unscale_` right before
            # it too (torch refuses the 2nd): one misplaced block, one finding at its first line
            found.add(("ACL303", "unscale" if loop.precision == "fp16" else "clip"))
        if loop.gate == "enumerate" and not loop.last_batch:
            found.add(("ACL307", "gate"))  # enumerate index over a sized loader, no clause
        if loop.gate == "enumerate" and loop.gate_form == "off_by_one":
            found.add(("ACL312", "gate"))  # `i % K == 0` with a 0-based index
        if loop.scheduler == "ungated":
            found.add(("ACL305", "scheduler"))  # steps K times per optimizer step
        if loop.precision != "fp32" and loop.cast_scope == "backward":
            found.add(("ACL202", "backward"))  # the backward inside the autocast region
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
        codes &= {"ACL104", "ACL202", "ACL305"}
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
        # A backward inside autocast is seen at the first one.
        early = {"ACL202", "ACL305"} & codes
        return {"ACL303"} | early | ({"ACL304"} & codes if early_step else set())
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


# What each code's fix turns the loop into, the way the rule's fix spells it.
_REPAIRS = {
    "ACL301": lambda loop: loop.but(division="assign"),  # inserts `loss = loss / K`
    "ACL302": lambda loop: loop.but(division="none"),  # removes the manual division
    # ACL303 moves the clip (and the unscale) under the step condition; ACL104 inserts
    # `scaler.unscale_(opt)` before a raw clip, or rewrites the engine's to engine.clip_grad_norm_
    "ACL303": lambda loop: loop.but(clip="gated"),
    "ACL104": lambda loop: loop.but(clip="gated"),
    "ACL304": lambda loop: loop.but(zero_grad="after_step"),  # moved after the step
    "ACL305": lambda loop: loop.but(scheduler="gated"),  # moved under the step condition
    "ACL307": lambda loop: loop.but(last_batch=True),  # adds `or i + 1 == len(loader)`
    "ACL312": lambda loop: loop.but(gate_form="plus_one"),  # rewrites to `(i + 1) % K == 0`
    # The backward leaves the autocast region and nothing else: a `no_sync()` entered in the
    # same `with` stays around it (the autocast gets a `with` of its own inside).
    "ACL202": lambda loop: loop.but(cast_scope="loss"),
}
_WINDOW_CODES = ("ACL301", "ACL303", "ACL305")


def fix_safety(loop: Loop) -> dict[str, str]:
    """code -> safe | unsafe | none | optional, for each defect of the loop (CATALOG.md's
    "Autofix" lines)."""
    safety = {code: "safe" for code, _ in defects(loop)}
    for code in ("ACL304", "ACL307", "ACL312"):
        if code in safety:
            safety[code] = "unsafe"  # they change which micro-batches a step sums
    if "ACL301" in safety and loop.loss_fn == "param":
        # "Skipped when the loss comes from a call the linter cannot see into (it might
        # already divide)": nothing proves the callable's loss undivided, so no fix at all.
        safety["ACL301"] = "none"
    if "ACL202" in safety and loop.ddp:
        # The backward shares its `with` with `no_sync()`: moving it after the block would
        # also take it out of no_sync (a sync on every micro-step, and FSDP's or the compiled
        # reducer's gradients handled differently). Splitting the `with` keeps it inside; the
        # catalogue allows that as a safe fix but does not promise it.
        safety["ACL202"] = "optional"
    return safety


def safe_fixes(loop: Loop) -> set[str]:
    """The codes plain `--fix` must repair: safe fixes of the findings it sees, round by round.
    A micro-step loop that zeroes inside itself shows the window rules only once ACL304 is
    fixed (`static_findings`), which only `--unsafe-fixes` does."""
    codes = {code for code, how in fix_safety(loop).items() if how == "safe"}
    if loop.gate == "micro" and loop.zero_grad == "top":
        codes -= set(_WINDOW_CODES)
    return codes


def correct(loop: Loop) -> Loop:
    """The loop with every defect repaired, fix or no fix: what it should have been."""
    fixed = loop
    for code in sorted(fix_safety(loop)):
        fixed = _REPAIRS[code](fixed)
    return fixed


def corrected(loop: Loop, codes: set[str] | None = None) -> Loop:
    """The loop with the defects of `codes` repaired the way their fixes repair them (default:
    every defect that has a fix, safe or unsafe)."""
    safety = fix_safety(loop)
    if codes is None:
        codes = {code for code, how in safety.items() if how != "none"}
    fixed = loop
    for code in sorted(codes & safety.keys()):
        fixed = _REPAIRS[code](fixed)
    return fixed
