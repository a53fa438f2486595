"""The parity gate's report: every output and every fused norm compared, and the verdict."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnx_norm.inputs import notes_line
from onnx_norm.parity.verdict import Comparison
from onnx_norm.paths import json_safe, write_json_atomic

if TYPE_CHECKING:
    from onnx_norm.parity.numerics import NarrowNumerics


@dataclasses.dataclass
class NormComparison:
    """One fused norm: its output against the value it replaced, and whether its inputs still agreed."""

    node: str
    op_type: str
    rule: str
    original_value: str | None
    optimized_value: str
    output: Comparison | None
    inputs_match: bool | None
    status: str  # "ok", "diverges", "input differs", "unmapped"
    #: The original subgraph in its own (narrow) types on the first sample: overflows, underflows, a zero epsilon,
    #: and its error beside the fused op's (parity/numerics.py); None when it could not be evaluated.
    numerics: NarrowNumerics | None = None


@dataclasses.dataclass
class ParityReport:
    passed: bool
    outputs: list[Comparison]
    norms: list[NormComparison]
    samples: int
    shapes: dict[str, list[int]]
    provider: str
    original_optimization: str
    golden: str  # how the golden result was computed: "ort", "reference" or "none"
    seed: int
    elapsed_s: float
    warnings: list[str] = dataclasses.field(default_factory=list)
    #: Which form of the float64 evaluation ran (onnx_norm.parity.golden.FORM_*), "" without one.
    golden_form: str = ""
    #: Whether the sessions kept half-precision weights in their type and cast them to fp32 where used, with ONNX
    #: Runtime's fp16-initializer fusion off (`RuntimeConfig.half_weights_at_run`), and that policy in words ("" when
    #: the sessions ran with ONNX Runtime's defaults). The values are the folded copies' bar pre-packing's sum order.
    half_weights_at_run: bool = False
    weights_policy: str = ""
    #: How the models ran: "whole model", or "N segments (the largest reads W MiB of weights)".
    form: str = "whole model"
    #: With segments: per cut, the values carried across it, whether the two models agreed there, the largest
    #: difference (onnx_norm/parity/segmented.py).
    cuts: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def first_parting_segment(self) -> int | None:
        """The first segment (from 1) after which the two models' carried values differ, None when none."""
        return next((index + 1 for index, cut in enumerate(self.cuts) if not cut.get("passed")), None)

    #: The inputs whose values choose the model's path, {name: {"value", "why"}} (`onnx_norm.inputs.input_notes`):
    #: those given (`--input`), and one-element inputs whose generated value the graph chose or chance drew.
    input_values: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def inputs_line(self) -> str:
        """`inputs: sr=16000 (compared with 8000, 16000 in the graph)`, or "" when no input is worth naming."""
        return notes_line(self.input_values)

    @property
    def repaired_overflows(self) -> int:
        """Fused norms whose original overflowed to inf/NaN in its own (fp16/bf16) types on the first sample while
        the fused op, which keeps its statistics in float32, gave finite values (parity/numerics.py)."""
        return sum(1 for norm in self.norms if norm.numerics is not None and norm.numerics.repaired)

    @property
    def repaired_line(self) -> str:
        """`repaired N norms that overflowed in the original`, or "" when none did."""
        n = self.repaired_overflows
        return f"repaired {n} norm{'s' if n != 1 else ''} that overflowed in the original" if n else ""

    @property
    def first_divergent_norm(self) -> NormComparison | None:
        for norm in self.norms:
            if norm.status == "diverges":
                return norm
        return next((norm for norm in self.norms if norm.status == "input differs"), None)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["status"] = "PASSED" if self.passed else "FAILED"
        first = self.first_divergent_norm
        data["first_divergent_norm"] = None if first is None else first.node
        data["first_parting_segment"] = self.first_parting_segment
        data["repaired_overflows"] = self.repaired_overflows
        data["repaired"] = self.repaired_line
        for item, output in zip(data["outputs"], self.outputs, strict=True):
            item["message"] = output.message
        return json_safe(data)

    def write_json(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())
