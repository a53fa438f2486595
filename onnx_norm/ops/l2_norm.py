"""L2Norm: each row of X divided by its Euclidean norm clamped below by epsilon, then times Scale:
`y = x * scale / max(||x||_2, epsilon)` over the dims from `axis` on (semantics: docs/ops.md). F.normalize,
ScaleNorm, x-transformers' RMSNorm (a constant factor such as sqrt(d) is folded into Scale by the rewrite) and ONNX's
LpNormalization with p = 2 (whose epsilon is 0). Its record, numpy reference, function body and the ONNX op it maps
to and from."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_norm.ops.body import Body
from onnx_norm.ops.numerics import output, round_to
from onnx_norm.ops.signature import NativeOp, NormAttributes, OpSignature

__all__ = ["L2_NORM", "LP_NORMALIZATION", "l2_norm", "l2_normalized"]


def _axes(rank: int, axis: int) -> tuple[int, ...]:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return tuple(range(axis % rank, rank))


def l2_normalized(x: np.ndarray, scale: np.ndarray | None, attrs: NormAttributes) -> tuple[np.ndarray, np.ndarray]:
    """(y in float64 before the output cast, 1 / max(||x||, eps) keepdims): the norm in float64, epsilon as the
    float32 the kernels read, the normalised value rounded to normalized_type, the product with Scale to
    multiply_type. A zero row with epsilon 0 gives 0 * inf = NaN, as `x / x.norm()` does."""
    axes = _axes(x.ndim, attrs.axis)
    xf = x.astype(np.float64)
    norm = np.sqrt(np.sum(xf * xf, axis=axes, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / np.maximum(norm, np.float64(np.float32(attrs.epsilon)))
        y = round_to(xf * inv, attrs.normalized_type)
    if scale is not None:
        y = round_to(y * scale.astype(np.float64), attrs.multiply_type)
    return y, inv


def l2_norm(x: np.ndarray, scale: np.ndarray | None = None, **attrs: float) -> tuple[np.ndarray]:
    """L2Norm -> (Y,)."""
    a = NormAttributes(**attrs)  # type: ignore[arg-type]
    y, _ = l2_normalized(x, scale, a)
    return (output(y, x, a),)


def _reduce_sum(body: Body, v: ir.Value, axes: list[int]) -> ir.Value:
    if body.sig.opset >= 13:
        return body.op("ReduceSum", [v, body.i64(*axes)], {"keepdims": 1})
    return body.op("ReduceSum", [v], {"axes": axes, "keepdims": 1})


def _body(body: Body, formal: dict[str, ir.Value], results: dict[str, ir.Value], n_out: int) -> None:
    """Y = round_m(round_n(x * 1 / max(sqrt(sum(x^2)), eps)) * Scale), in float32, over the last -axis dims (a
    non-negative axis needs X's rank, which the node signature carries)."""
    sig = body.sig
    a = sig.attrs
    axis = a.axis
    if axis >= 0:
        if sig.rank is None:
            raise ValueError("L2Norm's function body needs a negative axis or X's rank")
        axis -= sig.rank
    x = body.input(formal, results)
    norm = body.op("Sqrt", [_reduce_sum(body, body.op("Mul", [x, x]), list(range(axis, 0)))])
    eps = body.const(np.array(a.epsilon, np.float32))
    inv = body.op("Reciprocal", [body.op("Max", [norm, eps])])
    results["Y"] = body.output(body.affine(formal, body.op("Mul", [x, inv])))


def _scale_shapes(x_shape: tuple[int, ...], attrs: NormAttributes) -> dict[str, tuple[int, ...]]:
    return {"Scale": x_shape[attrs.axis :]}


#: ONNX's LpNormalization (opset 1): `x / ||x||_p` along one axis, no epsilon; with p = 2 and one normalised axis it
#: is L2Norm with epsilon 0 and no Scale. The `onnx` target writes it where the match has no epsilon; the take-over
#: reads it through the family's own reader (rewrite/families/l2_norm.py).
LP_NORMALIZATION = NativeOp("LpNormalization", "", 1, targets=("onnx",), takes_bias=False, axis_attrs=False)

L2_NORM = OpSignature(
    "L2Norm",
    ("X", "Scale"),
    frozenset({"Scale"}),
    ("Y",),
    rms=True,  # no mean and no Bias: the kernels' shared input checks read Scale only
    skip=False,
    kind="l2",
    reference=l2_norm,
    body=_body,
    natives=(LP_NORMALIZATION,),
    input_shapes=_scale_shapes,
    example=NormAttributes(axis=-2, epsilon=1e-12),
)
