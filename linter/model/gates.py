"""Update-step questions: which gate a statement sits under, and whether it runs only when the
optimizer steps — in the loop itself, through a function the loop calls to step, or in the loop
that calls a per-batch function."""

from __future__ import annotations

import re
from functools import partial

import libcst as cst

from linter.model.callgraph import CallGraph
from linter.model.classes import Classes
from linter.model.cst_util import code, dotted, last_part, strip_parens, walk
from linter.model.functions import Scope, Stmt
from linter.model.kinds import FrameKind, GateKind, RegionKind, SiteKind
from linter.model.loops import (
    STEP_KINDS,
    Gate,
    Region,
    Site,
    TrainingLoop,
    caller_gate,
    inline_gate,
    same_path,
    step_gate,
    update_gate,
)
from linter.model.roles import Roles

K_NAME = re.compile(r"grad(ient)?_?acc|accum", re.I)  # the Conventions' accumulation value


def regions_around(regions: list[Region], stmt: Stmt, kind: str) -> list[Region]:
    """The regions of `kind` whose `with` block holds the statement, outermost first."""
    frames = {id(f.node) for f in stmt.frames if f.kind == FrameKind.WITH}
    return [r for r in regions if r.kind == kind and id(r.with_node) in frames]


class Gates:
    def __init__(
        self,
        graph: CallGraph,
        sites: dict[int, list[Site]],
        regions: list[Region],
        roles: Roles,
        classes: Classes | None = None,
    ) -> None:
        self.graph = graph
        self.classes = classes
        self.sites = sites
        self.regions = regions
        self.roles = roles

    def assign(self, loop: TrainingLoop) -> None:
        """Complete a loop's gate from what lies outside its own body: an `accumulate()` region,
        a stepping helper the loop calls under a condition, or the loop that calls it."""
        if loop.gate is None:
            loop.gate = self._accumulate_gate(loop)
        if loop.gate is None and not loop.steps:
            loop.gate = self._helper_step_gate(loop)
        if loop.gate is None and not loop.steps and isinstance(loop.node, cst.FunctionDef):
            loop.gate = self._caller_gate(loop.scope)

    def gate_for(self, loop: TrainingLoop, stmt: Stmt) -> Gate | None:
        """The step gate on the paths through `stmt`.

        A loop may step every batch in one branch and every K batches in another (Swin's
        `if ACCUMULATION_STEPS > 1:` ... `else:`); only the steps that can run in the same
        iteration as `stmt` say whether it is in a manual accumulation window.
        """
        gate = loop.gate
        if gate is None or gate.kind not in (GateKind.MODULO, GateKind.COUNTER):
            return gate
        steps = [s for s in loop.steps if same_path(s.stmt, stmt)]
        gates = [g for s in steps if (g := step_gate(loop, s)) is not None]
        if steps and not gates:
            return None
        if _both_arms_step(gates, steps):
            return None
        if gates:
            zeroes = [z for z in loop.of_kind(SiteKind.ZERO_GRAD) if same_path(z.stmt, stmt)]
            step = _consuming_step(steps, zeroes, stmt)
            if self._no_window(loop, steps, step, zeroes, stmt):
                return None
            if len(gates) < len(steps):
                return step_gate(loop, step)
        return gates[0] if gates else gate

    def _no_window(self, loop, steps: list[Site], step: Site, zeroes: list[Site], stmt) -> bool:
        """Whether the gated step that consumes `stmt`'s gradients ends no accumulation window.
        Its optimizer also steps every iteration outside the gate (StyleGAN2's `g_optim.step()`
        beside the lazy `if i % g_reg_every == 0:` block), or the gate's block is an update of
        its own: it zeroes that optimizer's gradients, then runs `stmt`, then steps (WGAN's
        `if i % n_critic == 0: opt_g.zero_grad(); g_loss.backward(); opt_g.step()`). Either
        way the step sees one iteration's gradients, whatever the modulus."""
        gate = step_gate(loop, step)
        if gate is None:
            return False
        optimizer = _stepped(step)
        if any(_stepped(s) == optimizer and step_gate(loop, s) is None for s in steps):
            return True
        inside = partial(_under, loop, gate)
        if not (inside(stmt) and inside(step.stmt) and stmt.order < step.stmt.order):
            return False
        return any(
            inside(z.stmt) and z.stmt.order < stmt.order and self._clears(z, optimizer)
            for z in zeroes
        )

    def clears_what_it_steps(self, zero: Site, step: Site) -> bool:
        """Whether `zero` clears the gradients `step` consumes (its optimizer's or its model's)."""
        return self._clears(zero, _stepped(step))

    def _clears(self, zero: Site, optimizer: str | None) -> bool:
        """`opt.zero_grad()`, or `model.zero_grad()` of a model whose parameters `opt` was
        built with (`g_optim = Adam(generator.parameters())`)."""
        if zero.receiver is None or optimizer is None:
            return False
        if zero.receiver == optimizer:
            return True
        built = self.roles.setup.optimizers.get(optimizer)
        if not isinstance(built, cst.Call):
            return False
        return any(
            isinstance(n, cst.Call)
            and isinstance(n.func, cst.Attribute)
            and n.func.attr.value in ("parameters", "named_parameters")
            and dotted(n.func.value) == zero.receiver
            for arg in built.args
            for n in walk(arg.value)
        )

    def on_update_step(
        self, loop: TrainingLoop, stmt: Stmt, node: cst.CSTNode | None = None
    ) -> bool:
        """Whether the statement (or the expression `node` in it) runs only when the optimizer
        steps."""
        frames = loop.frames_of(stmt)
        accept = partial(self._counts_windows, loop)
        gates = [update_gate(f, loop.counters, loop.flags, accept) for f in frames]
        if node is not None:
            gates.append(inline_gate(stmt, node, loop.counters, loop.flags, accept))
        if any(g is not None for g in gates):
            return True
        gate = loop.gate
        if gate is not None and gate.kind == GateKind.MICRO_LOOP:
            return not any(f.node is gate.node for f in frames)  # once per outer iteration
        return bool(self._step_only_branches(loop, stmt) & branches(frames))

    def step_helper_sites(self, loop: TrainingLoop, *kinds: str) -> list[tuple[Stmt, Site]]:
        """(the call in the loop, a site of `kinds` in the called function) for the module
        functions the loop steps through: `p.grad /= K` inside `def step():` divides too."""
        return [
            (call.stmt, site)
            for call in self._step_helper_calls(loop)
            for site in self.sites[id(self.graph.local_function(call.call.func, call.stmt.scope))]
            if site.kind in kinds
        ]

    def reached_sites(self, loop: TrainingLoop, stmt: Stmt, *kinds: str) -> list[Site]:
        """Sites of `kinds` that can run in an iteration through `stmt`: in the loop on its
        path, or in the module functions the loop calls on that path and in what those call
        (`self._optimizer_step()` calling `self._average_gradients()`). For a per-batch function
        checked against its caller's gate, what the calling loop runs counts as well."""
        found = [s for s in loop.sites if s.kind in kinds and same_path(s.stmt, stmt)]
        calls = [c for c in loop.scope.calls if _runs_with(c.stmt, loop.node, stmt)]
        caller = loop.gate.caller if loop.gate is not None else None
        for call in self.graph.callers(loop.scope) if caller is not None else ():
            around = call.stmt.loops() or ([caller.node] if self._per_batch_body(call.stmt) else [])
            if call.stmt.scope is not caller or not around:
                continue
            runs = partial(_runs_with, loop=around[-1], other=call.stmt)
            found += [s for s in self.sites[id(caller)] if s.kind in kinds and runs(s.stmt)]
            calls += [c for c in caller.calls if runs(c.stmt)]
        seen = {id(loop.scope)}
        while calls:
            callee = self.graph.local_function(calls[0].call.func, calls[0].stmt.scope)
            calls = calls[1:]
            if callee is None or id(callee) in seen:
                continue
            seen.add(id(callee))
            found += [s for s in self.sites[id(callee)] if s.kind in kinds]
            calls += callee.calls
        return found

    def _step_helper_calls(self, loop: TrainingLoop):
        """Calls, in the loop's own body, of module functions that step an optimizer."""
        for callee in self.graph.scopes:
            if not any(s.kind in STEP_KINDS for s in self.sites[id(callee)]):
                continue
            for call in self.graph.callers(callee):
                in_loop = any(f.node is loop.node for f in call.stmt.frames)
                if call.stmt.scope is loop.scope and in_loop:
                    yield call

    def _helper_step_gate(self, loop: TrainingLoop) -> Gate | None:
        """The gate of a call, in the loop, of a module function that steps the optimizer
        (`if not (i + 1) % K: step()` with `def step(): scaler.step(opt); ...`)."""
        for call in self._step_helper_calls(loop):
            for frame in reversed(loop.frames_of(call.stmt)):
                gate = update_gate(frame, loop.counters, loop.flags)
                if gate is not None:
                    return gate
        return None

    def _caller_gate(self, scope: Scope) -> Gate | None:
        """The step gate of the loop that calls this per-batch function, when that loop steps
        the optimizer itself or through another of the module's functions."""
        steps = [s.stmt for sites in self.sites.values() for s in sites if s.kind in STEP_KINDS]
        for callee in self.graph.scopes:
            if any(s.kind in STEP_KINDS for s in self.sites[id(callee)]):
                steps.extend(call.stmt for call in self.graph.callers(callee))
        for call in self.graph.callers(scope):
            per_batch = self._per_batch_body(call.stmt)
            gate = caller_gate(call.stmt, steps, per_batch, self.classes)
            if gate is not None:
                return gate
        return None

    def _per_batch_body(self, stmt: Stmt) -> bool:
        """Whether `stmt` is outside any loop of a function that runs every batch."""
        scope = stmt.scope
        return (
            not stmt.loops()
            and scope is not self.graph.scopes[0]
            and self.graph.called_in_loop(scope)
        )

    def _accumulate_gate(self, loop: TrainingLoop) -> Gate | None:
        """`with accelerator.accumulate(model):` gates the prepared optimizer's step."""
        for site in loop.sites:
            for region in regions_around(self.regions, site.stmt, RegionKind.ACCUMULATE):
                return Gate(
                    GateKind.ACCUMULATE, self.roles.engine_k(region.receiver), region.with_node
                )
        return None

    def _counts_windows(self, loop: TrainingLoop, kind: str, k: cst.BaseExpression | None) -> bool:
        """A modulo condition marks update steps only when its modulus is the accumulation value:
        `if step % args.logging_steps == 0:` beside a window of `args.grad_accum` is a logging
        cadence. A modulus is accepted when no K is known, when it names K as the step gate or
        the engine does (`self.update_freq` and `args.update_freq` alike), or when its name says
        it is an accumulation value."""
        if kind != GateKind.MODULO or k is None:
            return True
        gate_k = loop.gate.k if loop.gate else None
        known = [e for e in (gate_k, self.roles.engine_k()) if e is not None]
        if not known or K_NAME.search(short_name(k)):
            return True
        return short_name(k) in {short_name(e) for e in known}

    def _step_only_branches(self, loop: TrainingLoop, stmt: Stmt) -> set[tuple[int, bool]]:
        """`if` branches that hold a step of this path but no backward: the update branch."""
        steps = {b for s in loop.steps if same_path(s.stmt, stmt) for b in branches(s.stmt.frames)}
        backwards = {b for s in loop.backwards for b in branches(s.stmt.frames)}
        return steps - backwards


def _both_arms_step(gates: list[Gate], steps: list[Site]) -> bool:
    """Steps under both arms of a gate's condition (`if step % 2 == 0: opts[1].step() else:
    for opt in opts: opt.step()`): every iteration steps, so the condition chooses which
    optimizers step, it makes no window of the loss (an optimizer stepped in one arm only sums
    its gradients over the other arm's iterations, on purpose or not, but dividing the loss
    would shrink every update of the others)."""
    return any(
        f.node is gate.node and f.kind == FrameKind.IF and f.holds != gate.holds
        for gate in gates
        for step in steps
        for f in step.stmt.frames
    )


def short_name(node: cst.BaseExpression) -> str:
    """`update_freq` for `self.update_freq`; the code of anything that is not a dotted name."""
    text = dotted(node)
    return last_part(text) if text else code(strip_parens(node))


def branches(frames) -> set[tuple[int, bool]]:
    """The `if` branches (node, which arm) a statement sits in."""
    return {(id(f.node), f.holds) for f in frames if f.kind == FrameKind.IF}


def _under(loop: TrainingLoop, gate: Gate, stmt: Stmt) -> bool:
    """Whether the statement is in the arm of the gate's `if` that lets update steps through."""
    return any(f.node is gate.node and f.holds == gate.holds for f in loop.frames_of(stmt))


def _runs_with(stmt: Stmt, loop: cst.CSTNode, other: Stmt) -> bool:
    """Whether `stmt` is in `loop` (a loop, or a function that is one micro-step) and can run
    in the same iteration as `other`."""
    inside = loop is stmt.scope.node or any(f.node is loop for f in stmt.frames)
    return inside and same_path(stmt, other)


def _consuming_step(steps: list[Site], zeroes: list[Site], stmt: Stmt) -> Site:
    """The step that consumes what `stmt` leaves in `.grad`: the next one in the iteration (or,
    past the last, the first of the next) whose optimizer is not zeroed on the way. A gate makes
    a window only for the optimizer it gates: in an RL loop `qf_loss.backward();
    q_optimizer.step()` runs every iteration while the actor's step waits for `global_step %
    policy_frequency == 0`; a GAN's `d_opt.zero_grad(); d_loss.backward(); d_opt.step()` after
    `g_loss.backward()` leaves the generator's gradients to the gated `g_opt.step()`."""
    ordered = sorted(steps, key=lambda s: s.stmt.order)
    later = [s for s in ordered if s.stmt.order > stmt.order]
    for step in later:
        wiped = any(
            z.receiver == _stepped(step) and stmt.order < z.stmt.order < step.stmt.order
            for z in zeroes
        )
        if not wiped:
            return step
    return ordered[0]


def stepped_optimizer(step: Site) -> str | None:
    """The optimizer a step site steps (`opt` of `opt.step()` and of `scaler.step(opt)`)."""
    return _stepped(step)


def _stepped(step: Site) -> str | None:
    """The optimizer a step site steps: `opt` of `opt.step()` and of `scaler.step(opt)`."""
    if step.kind == SiteKind.SCALER_STEP and step.call is not None and step.call.args:
        return dotted(step.call.args[0].value)
    return step.receiver
