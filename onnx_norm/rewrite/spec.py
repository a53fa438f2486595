"""What a matched norm is, independent of the pattern that found it and of the op that will replace it.

The recognisers (the shared matcher in match.py and the family modules in families/) produce `NormSpec`s; a
target (targets.py) turns a spec into nodes through the lowering its family registers for it.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from onnx_norm.ops.schema import NormAttributes

#: The norm families' kinds ("layer", "rms", ...): the key of the family registry (family.py).
Kind = str


def elem_type(value: ir.Value | None) -> int:
    """The element type of `value` as a TensorProto number, 0 when absent or unknown."""
    return 0 if value is None or value.dtype is None else int(value.dtype)


def row_group_dims(value: ir.Value | None, normalised_rank: int) -> tuple[int, ...]:
    """The dims of a scale or bias before its last `normalised_rank` ones, leading 1s dropped: () for one row
    (it broadcasts over every row), (H,) for a per-head scale [H, D] normalised over D. The fused ops index such
    a scale per row group (docs/ops.md); the native ops cannot take one."""
    if value is None or value.shape is None:
        return ()
    dims = list(value.shape)[: max(len(value.shape) - normalised_rank, 0)]
    while dims and dims[0] == 1:
        dims.pop(0)
    return tuple(d if isinstance(d, int) else -1 for d in dims)


@dataclasses.dataclass
class Statistic:
    """A recognised statistic under the square root: whose it is, the tensor and the axes it is taken over."""

    kind: str  # the family's kind
    x: ir.Value
    axes: tuple[int, ...]  # counted from the end
    variant: str  # how it was spelled, for the report ("centred variance", "mean square", ...)
    correction: float = 1.0  # the statistic is the family's statistic times this (N/(N-1): an unbiased variance)
    centred: bool = False  # the normalised data is `x - mean(x)` rather than `x`


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
    #: Inputs a family adds to x/skip/scale/bias (a per-sample factor, say), by name; the proof feeds each
    #: random data of its shape and passes it to the family's reference under this name.
    extra_inputs: dict[str, ir.Value] = dataclasses.field(default_factory=dict)
    #: Where the graph itself rounds (the attributes that would reproduce it exactly), when `attrs` round less
    #: (casts.op_rounding); None when they are the same.
    graph_attrs: NormAttributes | None = None

    @property
    def row_groups(self) -> tuple[int, ...]:
        """The row-group dims of Scale and Bias (`row_group_dims`; the longer of the two), () for plain rows."""
        k = -self.attrs.axis if self.attrs.axis < 0 else 0
        return max((row_group_dims(v, k) for v in (self.scale, self.bias)), key=len, default=())

    @property
    def x_type(self) -> int:
        return elem_type(self.x)

    def replaced(self) -> list[ir.Value]:
        """The values the fused op's outputs replace, in the order an emitter returns them."""
        return [v for v in (self.y, self.sum, self.mean, self.inv_std) if v is not None]
