"""GatedRMSNorm: the RMSNorm of Mamba2-style state-space blocks, with a SiLU gate `Z` applied before the statistic
(`rmsnorm(x * silu(z)) * w`: Mamba2's MambaRMSNormGated, NemotronH, Falcon-H1 with norm_before_gate=False) or after
the norm (`rmsnorm(x) * w * silu(z)`: Qwen3-Next, Falcon-H1's default), over the whole last dim or over groups of
`group_size` elements of it. Its record, attributes, numpy reference and function body (docs/ops.md).

The gate is computed in float32 from Z whatever X's type (the modules cast it: `silu(gate.to(float32))`); the norm
rounds where the shared attributes say (normalized_type after the normalisation, multiply_type after the Scale
multiply); the gate after the norm multiplies in float32 and Y is rounded once, to its type."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from onnx_norm.ops.body import FLOAT, Body
from onnx_norm.ops.numerics import output, round_to
from onnx_norm.ops.signature import FixedAxisAttributes, NormAttributes, OpSignature

__all__ = ["GATED_RMS_NORM", "GatedNormAttributes", "gated_rms", "gated_rms_norm", "silu"]


@dataclasses.dataclass(frozen=True)
class GatedNormAttributes(FixedAxisAttributes):
    """GatedRMSNorm's attributes: the shared ones but `axis` (the op normalises the last dim, in groups; the rewrite
    keeps axis -1), the group size (0: the whole last dim is one group) and where the gate applies (0: to the
    input, before the statistic; 1: to the normalised and scaled output)."""

    group_size: int = 0
    norm_before_gate: int = 0


def silu(z: np.ndarray) -> np.ndarray:
    """z * sigmoid(z) in float64."""
    zf = z.astype(np.float64)
    with np.errstate(over="ignore"):
        return zf / (1.0 + np.exp(-zf))


def gated_rms(
    x: np.ndarray, z: np.ndarray, scale: np.ndarray | None, attrs: GatedNormAttributes
) -> tuple[np.ndarray, np.ndarray]:
    """(y in float64 before the output cast, the inverse RMS of each group, shape [..., G, 1]).

    X and Z have one shape [..., D]; Scale has D elements (or is None); group_size divides D (0: D)."""
    if z.shape != x.shape:
        raise ValueError(f"Z must have X's shape: {list(z.shape)} vs {list(x.shape)}")
    if x.ndim < 1:
        raise ValueError("GatedRMSNorm needs X of rank >= 1")
    d = x.shape[-1]
    size = attrs.group_size or d
    if size < 1 or d % size:
        raise ValueError(f"group_size {attrs.group_size} does not divide the last dim {d}")
    if attrs.norm_before_gate not in (0, 1):
        raise ValueError(f"norm_before_gate must be 0 or 1, got {attrs.norm_before_gate}")
    gate = silu(z)
    v = x.astype(np.float64) if attrs.norm_before_gate else x.astype(np.float64) * gate
    groups = v.reshape(*x.shape[:-1], d // size, size)
    var = np.mean(groups * groups, axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / np.sqrt(var + np.float64(np.float32(attrs.epsilon)))
        y = round_to((groups * inv).reshape(x.shape), attrs.normalized_type)
    if scale is not None:
        y = round_to(y * scale.astype(np.float64).reshape(d), attrs.multiply_type)
    if attrs.norm_before_gate:
        y = y * gate
    return y, inv


def gated_rms_norm(x: np.ndarray, z: np.ndarray, scale: np.ndarray | None = None, **attrs: float) -> tuple[np.ndarray]:
    """GatedRMSNorm -> (Y,)."""
    a = GatedNormAttributes(**attrs)  # type: ignore[arg-type]
    y, _ = gated_rms(x, z, scale, a)
    return (output(y, x, a),)


def _gate(body: Body, formal: dict[str, ir.Value]) -> ir.Value:
    """silu(Z) = Z * Sigmoid(Z) in float32, written once for the stage and the epilogue."""

    def make() -> ir.Value:
        z = body.cast(formal["Z"], FLOAT)
        return body.op("Mul", [z, body.op("Sigmoid", [z])])

    return body.shared("gate", make)


def _gate_stage(body: Body, formal: dict[str, ir.Value], results: dict[str, ir.Value], xf: ir.Value) -> ir.Value:
    """The input stage: X * silu(Z) when the gate comes before the norm, X otherwise."""
    a = body.sig.attrs
    assert isinstance(a, GatedNormAttributes)
    return xf if a.norm_before_gate else body.op("Mul", [xf, _gate(body, formal)])


def _body(body: Body, formal: dict[str, ir.Value], results: dict[str, ir.Value], n_out: int) -> None:
    """Y: the input stage's row as [..., G, group_size] (its own shape when group_size is 0) normalised over its
    last dim, back to X's shape, rounded, scaled, gated after when the gate comes after; no rank needed."""
    a = body.sig.attrs
    assert isinstance(a, GatedNormAttributes)
    v = body.input(formal, results)
    x_shape = body.op("Shape", [formal["X"]])
    if a.group_size:
        leading = body.slice(x_shape, [0], [-1])
        # The group count as D / size, not -1: Reshape cannot infer a -1 of an empty X (a batch of 0 rows).
        groups = body.op("Div", [body.slice(x_shape, [-1], [2**62]), body.i64(a.group_size)])
        v = body.op("Reshape", [v, body.op("Concat", [leading, groups, body.i64(a.group_size)], {"axis": 0})])
    _, _, inv = body.statistics(v, [-1], rms=True)
    y = body.op("Mul", [v, inv])
    if a.group_size:
        y = body.op("Reshape", [y, x_shape])
    y = body.affine(formal, y)
    if a.norm_before_gate:
        y = body.op("Mul", [y, _gate(body, formal)])
    results["Y"] = body.output(y)


def _shapes(x_shape: tuple[int, ...], attrs: NormAttributes) -> dict[str, tuple[int, ...]]:
    return {"Z": x_shape, "Scale": x_shape[-1:]}


GATED_RMS_NORM = OpSignature(
    "GatedRMSNorm",
    ("X", "Z", "Scale"),
    frozenset({"Scale"}),
    ("Y",),
    rms=True,
    skip=False,
    attributes=GatedNormAttributes,
    kind="gated_rms",
    reference=gated_rms_norm,
    body=_body,
    input_stage=_gate_stage,
    input_shapes=_shapes,
    example=GatedNormAttributes(group_size=5, norm_before_gate=1),  # X (2, 4, 3, 5): one group of 5
)
