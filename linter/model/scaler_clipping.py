"""ACL104's questions: which torch clips see gradients still multiplied by the loss scale.

Raw loops: a clip reached from a scaled backward with nothing unscaling in between on its path.
Accelerate / guard engine loops: a torch clip after the engine's backward when the precision may
be fp16, or in a file that configures FSDP (where torch's clip computes a per-shard norm).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.callgraph import argument_for
from linter.model.classes import inlined_callee
from linter.model.cst_util import code, int_value, last_part, positional, string_value
from linter.model.functions import Stmt
from linter.model.kinds import EngineKind, FrameKind, SiteKind
from linter.model.loops import Site, same_path
from linter.model.scaler_protocol import (
    UNSCALING,
    Body,
    ScaledBackward,
    bodies,
    helper_stmts,
    scaled_backwards,
)

if TYPE_CHECKING:
    from linter.model import Model

__all__ = ["bodies", "ScaledClip", "EngineClip", "unscaled_clips", "engine_clips"]
_CLIP_NAMES = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"}


@dataclass(eq=False)
class ScaledClip:
    """A torch clip reached from a scaled backward with nothing unscaling in between (ACL104)."""

    site: Site
    body: Body
    scaled: ScaledBackward


# ACL104: clips of still-scaled gradients ---------------------------------------------------------
def is_torch_clip(model: Model, site: Site) -> bool:
    """`torch.nn.utils.clip_grad_norm_` / `clip_grad_value_` under any import spelling; not an
    engine's or a module's own `clip_grad_norm_` method (which unscale or shard themselves)."""
    if site.kind != SiteKind.CLIP or site.call is None:
        return False
    func = site.call.func
    qual = model.imports.qualify(func) or ""
    if last_part(qual) not in _CLIP_NAMES:
        return False
    if qual.startswith("torch.nn.utils."):
        return True
    return isinstance(func, cst.Name) and model.local_function(func, site.stmt.scope) is None


def unscaled_clips(model: Model, body: Body) -> list[ScaledClip]:
    """Torch clips after a scaled backward on their path with no `unscale_` (or `scaler.step`, or
    a helper doing either) between the two, on every way from one to the other."""
    scaled = scaled_backwards(model, body)
    if not scaled:
        return []
    unscaling = [s.stmt for s in body.sites if s.kind in UNSCALING]
    unscaling += helper_stmts(model, body, *UNSCALING)
    found = []
    for site in _clips(model, body):
        before = [
            sb
            for sb in scaled
            if sb.site.stmt.order < site.stmt.order and same_path(sb.site.stmt, site.stmt)
        ]
        bare = [
            sb
            for sb in before
            if not _unscaled_between(body, sb.site.stmt, site.stmt, unscaling, sb.conditions)
            and not _other_branch_steps(body, site.stmt, sb.scaler)
        ]
        if bare:
            found.append(ScaledClip(site, body, bare[-1]))
    return found


def _clips(model: Model, body: Body) -> list[Site]:
    """The body's torch clips, and its calls of module functions that clip with torch and do not
    unscale (`self.clip_gradients()`): there the call is what clips."""
    found = []
    for call in body.scope.calls:
        if not body.contains(call.stmt):
            continue
        callee = model.local_function(call.call.func, call.stmt.scope)
        if callee is None or callee is body.scope:
            continue
        sites = model.sites[id(callee)]
        if any(s.kind in (SiteKind.BACKWARD, SiteKind.ENGINE_BACKWARD) for s in sites):
            continue
        if inlined_callee(model.graph, call) and any(s.kind in UNSCALING for s in sites):
            continue  # a method of the class that steps: its clip is the body's, at its line
        clips = [s.stmt.order for s in sites if is_torch_clip(model, s)]
        # an update helper (`def update(scaler, opt): clip(...); scaler.step(opt)`) that clips
        # before anything in it unscales clips what the caller's backward scaled
        if clips and not any(s.kind in UNSCALING and s.stmt.order < min(clips) for s in sites):
            found.append(Site(SiteKind.CLIP, call.call, call.stmt))
    # a method's clip seen at its call (`self.optimizer_step()`), unless the call is what clips
    calls = {id(s.stmt) for s in found}
    own = [s for s in body.sites if is_torch_clip(model, s) and id(s.stmt.via) not in calls]
    return sorted(found + own, key=lambda s: s.stmt.order)


def _other_branch_steps(body: Body, stmt: Stmt, scaler: str) -> bool:
    """`if scaler is not None: unscale_, clip, scaler.step ... else: clip, opt.step()`: the branch
    opposite to the one stepping through the scaler is the fp32 path, whatever ran before."""
    mine = {(id(f.node), f.holds) for f in stmt.frames_inside(body.node) if f.kind == FrameKind.IF}
    for site in body.sites:
        if site.kind in UNSCALING and site.receiver == scaler:
            for frame in site.stmt.frames_inside(body.node):
                if frame.kind == FrameKind.IF and (id(frame.node), not frame.holds) in mine:
                    return True
    return False


def _unscaled_between(
    body: Body, backward: Stmt, clip: Stmt, unscaling: list[Stmt], inner=frozenset()
) -> bool:
    """An unscaling statement between the two that runs whenever both do: `if amp: backward;
    unscale_` and `if clip: unscale_; clip(...)` both count, `if log: unscale_` does not. A test
    about the precision itself (`if scaler is not None:`, `if args.fp16:`) also counts: where it
    fails, no scaled backward ran. `inner`: what a helper's backward needs inside the helper."""
    allowed = body.conditions(backward) | body.conditions(clip) | inner
    for stmt in unscaling:
        if backward.order < stmt.order < clip.order:
            if same_path(stmt, backward) and same_path(stmt, clip):
                extra = body.conditions(stmt) - allowed
                if all(_PRECISION_TEST.search(test) for test, _ in extra):
                    return True
    return False


_PRECISION_TEST = re.compile(r"scal|amp|fp16|half|mixed|precision|autocast", re.I)


def unscale_target(model: Model, clip: ScaledClip) -> str | None:
    """The optimizer to unscale before a clip: the one of the next `scaler.step(...)` of the same
    scaler on the clip's path."""
    for site in clip.body.sites:
        if site.kind != SiteKind.SCALER_STEP or site.receiver != clip.scaled.scaler:
            continue
        if site.stmt.order > clip.site.stmt.order and same_path(site.stmt, clip.site.stmt):
            args = positional(site.call) if site.call is not None else []
            return code(args[0]) if args else None
    return _helper_step_target(model, clip)


def _helper_step_target(model: Model, clip: ScaledClip) -> str | None:
    """For a call of an update helper that clips, then steps (`update(scaler, optimizer)`
    running `clip_grad_norm_(...); scaler.step(optimizer)`): the optimizer its step is handed,
    as the call passes it, when the scaler it steps is the one the call passes too."""
    call = clip.site.call
    callee = model.local_function(call.func, clip.site.stmt.scope) if call is not None else None
    if callee is None:
        return None
    for site in model.sites[id(callee)]:
        args = positional(site.call) if site.kind == SiteKind.SCALER_STEP else []
        if not args:
            continue
        scaler = _as_passed(callee, call, site.receiver)
        optimizer = _as_passed(callee, call, code(args[0]))
        return optimizer if scaler == clip.scaled.scaler else None
    return None


def _as_passed(callee, call: cst.Call, name: str | None) -> str | None:
    """What `call` passes for the parameter `name` of `callee`, as code."""
    if name not in callee.params:
        return None
    passed = argument_for(callee, call, name)
    return code(passed) if passed is not None else None


# ACL104 under an engine -------------------------------------------------------------------------
@dataclass(eq=False)
class EngineClip:
    """A torch clip after an Accelerate / guard engine backward whose precision may be fp16, or
    in a file that configures FSDP."""

    site: Site
    engine: str  # the engine expression the backward uses
    precision: str | None  # "fp16", or None when not statically known
    fsdp: bool
    # Only the first flagged clip of a path gets a fix: once it unscales, the later ones are
    # judged again (a second unscale before `update()` would raise).
    first: bool = True


def engine_clips(model: Model, body: Body) -> list[EngineClip]:
    if not body.repeats:
        return []
    fsdp = fsdp_configured(model)
    backwards = []
    for site in body.sites:
        if site.kind != SiteKind.ENGINE_BACKWARD:
            continue
        engine = model.engine_for(site.receiver, site.stmt.scope)
        if engine is not None and engine.kind in (EngineKind.ACCELERATE, EngineKind.GUARD):
            backwards.append((site, engine))
    # `accelerator.clip_grad_norm_` unscales too: a torch clip after it sees true gradients.
    unscaling = [s.stmt for s in body.sites if s.kind == SiteKind.UNSCALE or _engine_clip(model, s)]
    unscaling += helper_stmts(model, body, SiteKind.UNSCALE)
    found: list[EngineClip] = []
    for site in body.sites:
        if not is_torch_clip(model, site):
            continue
        for backward, engine in reversed(backwards):
            if backward.stmt.order > site.stmt.order or not same_path(backward.stmt, site.stmt):
                continue
            if _unscaled_between(body, backward.stmt, site.stmt, unscaling):
                break
            precision = engine_precision(engine)
            if precision in ("fp16", None) or fsdp:
                first = not any(same_path(f.site.stmt, site.stmt) for f in found)
                name = backward.receiver or engine.name
                found.append(EngineClip(site, name, precision, fsdp, first))
            break
    return found


def _engine_clip(model: Model, site: Site) -> bool:
    return site.kind == SiteKind.CLIP and site.call is not None and not is_torch_clip(model, site)


def engine_precision(engine) -> str | None:
    """The engine's mixed precision when statically known: its literal argument, or the guard
    engine's default `"no"` when it is given none."""
    if engine.mixed_precision is not None:
        return engine.mixed_precision
    call = engine.node
    if engine.kind == EngineKind.GUARD and isinstance(call, cst.Call):
        given = any(
            a.star or (a.keyword and a.keyword.value == "mixed_precision") for a in call.args
        )
        if not given and not positional(call):
            return "no"
    return None


def fsdp_configured(model: Model) -> bool:
    """An FSDP1 plugin in the file, where torch's clip measures one rank's shard:
    `FullyShardedDataParallelPlugin(...)` without `fsdp_version=2`, or `fsdp_plugin=` given
    something else. FSDP2 (`fsdp_version=2`, the guard engine's `guard.FSDP2Plugin(...)` /
    `fsdp_plugin=True`) shards parameters as DTensors, whose norm torch all-reduces."""
    return model.memo("scaler_protocol.fsdp", _find_fsdp)


_FSDP_PLUGIN = "FullyShardedDataParallelPlugin"


def _find_fsdp(model: Model) -> bool:
    plugins = [c.call for c in model.calls if _qualified_last(model, c.call) == _FSDP_PLUGIN]
    if any(not _fsdp2_plugin(model, call) for call in plugins):
        return True
    for call in model.calls:
        for arg in call.call.args:
            if arg.keyword is not None and arg.keyword.value == "fsdp_plugin":
                if not _fsdp2_value(model, arg.value, bool(plugins)):
                    return True
    return False


def _qualified_last(model: Model, call: cst.Call) -> str:
    return last_part(model.imports.qualify(call.func))


def _fsdp2_plugin(model: Model, call: cst.Call) -> bool:
    """`FullyShardedDataParallelPlugin(..., fsdp_version=2)` (Accelerate's default is 1)."""
    return any(
        a.keyword is not None and a.keyword.value == "fsdp_version" and int_value(a.value) == 2
        for a in call.args
    )


def _fsdp2_value(model: Model, value: cst.BaseExpression, plugins_seen: bool) -> bool:
    """An `fsdp_plugin=` value that is FSDP2: the guard engine's `FSDP2Plugin(...)`, `True` or
    `"fsdp2"`, or a plugin the file builds (judged at its constructor); a name bound elsewhere
    counts as FSDP2 only when every plugin the file builds is one."""
    if isinstance(value, cst.Call):
        name = _qualified_last(model, value)
        return name == "FSDP2Plugin" or (name == _FSDP_PLUGIN and _fsdp2_plugin(model, value))
    if isinstance(value, cst.Name) and value.value in ("True", "None", "False"):
        return True  # the guard engine's FSDP2 defaults, or no FSDP at all
    if isinstance(value, cst.SimpleString) and string_value(value) == "fsdp2":
        return True
    return plugins_seen
