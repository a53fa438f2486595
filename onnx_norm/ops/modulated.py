"""The modulated (adaLN) norms, ModulatedLayerNorm and ModulatedRMSNorm: a LayerNorm/RMSNorm, then per sample
`* (1 + ModScale) + ModShift`, without statistics outputs. Their records, numpy references and function bodies
(the norms' body with the modulation as its epilogue; semantics: docs/ops.md)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_norm.ops.body import FLOAT, INT64_MAX, Body
from onnx_norm.ops.norms import make_body
from onnx_norm.ops.numerics import normalized, output, round_to
from onnx_norm.ops.signature import NormAttributes, OpSignature

__all__ = [
    "MODULATED_LAYER_NORM",
    "MODULATED_OPS",
    "MODULATED_RMS_NORM",
    "modulated_layer_norm",
    "modulated_norm",
    "modulated_rms_norm",
    "modulation_shape",
]


def modulation_shape(mod_shape: tuple[int, ...], x_shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """The shape ModScale/ModShift take to broadcast against X (docs/ops.md): [B or 1, 1, ..., 1, *normalised dims].

    Accepted: [B, *normalised dims], or that with the dims between the batch and `axis` present as 1s; B is X's
    first dim or 1. Raises ValueError naming the mismatch otherwise."""
    rank = len(x_shape)
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    first = axis % rank
    if first == 0:
        raise ValueError("a modulated norm needs a batch dim before the normalised dims (axis >= 1)")
    normalized = tuple(x_shape[first:])
    mod = tuple(mod_shape)
    middle = mod[1 : len(mod) - len(normalized)]
    ok = (
        len(mod) in (1 + len(normalized), rank)
        and mod[0] in (1, x_shape[0])
        and all(d == 1 for d in middle)
        and mod[len(mod) - len(normalized) :] == normalized
    )
    if not ok:
        raise ValueError(
            f"modulation of shape {list(mod)} does not fit X of shape {list(x_shape)} with axis {axis}: it must be "
            f"[{x_shape[0]} or 1, {', '.join(map(str, normalized))}], optionally with 1s for the dims in between"
        )
    return (mod[0], *([1] * (first - 1)), *normalized)


def modulated_norm(
    x: np.ndarray,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    mod_scale: np.ndarray,
    mod_shift: np.ndarray,
    attrs: NormAttributes,
    *,
    rms: bool,
) -> np.ndarray:
    """Y of ModulatedLayerNorm / ModulatedRMSNorm: the norm (with its own Scale/Bias and rounding points), then
    y = round_m(y * round_m(1 + ModScale)), y = round_m(y + ModShift), per sample, broadcast over the rows."""
    y, _, _ = normalized(x, scale, bias, attrs, rms=rms)
    m = attrs.multiply_type
    s = mod_scale.astype(np.float64).reshape(modulation_shape(mod_scale.shape, x.shape, attrs.axis))
    t = mod_shift.astype(np.float64).reshape(modulation_shape(mod_shift.shape, x.shape, attrs.axis))
    y = round_to(y * round_to(1.0 + s, m), m)
    y = round_to(y + t, m)
    return output(y, x, attrs)


def modulated_layer_norm(
    x: np.ndarray,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    mod_scale: np.ndarray,
    mod_shift: np.ndarray,
    **attrs: float,
) -> tuple[np.ndarray]:
    """ModulatedLayerNorm -> (Y,)."""
    return (modulated_norm(x, scale, bias, mod_scale, mod_shift, NormAttributes(**attrs), rms=False),)


def modulated_rms_norm(
    x: np.ndarray, scale: np.ndarray | None, mod_scale: np.ndarray, mod_shift: np.ndarray, **attrs: float
) -> tuple[np.ndarray]:
    """ModulatedRMSNorm -> (Y,)."""
    return (modulated_norm(x, scale, None, mod_scale, mod_shift, NormAttributes(**attrs), rms=True),)


def _modulate(body: Body, y: ir.Value, x: ir.Value, mod_scale: ir.Value, mod_shift: ir.Value) -> ir.Value:
    """y * round_m(1 + ModScale) + ModShift, each step rounded to multiply_type, with ModScale/ModShift reshaped to
    [B or 1, 1, ..., 1, *normalised dims] (their first dim, 1 for X's dims up to `axis`, X's normalised dims):
    that covers both accepted shapes whatever X's rank, with reductions of nothing but Shape and Slice."""
    a = body.sig.attrs
    x_shape = body.op("Shape", [x])
    middle = body.slice(x_shape, [1], [a.axis])
    ones = body.op("Add", [body.op("Mul", [middle, body.i64(0)]), body.i64(1)])
    normalized = body.slice(x_shape, [a.axis], [INT64_MAX])
    one = body.const(np.array(1.0, np.float32))
    m = a.multiply_type

    def broadcastable(v: ir.Value) -> ir.Value:
        batch = body.slice(body.op("Shape", [v]), [0], [1])
        shape = body.op("Concat", [batch, ones, normalized], {"axis": 0})
        return body.op("Reshape", [body.cast(v, FLOAT), shape])

    factor = body.round_to(body.op("Add", [broadcastable(mod_scale), one]), m)
    y = body.round_to(body.op("Mul", [y, factor]), m)
    return body.round_to(body.op("Add", [y, broadcastable(mod_shift)]), m)


def _modulation_shapes(x_shape: tuple[int, ...], attrs: NormAttributes) -> dict[str, tuple[int, ...]]:
    row = x_shape[attrs.axis :]
    return {"Scale": row, "Bias": row, "ModScale": (x_shape[0], *row), "ModShift": (x_shape[0], *row)}


_MODULATED_BODY = make_body(lambda body, formal, y, x: _modulate(body, y, x, formal["ModScale"], formal["ModShift"]))

MODULATED_LAYER_NORM = OpSignature(
    "ModulatedLayerNorm",
    ("X", "Scale", "Bias", "ModScale", "ModShift"),
    frozenset({"Scale", "Bias"}),
    ("Y",),
    rms=False,
    skip=False,
    kind="modulated_layer",
    reference=modulated_layer_norm,
    body=_MODULATED_BODY,
    input_shapes=_modulation_shapes,
)
MODULATED_RMS_NORM = OpSignature(
    "ModulatedRMSNorm",
    ("X", "Scale", "ModScale", "ModShift"),
    frozenset({"Scale"}),
    ("Y",),
    rms=True,
    skip=False,
    kind="modulated_rms",
    reference=modulated_rms_norm,
    body=_MODULATED_BODY,
    input_shapes=_modulation_shapes,
)
#: The modulated ops by name.
MODULATED_OPS: dict[str, OpSignature] = {op.name: op for op in (MODULATED_LAYER_NORM, MODULATED_RMS_NORM)}
