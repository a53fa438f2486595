"""What one run of FuseNormsPass knows and collects, in one object made afresh by each call and handed to each of its
steps (the *_pass.py modules): the session (records, near-misses, proofs), the rules, the shapes the model recorded,
the count of fused norms and the take-over's records. A pass object reused on a second model (as pipelines reuse
them) starts from nothing: no step keeps state of its own between runs."""

from __future__ import annotations

import dataclasses
from typing import Any

import onnx_ir as ir

from onnx_norm.rewrite.family import FusionRule
from onnx_norm.rewrite.session import Session

#: Recorded shapes and types of intermediate values, by name (shape_pass.py reads and writes them).
Shapes = dict[str, tuple[ir.Shape | None, ir.TypeProtocol | None]]


@dataclasses.dataclass
class RunState:
    """One run's state; `FuseNormsPass.call` makes it, the steps fill it, the report is read from it."""

    session: Session
    rules: list[FusionRule] = dataclasses.field(default_factory=list)
    #: The shapes the model recorded before ONNX Runtime's symbolic inference changed them (InferShapesPass).
    stored_shapes: Shapes = dataclasses.field(default_factory=dict)
    #: Norms fused by FuseDecomposedPass.
    fused: int = 0
    #: One record per native norm node (converted or why not), by TakeOverNativePass.
    taken_over: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def target(self) -> str:
        return self.session.target

    @property
    def converted(self) -> bool:
        return any(record.get("converted") for record in self.taken_over)

    @property
    def modified(self) -> bool:
        """Whether the run changed what the model computes (a norm fused or taken over)."""
        return bool(self.fused) or self.converted

    @classmethod
    def for_target(cls, target: str = "onnx-norm") -> RunState:
        """The state of a step run alone (tests, a pipeline that runs one step)."""
        return cls(Session(target))
