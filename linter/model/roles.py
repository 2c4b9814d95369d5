"""Roles of names: which expression holds an engine, a GradScaler, an optimizer, a scheduler.

Known constructions (`model.setup`) come first; then parameters resolved from annotations and
the arguments the module's callers pass; last, names (`accelerator`, `scaler`, `optimizer`), as a
reviewer reading an unfamiliar helper would.
"""

from __future__ import annotations

import re

from linter.model.callgraph import CallGraph
from linter.model.cst_util import code, dotted, last_part, positional
from linter.model.functions import Scope, bound_arguments
from linter.model.kinds import EngineKind, ScalerRole
from linter.model.setup import ENGINE_CLASSES, Engine, Setup

_ENGINE_NAME = re.compile(r"^(accelerator|accel|engine|model_engine|\w+_engine|fabric)$")
_OPTIMIZER_NAME = re.compile(r"(^|_)(opt|optim|optimizer|optimiser)(s|_\w+|\d+)?$|optimizer")
_SCHEDULER_NAME = re.compile(r"sched")


class Roles:
    def __init__(self, setup: Setup, graph: CallGraph, imports) -> None:
        self.setup = setup
        self.graph = graph
        self.imports = imports
        # `scaler.step(opt)` makes `opt` an optimizer whatever its name
        self.stepped = {
            code(positional(c.call)[0])
            for c in graph.calls
            if c.method == "step" and positional(c.call) and "scal" in (c.receiver or "")
        }

    def engine_for(self, text: str | None, scope: Scope | None = None) -> Engine | None:
        """The engine an expression holds (a known one, or one recognised by name/annotation)."""
        if not text:
            return None
        if text in self.setup.engines:
            return self.setup.engines[text]
        if scope is not None and text in scope.params:
            annotation = scope.params[text].annotation
            qual = self.imports.qualify(annotation.annotation) if annotation else None
            if last_part(qual) in ENGINE_CLASSES:
                return Engine(text, ENGINE_CLASSES[last_part(qual)], scope.params[text])
            for arg in bound_arguments(scope, text, self.graph.calls):
                if dotted(arg) in self.setup.engines:
                    return self.setup.engines[dotted(arg)]
        if _ENGINE_NAME.match(last_part(text)):
            sole = self._sole_engine() if "." in text else None
            if sole is not None:  # `self.accelerator` holding the one the module builds
                return sole
            kind = (
                EngineKind.ACCELERATE
                if "accel" in text
                else EngineKind.FABRIC
                if "fabric" in text
                else EngineKind.UNKNOWN
            )
            return Engine(text, kind, None)
        return None

    def _sole_engine(self) -> Engine | None:
        """The module's one Accelerator/guard engine, when it constructs exactly one: a trainer
        keeps it in an attribute, whose precision and K are then that construction's."""
        built = {id(e.node): e for e in self.setup.engines.values() if e.node is not None}
        engines = [e for e in built.values() if e.kind in (EngineKind.ACCELERATE, EngineKind.GUARD)]
        return engines[0] if len(built) == 1 and engines else None

    def scaler_role(self, text: str | None, scope: Scope | None = None) -> ScalerRole | None:
        """ "enabled" / "disabled" for an expression holding a GradScaler, else None."""
        if not text:
            return None
        known = self.setup.scalers.get(text)
        if known is not None:
            return ScalerRole.DISABLED if known.enabled is False else ScalerRole.ENABLED
        if scope is not None and text in scope.params:
            bound = [dotted(a) for a in bound_arguments(scope, text, self.graph.calls)]
            roles = {self.scaler_role(b) for b in bound if b}
            if roles == {ScalerRole.DISABLED}:
                return ScalerRole.DISABLED
            if ScalerRole.ENABLED in roles:
                return ScalerRole.ENABLED
        if "scaler" in last_part(text).lower():
            same = [s for s in self.setup.scalers.values() if last_part(s.name) == last_part(text)]
            if same and all(s.enabled is False for s in same):
                return ScalerRole.DISABLED
            return ScalerRole.ENABLED
        return None

    def is_optimizer(self, text: str | None) -> bool:
        if not text:
            return False
        if text in self.setup.optimizers or text in self.stepped:
            return True
        return bool(_OPTIMIZER_NAME.search(last_part(text).lower()))

    def is_scheduler(self, text: str | None) -> bool:
        if not text:
            return False
        return text in self.setup.schedulers or bool(_SCHEDULER_NAME.search(last_part(text)))

    def engine_k(self, engine_text: str | None = None):
        """The accumulation value given to an engine (the first configured one by default)."""
        engines = [e for e in self.setup.engines.values() if e.accum is not None]
        if engine_text is not None:
            engines = [e for e in engines if e.name == engine_text] or engines
        return engines[0].accum if engines else None

    def engine_in_scope(self, scope: Scope) -> str | None:
        """An expression for the engine usable at this point of `scope`, for autofixes."""
        texts = [
            t
            for t, e in self.setup.engines.items()
            if e.kind in (EngineKind.ACCELERATE, EngineKind.GUARD)
        ]
        for text in texts:
            if text in scope.defs:
                return text
        for name in scope.params:
            engine = self.engine_for(name, scope)
            if engine is not None and engine.kind != EngineKind.DEEPSPEED:
                return name
        if scope.class_name is not None:
            for text in texts:
                if text.startswith("self.") and self._assigned_in_class(text, scope.class_name):
                    return text
        module_scope = self.graph.scopes[0]
        for text in texts:
            defs = self.graph.module_defs(text)
            if "." not in text and any(d.stmt.scope is module_scope for d in defs):
                return text
        return None

    def _assigned_in_class(self, text: str, class_name: str) -> bool:
        return any(d.stmt.scope.class_name == class_name for d in self.graph.module_defs(text))
