"""The training-loop model (see `linter/model/model.py` for the facade and its topic modules)."""

from __future__ import annotations

from linter.model.dataflow import Flow
from linter.model.functions import Scope, Stmt
from linter.model.loops import Gate, Region, Site, TrainingLoop
from linter.model.model import Model

__all__ = ["Model", "Site", "TrainingLoop", "Gate", "Region", "Flow", "Stmt", "Scope"]
