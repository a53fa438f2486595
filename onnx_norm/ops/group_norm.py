"""GroupNorm over NCHW (any rank >= 3): the channels (dim 1) split into num_groups groups, each group of a sample
normalised over its channels and every dim after them, then Scale and Bias per channel, then the activation (none
or SiLU). Its record, attributes, numpy reference, function body and the ONNX op it maps to (docs/ops.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from onnx_norm.ops.body import FLOAT, Body
from onnx_norm.ops.numerics import output, round_to
from onnx_norm.ops.signature import FixedAxisAttributes, NativeOp, NormAttributes, OpSignature

__all__ = ["ACTIVATIONS", "GROUP_NORM", "GROUP_NORMALIZATION", "GroupNormAttributes", "group_norm", "grouped"]


#: GroupNorm's `activation` attribute: what follows the affine, fused into the op.
ACTIVATIONS: dict[str, int] = {"none": 0, "silu": 1}


@dataclasses.dataclass(frozen=True)
class GroupNormAttributes(FixedAxisAttributes):
    """GroupNorm's attributes: the shared ones (its groups are fixed by the op, so `axis` is not an attribute of
    the op; the rewrite keeps it as -(rank - 1), the dims a group spans), plus the number of groups the channels
    (dim 1) are split into and the activation applied after the affine (ACTIVATIONS)."""

    num_groups: int = 1
    activation: int = 0


def grouped(
    x: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None, attrs: GroupNormAttributes
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GroupNorm in float64 before the output cast: (y, inverse std, mean), the statistics of shape [N, G, 1].

    X is [N, C, ...]; its channels split into `num_groups` groups of C / G channels, each group of a sample
    normalised over its channels and every dim after them; Scale and Bias are per channel ([C], or any shape of
    C elements); then the activation. Rounding points as the other ops', the activation's steps at multiply_type."""
    if x.ndim < 3:
        raise ValueError(f"GroupNorm needs X of rank >= 3 ([N, C, ...]), got rank {x.ndim}")
    n, c = x.shape[:2]
    g = attrs.num_groups
    if g < 1 or c % g:
        raise ValueError(f"num_groups {g} does not divide the {c} channels")
    rows = x.astype(np.float64).reshape(n, g, -1)
    mean = rows.mean(axis=2, keepdims=True)
    centred = rows - mean
    var = np.mean(centred * centred, axis=2, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / np.sqrt(var + np.float64(np.float32(attrs.epsilon)))
        y = round_to(centred * inv, attrs.normalized_type).reshape(n, c, -1)
    m = attrs.multiply_type
    if scale is not None:
        y = round_to(y * scale.astype(np.float64).reshape(c, 1), m)
    if bias is not None:
        y = round_to(y + bias.astype(np.float64).reshape(c, 1), m)
    if attrs.activation == ACTIVATIONS["silu"]:
        with np.errstate(over="ignore"):
            y = round_to(y * round_to(1.0 / (1.0 + np.exp(-y)), m), m)
    elif attrs.activation != ACTIVATIONS["none"]:
        raise ValueError(f"unknown activation {attrs.activation}; expected one of {ACTIVATIONS}")
    return y.reshape(x.shape), inv, mean


def group_norm(
    x: np.ndarray, scale: np.ndarray | None = None, bias: np.ndarray | None = None, **attrs: float
) -> tuple[np.ndarray]:
    """GroupNorm -> (Y,)."""
    a = GroupNormAttributes(**attrs)  # type: ignore[arg-type]
    y, _, _ = grouped(x, scale, bias, a)
    return (output(y, x, a),)


def _body(body: Body, formal: dict[str, ir.Value], results: dict[str, ir.Value], n_out: int) -> None:
    """GroupNorm's Y: X as [N, G, -1] normalised over its last dim, then as [N, C, -1] for the per-channel affine
    (Scale and Bias as [C, 1]) and the activation, then X's shape again; no rank needed."""
    sig = body.sig
    a = sig.attrs
    assert isinstance(a, GroupNormAttributes)
    num_groups = a.num_groups
    x = formal["X"]
    groups = body.op("Reshape", [body.to_float(x, sig.x_type), body.i64(0, num_groups, -1)])
    centred, _, inv = body.statistics(groups, [2], rms=False)
    y = body.round_to(body.op("Mul", [centred, inv]), a.normalized_type)
    x_shape = body.op("Shape", [x])
    channels = body.op("Concat", [body.i64(0), body.slice(x_shape, [1], [2]), body.i64(-1)], {"axis": 0})
    y = body.op("Reshape", [y, channels])
    m = a.multiply_type
    for name, op_type in (("Scale", "Mul"), ("Bias", "Add")):
        if name in formal:
            column = body.op("Reshape", [body.cast(formal[name], FLOAT), body.i64(-1, 1)])
            y = body.round_to(body.op(op_type, [y, column]), m)
    if a.activation == ACTIVATIONS["silu"]:
        y = body.round_to(body.op("Mul", [y, body.round_to(body.op("Sigmoid", [y]), m)]), m)
    y = body.op("Reshape", [y, x_shape])
    results["Y"] = body.output(y)


def _channel_shapes(x_shape: tuple[int, ...], attrs: NormAttributes) -> dict[str, tuple[int, ...]]:
    return {"Scale": (x_shape[1],), "Bias": (x_shape[1],)}


#: ONNX's GroupNormalization from opset 21 (per-channel scale and bias), taken over by the family's own reader
#: (rewrite/families/group_norm.py). No target writes it: `onnx` writes torch's InstanceNormalization form, which
#: ONNX Runtime runs faster (docs/targets.md), and which needs no opset 21.
GROUP_NORMALIZATION = NativeOp("GroupNormalization", "", 21, targets=())

GROUP_NORM = OpSignature(
    "GroupNorm",
    ("X", "Scale", "Bias"),
    frozenset({"Scale", "Bias"}),
    ("Y",),
    rms=False,
    skip=False,
    attributes=GroupNormAttributes,
    kind="group",
    reference=group_norm,
    body=_body,
    natives=(GROUP_NORMALIZATION,),
    input_shapes=_channel_shapes,
    example=GroupNormAttributes(axis=-3, num_groups=2, activation=ACTIVATIONS["silu"]),
)
