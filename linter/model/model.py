"""The training-loop model: what a reviewer knows about a module before judging it.

`Model(module)` is built once per file; rules ask it questions (which loop owns this backward,
is this statement on the update step, which engine is in scope here) instead of re-walking the CST.
This class is the facade: each question is answered by a topic module —
`callgraph` (who calls what, with which arguments), `roles` (engines, scalers, optimizers,
schedulers), `sites` (the calls and regions rules care about), `prepared` (objects that went through
`prepare`), `scaling` (the loss of a backward and its loss scaling), `gates` (the update step),
`loops` (training loops and their step gate), `dataflow` (the loss's path to a backward).
Topic modules added for later rules keep their facts in `memo`.
"""

from __future__ import annotations

import ast
from functools import partial

import libcst as cst

from linter.model import constants, cst_util
from linter.model.callgraph import CallGraph
from linter.model.classes import (
    Classes,
    entered_region,
    inline_instance_calls,
    inline_method_sites,
)
from linter.model.cst_util import forget_children, method_call
from linter.model.dataflow import Flow, trace_loss
from linter.model.functions import CallSite, Def, Scope, ScopeCollector, Stmt
from linter.model.gates import Gates, regions_around
from linter.model.kinds import EngineKind, FrameKind, RegionKind, ScalerRole, SiteKind
from linter.model.loops import (
    BACKWARD_KINDS,
    STEP_KINDS,
    Gate,
    Region,
    Site,
    TrainingLoop,
    delegating_loops,
    find_training_loops,
)
from linter.model.names import Imports
from linter.model.positions import Positions
from linter.model.prepared import PreparedObjects
from linter.model.roles import Roles
from linter.model.scaling import Scaling
from linter.model.setup import Engine, SetupCollector
from linter.model.sites import SiteFinder


class Model:
    def __init__(
        self,
        module: cst.Module,
        source: str | None = None,
        tree: ast.Module | None = None,
        path: str | None = None,
    ) -> None:
        forget_children()  # the last module's tree, which nothing reads any more
        self.module = module
        self.source = source  # the module's text (None when built from a tree alone)
        self.path = path  # the file's shown path: config files it loads are found beside it
        self.positions = Positions(module, source, tree)  # tree: `ast` of source, when parsed
        collector = ScopeCollector(module)
        self.scopes: list[Scope] = collector.scopes
        self.function_defs = collector.function_defs
        self.class_names = collector.class_names
        self.imports = Imports()
        for node in collector.imports:
            self.imports.add(node)
        self.graph = CallGraph(self.scopes, self.function_defs, self.imports)
        self.classes = Classes(self.scopes)  # what each class binds on `self`
        self.calls: list[CallSite] = self.graph.calls
        self.setup = SetupCollector(self.scopes, self.imports, self.graph).setup
        self.roles = Roles(self.setup, self.graph, self.imports)
        self.prepared = PreparedObjects(self.setup, self.graph)
        self.scaling = Scaling(self.roles, self.imports)
        local_context = partial(entered_region, self)
        graph = self.graph
        finder = SiteFinder(
            self.roles, self.imports, graph.module_defs, graph.local_function, local_context
        )
        self.sites: dict[int, list[Site]] = {}
        self.loops: list[TrainingLoop] = []
        self.regions: list[Region] = []
        for scope in self.scopes:
            self.sites[id(scope)] = finder.sites(scope)
        inline_method_sites(self.graph, self.sites)  # a trainer's step split over methods
        self.instance_calls = inline_instance_calls(self.graph, self.sites)  # a loss scaler
        delegating: list[TrainingLoop] = []  # after the loops that hold their backward
        for scope in self.scopes:
            sites = self.sites[id(scope)]
            per_batch = self.graph.called_in_loop(scope)
            delegates = self._backward_left_to(scope)
            found = find_training_loops(scope, sites, per_batch, self.classes, delegates)
            if not found:
                delegating.extend(delegating_loops(scope, sites, self.classes, delegates))
            self.loops.extend(found)
            self.regions.extend(finder.regions(scope))
        self.loops.extend(delegating)
        self.gates = Gates(self.graph, self.sites, self.regions, self.roles, self.classes)
        for loop in self.loops:
            self.gates.assign(loop)
        self._calls_by_with: dict[int, list[CallSite]] | None = None

    def _backward_left_to(self, scope: Scope) -> list[Stmt]:
        """The calls in `scope` of functions of the module that run a backward and leave the
        step to their caller (a trainer's `self.backward(loss)`)."""
        found = []
        for call in scope.calls:
            callee = self.graph.local_function(call.call.func, scope)
            if callee is not None and callee is not scope:
                kinds = {s.kind for s in self.sites[id(callee)]}
                if kinds & set(BACKWARD_KINDS) and not kinds & set(STEP_KINDS):
                    found.append(call.stmt)
        return found

    def lines(self) -> list[str]:
        """The source split at "\\n", shared by every rule's context (one split per module)."""
        return self.memo("lines", lambda m: m.source.split("\n"))

    def memo(self, key: str, build):
        """A fact built once per module on first use: `model.memo("precision", build)` where
        `build(model)` makes it. Topic modules (`linter/model/<topic>.py`) keep their facts here,
        so rules share them without growing this class."""
        facts = self.__dict__.setdefault("_memo", {})
        if key not in facts:
            facts[key] = build(self)
        return facts[key]

    # the call graph -------------------------------------------------------------------
    def module_defs(self, text: str) -> list[Def]:
        return self.graph.module_defs(text)

    def local_function(self, func: cst.BaseExpression, scope: Scope) -> Scope | None:
        return self.graph.local_function(func, scope)

    def defines_function(self, func: cst.BaseExpression) -> bool:
        return self.graph.defines_function(func)

    def argument_sites(self, scope: Scope, param: str) -> list[tuple[cst.BaseExpression, Stmt]]:
        return self.graph.argument_sites(scope, param)

    # roles ------------------------------------------------------------------------------
    def engine_for(self, text: str | None, scope: Scope | None = None) -> Engine | None:
        return self.roles.engine_for(text, scope)

    def scaler_role(self, text: str | None, scope: Scope | None = None) -> ScalerRole | None:
        return self.roles.scaler_role(text, scope)

    def is_optimizer(self, text: str | None) -> bool:
        return self.roles.is_optimizer(text)

    def is_scheduler(self, text: str | None) -> bool:
        return self.roles.is_scheduler(text)

    def engine_k(self, engine_text: str | None = None) -> cst.BaseExpression | None:
        return self.roles.engine_k(engine_text)

    def engine_in_scope(self, scope: Scope) -> str | None:
        return self.roles.engine_in_scope(scope)

    def divides_by_k(self, site: Site) -> bool:
        """Whether an engine backward divides by the accumulation steps itself (Fabric's does
        not: it scales for precision only, the loop divides)."""
        pair = method_call(site.call) if site.call is not None else None
        if pair is not None and pair[1] == "manual_backward":
            return False  # Lightning leaves accumulation to manual optimization
        engine = self.engine_for(site.receiver, site.stmt.scope)
        return engine is None or engine.kind != EngineKind.FABRIC

    # prepared objects -------------------------------------------------------------------
    def is_prepared(self, text: str | None, scope: Scope, order: int | None = None) -> bool:
        return self.prepared.is_prepared(text, scope, order)

    def derives_from_prepared(self, text: str | None, scope: Scope) -> bool:
        return self.prepared.derives_from_prepared(text, scope)

    def seen_prepared(self, text: str | None, scope: Scope) -> bool:
        return self.prepared.seen_prepared(text, scope)

    def prepared_in_reach(self, scope: Scope) -> bool:
        return self.prepared.prepared_in_reach(scope)

    # the loss and its scaling ---------------------------------------------------------------
    def flow(self, site: Site) -> Flow | None:
        """The dataflow of the loss of a backward site."""
        loss = self.loss_expr(site)
        if loss is None:
            return None
        return trace_loss(self, site.stmt.scope, loss, site.stmt)

    def loss_expr(self, site: Site) -> cst.BaseExpression | None:
        return self.scaling.loss_expr(site)

    def is_backward_function(self, call: cst.Call) -> bool:
        return self.scaling.is_backward_function(call)

    def scaled_loss(self, node: cst.CSTNode, scope: Scope) -> cst.BaseExpression | None:
        return self.scaling.scaled_loss(node, scope)

    def is_scaled_loss(self, node: cst.CSTNode, scope: Scope, order: int) -> bool:
        return self.scaling.is_scaled_loss(node, scope, order)

    def scale_loss_source(self, name: str, scope: Scope) -> cst.BaseExpression | None:
        return self.scaling.scale_loss_source(name, scope)

    def names_a_sequence(self, expr: cst.BaseExpression, stmt: Stmt) -> bool:
        return self.scaling.names_a_sequence(expr, stmt)

    # regions and the update step --------------------------------------------------------
    def regions_around(self, stmt: Stmt, kind: RegionKind) -> list[Region]:
        return regions_around(self.regions, stmt, kind)

    def calls_in_with(self, with_node: cst.With) -> list[CallSite]:
        """The call sites inside a `with` block (built once per module, on first use)."""
        if self._calls_by_with is None:
            self._calls_by_with = {}
            for call in self.calls:
                for frame in call.stmt.frames:
                    if frame.kind == FrameKind.WITH:
                        self._calls_by_with.setdefault(id(frame.node), []).append(call)
        return self._calls_by_with.get(id(with_node), [])

    def gate_for(self, loop: TrainingLoop, stmt: Stmt) -> Gate | None:
        return self.gates.gate_for(loop, stmt)

    def on_update_step(
        self, loop: TrainingLoop, stmt: Stmt, node: cst.CSTNode | None = None
    ) -> bool:
        return self.gates.on_update_step(loop, stmt, node)

    def reached_sites(self, loop: TrainingLoop, stmt: Stmt, *kinds: SiteKind) -> list[Site]:
        return self.gates.reached_sites(loop, stmt, *kinds)

    def step_helper_sites(self, loop: TrainingLoop, *kinds: SiteKind) -> list[tuple[Stmt, Site]]:
        return self.gates.step_helper_sites(loop, *kinds)

    def has_training_loop(self) -> bool:
        return bool(self.loops)

    def line(self, node: cst.CSTNode) -> int:
        return self.positions.line(node)

    def int_value(self, node: cst.CSTNode | None) -> int | None:
        """The integer an expression is known to hold: a literal, or a name the module binds
        once to one (`ACCUM_STEPS = 4`), so K's value reads the same wherever K is named."""
        return constants.int_value(self, node)

    def fixed_int(self, node: cst.CSTNode | None) -> int | None:
        """The integer a literal at this use holds. "No accumulation" is decided by it (the
        catalogue's "absent or literal 1"): a module constant `GRAD_ACCUM = 1` is a setting a
        run may change, so a rule judges the loop by its code there, not by the value."""
        return cst_util.int_value(node)
