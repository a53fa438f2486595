"""What a matched norm is, independent of the pattern that found it and of the op that will replace it.

The matchers (one file per rule family) produce `NormSpec`s; `targets.py` turns a spec into nodes for one
target (our custom ops, standard ONNX ops, or ONNX Runtime's contrib ops).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import onnx_ir as ir

from onnx_norm.ops.schema import NormAttributes

Kind = Literal["layer", "rms"]
Target = Literal["onnx-norm", "onnx", "ort"]
TARGETS: tuple[Target, ...] = ("onnx-norm", "onnx", "ort")


@dataclasses.dataclass
class NormSpec:
    """One norm to fuse, with the values it reads and the values it replaces."""

    kind: Kind
    x: ir.Value  # normalised input; the first addend of the residual Add when `skip` is set
    skip: ir.Value | None  # second addend of a residual Add folded into the op
    scale: ir.Value | None
    bias: ir.Value | None
    attrs: NormAttributes  # axis is negative: -(number of normalised trailing dims)
    y: ir.Value  # the value the fused op's Y replaces
    sum: ir.Value | None = None  # the residual sum, when it has other consumers and must stay available
    mean: ir.Value | None = None  # statistics that the graph exposes (LayerNormalization's function expansion)
    inv_std: ir.Value | None = None
    rule: str = ""  # name of the rule that matched, recorded on the new node

    @property
    def x_type(self) -> int:
        dtype = self.x.dtype
        return 0 if dtype is None else int(dtype)
