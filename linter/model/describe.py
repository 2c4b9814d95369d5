"""A plain-JSON view of the model (`accel-lint --show-loops`): what the linter understood."""

from __future__ import annotations

from linter.model import (
    Model,
    TrainingLoop,
    accumulation,
    checkpoints,
    distributed,
    evaluation,
    logged_losses,
    losses,
    precision,
    prepared_objects,
    scaler_protocol,
    schedules,
    windows,
)
from linter.model.config_space import gate_configuration, k_configuration
from linter.model.cst_util import code
from linter.model.eval_modes import eval_mode_leaks
from linter.model.gathers import metric_gathers
from linter.model.k_reads import k_reads
from linter.model.kinds import FlowState, GateKind, SiteKind
from linter.model.param_dtypes import param_casts
from linter.model.scaler_updates import covering_update

# A step function called once per batch is described as kind "step function".
_LOOP_KINDS = {"For": "for", "While": "while", "FunctionDef": "step function"}


def describe(model: Model, path: str) -> dict:
    found = {"file": path, "loops": [_loop(model, loop, path) for loop in model.loops]}
    for key, facts in (
        ("evaluation", _evaluation(model)),
        ("checkpoints", checkpoints.describe(model)),
        ("configuration", _configuration(model)),
    ):
        if facts:
            found[key] = facts
    return found


def _line(model: Model, node) -> int:
    return model.line(node)


def _evaluation(model: Model) -> list[dict]:
    """The evaluation contexts, then the gathers feeding a metric, then the eval modes never
    undone (the last two build on `evaluation`, so they are added here)."""
    entries = evaluation.describe(model)
    for gather in metric_gathers(model):
        entries.append(
            {
                "kind": "gather feeding a metric",
                "line": model.line(gather.call),
                "sink": gather.sink,
            }
        )
    for leak in eval_mode_leaks(model):
        entries.append({"kind": "eval mode never undone", "line": model.line(leak.eval_call.call)})
    return entries


def _configuration(model: Model) -> dict | None:
    """The configuration space read: each knob, its default, choices and where it came from."""
    from linter.model.config_space import config_space

    space = config_space(model).describe()
    return space if space["knobs"] or space["notes"] else None


def _loop(model: Model, loop: TrainingLoop, path: str) -> dict:
    scope = loop.scope
    function = scope.name if scope.class_name is None else f"{scope.class_name}.{scope.name}"
    every, update = [], []
    for site in loop.sites:
        entry = _site(model, site)
        (update if model.on_update_step(loop, site.stmt) else every).append(entry)
    return {
        "file": path,
        "function": function,
        "line": _line(model, loop.node),
        "kind": _LOOP_KINDS.get(type(loop.node).__name__, "while"),
        "engines": [_engine(model, e) for e in model.setup.engines.values()],
        "scalers": [
            {"name": s.name, "enabled": _enabled(s.enabled), "line": _line(model, s.node)}
            for s in model.setup.scalers.values()
        ],
        "optimizers": _used(model.setup.optimizers, loop, SiteKind.OPT_STEP, SiteKind.ZERO_GRAD),
        "schedulers": _used(model.setup.schedulers, loop, SiteKind.SCHED_STEP),
        "ddp_models": sorted(model.setup.ddp_models),
        "distributed": distributed.describe(model, loop),
        "prepared": {p.original: p.name for p in model.setup.prepared.values()},
        "prepared_objects": prepared_objects.describe(model, loop),
        "accumulation": _accumulation(model, loop),
        "accumulation_windows": {
            **accumulation.describe_loop(model, loop),
            "k_reads": sorted({r.kind for r in k_reads(model)}),  # what ACL313 weighs
        },
        "step_branch": _step_branch(model, loop),
        "regions": [
            {"kind": r.kind, "code": code(r.call), "line": _line(model, r.call)}
            for r in model.regions
            if any(f.node is loop.node for f in r.frames)
        ],
        "every_micro_step": every,
        "update_step_only": update,
        "backwards": [_backward(model, site) for site in loop.backwards],
        "schedule_lengths": schedules.describe(model, loop),
        "logged_losses": logged_losses.describe(model, loop),
        "scaler_protocol": scaler_protocol.describe(model, loop.node, covering_update),
        "step_gate_window": windows.describe(model, loop),
        "precision": precision.describe(model, loop, param_casts(model)),
    }


def _used(known, loop: TrainingLoop, *kinds: str) -> list[str]:
    """Names built as such in the module plus those the loop uses that way."""
    return sorted(set(known) | {s.receiver for s in loop.of_kind(*kinds) if s.receiver})


def _enabled(state: bool | None) -> str:
    return {True: "yes", False: "no", None: "at runtime"}[state]


def _engine(model: Model, engine) -> dict:
    accum = engine.accum
    return {
        "name": engine.name,
        "kind": engine.kind,
        "mixed_precision": engine.mixed_precision or "not statically known",
        "gradient_accumulation_steps": code(accum) if accum is not None else None,
        "line": _line(model, engine.node),
    }


def _site(model: Model, site) -> dict:
    node = site.call if site.call is not None else site.node
    return {"kind": site.kind, "code": code(node), "line": _line(model, node)}


def _accumulation(model: Model, loop: TrainingLoop) -> dict | None:
    gate = loop.gate
    if gate is not None and gate.k is not None:
        source = {
            "modulo": "modulus of the step gate",
            "counter": "micro-step counter compared with K",
            "micro-loop": "micro-step loop range",
            "accumulate": "gradient_accumulation_steps of the engine",
        }.get(gate.kind, gate.kind)
        return {
            "k": code(gate.k),
            "value": model.int_value(gate.k),
            "source": source,
            "line": _line(model, gate.k),
            **_k_setting(model, gate_configuration(model, gate, loop.scope)),
        }
    k = model.engine_k()
    if k is not None:
        return {
            "k": code(k),
            "value": model.int_value(k),
            "source": "gradient_accumulation_steps of the engine",
            "line": _line(model, k),
            **_k_setting(model, k_configuration(model, k)),
        }
    return None


def _k_setting(model: Model, configuration) -> dict:
    """K's knob, when K is a setting (`with --k > 1 (default 1)`)."""
    return {"setting": configuration.condition} if configuration is not None else {}


def _step_branch(model: Model, loop: TrainingLoop) -> dict | None:
    gate = loop.gate
    if gate is None:
        return None
    if gate.kind == GateKind.ACCUMULATE:
        condition = code(gate.node.items[0].item)
    elif gate.kind == GateKind.MICRO_LOOP:
        condition = f"after the loop `for ... in {code(gate.node.iter)}`"
    else:
        condition = code(gate.test)
        condition = condition if gate.holds else f"not ({condition})"
    return {"kind": gate.kind, "condition": condition, "line": _line(model, gate.node)}


def _backward(model: Model, site) -> dict:
    flow = model.flow(site)
    steps = []
    if flow is not None:
        steps = [{"code": text, "line": _line(model, stmt.node)} for text, stmt in flow.steps]
    steps.append({"code": code(site.call), "line": _line(model, site.call)})
    return {
        "kind": site.kind,
        "line": _line(model, site.call),
        "loss": flow.state if flow is not None else FlowState.UNKNOWN,
        "dataflow": steps,
        "models": sorted(flow.models) if flow is not None else [],
        "token_means": losses.describe(model, site),
    }
