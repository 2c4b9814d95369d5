"""Every kind the model builds on the fixtures is a member of its `StrEnum` (`linter.model.kinds`).

Members compare equal to their strings, so a bare string kind would still work and go unnoticed;
this asserts the type, so a new kind has to be added to its enum (with its docstring).
"""

from __future__ import annotations

from pathlib import Path

import libcst
import pytest

from linter.model import Model
from linter.model.checkpoints import checkpoints
from linter.model.classes import context_summary
from linter.model.k_reads import k_reads
from linter.model.kinds import (
    BuiltKind,
    CheckpointKind,
    ContextKind,
    EngineKind,
    FlowState,
    FrameKind,
    GateKind,
    LossTermKind,
    ReadKind,
    RegionKind,
    ScalerRole,
    SiteKind,
)
from linter.model.losses import _TokenMeans, token_means
from linter.model.setup import built_kind, engine_kind

FIXTURES = sorted((Path(__file__).resolve().parents[3] / "fixtures").glob("*/*.py"))


def _kinds(model: Model) -> list[tuple[str, object, type]]:
    """(what, kind, its enum) for every kind the model holds."""
    found = []
    for scope in model.scopes:
        for call in scope.calls:
            found += [("frame", f.kind, FrameKind) for f in call.stmt.frames]
    found += [("engine", e.kind, EngineKind) for e in model.setup.engines.values()]
    found += [("region", r.kind, RegionKind) for r in model.regions]
    found += [("region frame", f.kind, FrameKind) for r in model.regions for f in r.frames]
    for sites in model.sites.values():
        for site in sites:
            scope = site.stmt.scope
            found.append(("site", site.kind, SiteKind))
            found += [("site frame", f.kind, FrameKind) for f in site.stmt.frames]
            if (role := model.scaler_role(site.receiver, scope)) is not None:
                found.append(("scaler role", role, ScalerRole))
            if (engine := model.engine_for(site.receiver, scope)) is not None:
                found.append(("engine of a site", engine.kind, EngineKind))
            if site.kind in (SiteKind.BACKWARD, SiteKind.ENGINE_BACKWARD):
                if (flow := model.flow(site)) is not None:
                    found.append(("flow", flow.state, FlowState))
                found += [("loss term", t.kind, LossTermKind) for t in token_means(model, site)]
    for loop in model.loops:
        if loop.gate is not None:
            found.append(("loop gate", loop.gate.kind, GateKind))
        for site in loop.sites:
            if (gate := model.gate_for(loop, site.stmt)) is not None:
                found.append(("gate", gate.kind, GateKind))
    found += [("read of K", read.kind, ReadKind) for read in k_reads(model)]
    found += [("checkpoint", saved.kind, CheckpointKind) for saved in checkpoints(model)]
    return found


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_kind_is_a_member_of_its_enum(path: Path) -> None:
    source = path.read_text()
    model = Model(libcst.parse_module(source), source=source, path=str(path))
    strays = [(what, kind) for what, kind, enum in _kinds(model) if not isinstance(kind, enum)]
    assert strays == []


def test_the_fixtures_build_every_site_gate_region_and_frame_kind() -> None:
    """The check above sees most kinds: a fixture set that lost them would make it vacuous."""
    seen: dict[type, set] = {}
    for path in FIXTURES:
        source = path.read_text()
        model = Model(libcst.parse_module(source), source=source, path=str(path))
        for _, kind, enum in _kinds(model):
            seen.setdefault(enum, set()).add(kind)
    assert seen[SiteKind] >= {SiteKind.BACKWARD, SiteKind.OPT_STEP, SiteKind.SCALER_STEP}
    assert seen[FrameKind] == set(FrameKind)
    assert seen[RegionKind] >= {RegionKind.ACCUMULATE, RegionKind.AUTOCAST}
    assert seen[GateKind] >= {GateKind.MODULO, GateKind.ACCUMULATE}
    assert seen[FlowState] >= {FlowState.DIVIDED, FlowState.UNDIVIDED}
    assert seen[ReadKind] >= {ReadKind.ENGINE, ReadKind.GATE, ReadKind.DIVISION}
    assert seen[CheckpointKind] >= {CheckpointKind.TORCH_SAVE}
    assert seen[LossTermKind] == {LossTermKind.MEAN}  # a sum is no finding: see below


@pytest.mark.parametrize(
    ("qual", "built", "engine"),
    [
        ("torch.cuda.amp.GradScaler", BuiltKind.SCALER, None),
        ("accelerate.Accelerator", BuiltKind.ENGINE, EngineKind.ACCELERATE),
        ("guard.Engine", BuiltKind.ENGINE, EngineKind.GUARD),
        ("lightning.Fabric", BuiltKind.ENGINE, EngineKind.FABRIC),
        ("game.Engine", None, None),  # an engine class of another package
        ("torch.nn.parallel.DistributedDataParallel", BuiltKind.DDP, None),
        ("torch.optim.lr_scheduler.LambdaLR", BuiltKind.SCHEDULER, None),
        ("transformers.get_cosine_schedule_with_warmup", BuiltKind.SCHEDULER, None),
        ("torch.optim.AdamW", BuiltKind.OPTIMIZER, None),
        ("torch.nn.Linear", None, None),
    ],
)
def test_what_a_constructor_builds_and_its_engine_library(qual, built, engine) -> None:
    assert (built_kind(qual), engine_kind(qual)) == (built, engine)
    assert built is None or type(built_kind(qual)) is BuiltKind
    assert engine is None or type(engine_kind(qual)) is EngineKind


SUMMED = """
import torch.nn.functional as F


def train(model, loader, optimizer, accelerator):
    for batch in loader:
        with accelerator.accumulate(model):
            logits = model(batch["input_ids"])
            loss = F.cross_entropy(logits, batch["labels"], ignore_index=-100, reduction="sum")
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
"""


def test_a_token_sum_is_a_loss_term_of_its_own_kind() -> None:
    model = Model(libcst.parse_module(SUMMED), source=SUMMED)
    sites = [s for found in model.sites.values() for s in found]
    (site,) = [s for s in sites if s.kind == SiteKind.ENGINE_BACKWARD]
    stmt = site.stmt
    terms = _TokenMeans(model).of(model.loss_expr(site), stmt.scope, stmt.order, stmt, 0)
    assert [type(t.kind) for t in terms] == [LossTermKind]
    assert [t.kind for t in terms] == [LossTermKind.SUM]
    assert token_means(model, site) == []  # a sum by itself is no finding


CONTEXTS = """
import contextlib

import torch


@contextlib.contextmanager
def maybe_no_sync(model, sync):
    if sync:
        yield
    else:
        with model.no_sync():
            yield


@contextlib.contextmanager
def evaluating():
    with torch.no_grad():
        yield


@contextlib.contextmanager
def training():
    with torch.enable_grad():
        yield


class MixedPrecision:
    def __enter__(self):
        self.ctx = torch.autocast("cuda", dtype=torch.float16)
        return self.ctx.__enter__()


class EngineMixedPrecision:
    def __init__(self, accelerator):
        self.accelerator = accelerator

    def __enter__(self):
        self.ctx = accelerator.autocast()
        return self.ctx.__enter__()


accelerator = Accelerator()
"""


def test_what_a_context_manager_enters_is_a_member_of_its_enum() -> None:
    model = Model(libcst.parse_module(CONTEXTS), source=CONTEXTS)
    names = ["maybe_no_sync", "evaluating", "training", "MixedPrecision", "EngineMixedPrecision"]
    entered = [e.kind for name in names for e in context_summary(model, name).enters]
    assert entered == [
        ContextKind.NO_SYNC,
        ContextKind.NO_GRAD,
        ContextKind.ENABLE_GRAD,
        ContextKind.AUTOCAST,
        ContextKind.ENGINE_AUTOCAST,
    ]
    assert all(type(kind) is ContextKind for kind in entered)


SAVED = """
import torch
from accelerate import Accelerator

accelerator = Accelerator()


def save(model, optimizer, path):
    accelerator.save_state(path)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path + ".pt")
"""


def test_a_checkpoint_is_saved_by_the_engine_or_by_torch_save() -> None:
    model = Model(libcst.parse_module(SAVED), source=SAVED)
    kinds = [saved.kind for saved in checkpoints(model)]
    assert kinds == [CheckpointKind.ENGINE, CheckpointKind.TORCH_SAVE]
    assert all(type(kind) is CheckpointKind for kind in kinds)
