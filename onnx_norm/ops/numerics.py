"""The float64 building blocks of the ops' numpy references: element types, rounding points and the row statistics
(semantics: docs/ops.md). Each op module's reference is written with them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper

from onnx_norm.ops.signature import NormAttributes, NormOpAttributes

__all__ = ["check_row_groups", "elem_type", "inverse_root", "normalize", "normalized", "np_dtype", "output", "round_to"]

_BF16 = np.dtype(ml_dtypes.bfloat16)


def np_dtype(elem_type: int) -> np.dtype:
    """numpy dtype of an ONNX element type (bfloat16 through ml_dtypes)."""
    if elem_type == TensorProto.BFLOAT16:
        return _BF16
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def elem_type(dtype: np.dtype) -> int:
    """ONNX element type of a numpy dtype (bfloat16 through ml_dtypes)."""
    if np.dtype(dtype) == _BF16:
        return TensorProto.BFLOAT16
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def round_to(values: np.ndarray, to: int) -> np.ndarray:
    if to == 0:
        return values
    # Narrow through float32 first: numpy rounds float64 -> float16 directly, but the kernels (and the
    # graphs we replace) hold float32 intermediates, and double rounding through float32 is innocuous.
    return values.astype(np.float32).astype(np_dtype(to)).astype(np.float64)


def _normalized_axes(x: np.ndarray, axis: int) -> tuple[int, ...]:
    rank = x.ndim
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return tuple(range(axis % rank, rank))


def check_row_groups(x: np.ndarray, param: np.ndarray | None, axis: int, name: str) -> None:
    """A Scale or Bias with more dims than the normalised ones (leading 1s dropped) is one row per row group
    (docs/ops.md): its last dims must be the normalised dims and the ones before them X's dims just before the
    normalised axes, so that row r of X reads row r mod prod(groups) of it. ValueError otherwise."""
    if param is None:
        return
    k = len(_normalized_axes(x, axis))
    shape = list(param.shape)
    while len(shape) > k and shape[0] == 1:
        shape.pop(0)
    if len(shape) <= k:
        return
    groups = len(shape) - k
    first = x.ndim - k
    if groups > first or tuple(shape) != x.shape[first - groups :]:
        raise ValueError(
            f"{name} of shape {list(param.shape)} has row-group dims but is not X's dims "
            f"{list(x.shape[max(first - groups, 0) :])} (X {list(x.shape)}, axis {axis})"
        )


def normalized(
    x: np.ndarray,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    attrs: NormAttributes,
    *,
    rms: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(y in float64 before the output cast, inverse std or RMS, mean or None); statistics keepdims, float64."""
    axes = _normalized_axes(x, attrs.axis)
    check_row_groups(x, scale, attrs.axis, "Scale")
    check_row_groups(x, bias, attrs.axis, "Bias")
    xf = x.astype(np.float64)
    if rms:
        mean = None
        centred = xf
    else:
        mean = xf.mean(axis=axes, keepdims=True)
        centred = xf - mean
    var = np.mean(centred * centred, axis=axes, keepdims=True)
    inv = inverse_root(var, attrs)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = round_to(centred * inv, attrs.normalized_type)
    if scale is not None:
        y = round_to(y * scale.astype(np.float64), attrs.multiply_type)
    if bias is not None:
        y = round_to(y + bias.astype(np.float64), attrs.multiply_type)
    return y, inv, mean


def inverse_root(var: np.ndarray, attrs: NormAttributes) -> np.ndarray:
    """1 / sqrt(var + eps), or 1 / (sqrt(var) + eps) for an op with `epsilon_outside` set (the Annotated
    Transformer's `(x - mean) / (std + eps)`)."""
    eps = np.float64(np.float32(attrs.epsilon))
    # A constant row with epsilon 0 gives 0 * inf = NaN, as the graphs with epsilon 0 do (ONNX Runtime's fusion cases).
    with np.errstate(divide="ignore", invalid="ignore"):
        if isinstance(attrs, NormOpAttributes) and attrs.epsilon_outside:
            return 1.0 / (np.sqrt(var) + eps)
        return 1.0 / np.sqrt(var + eps)


def output(y: np.ndarray, x: np.ndarray, attrs: NormAttributes) -> np.ndarray:
    out_dtype = np_dtype(attrs.output_type) if attrs.output_type else x.dtype
    return y.astype(np.float32).astype(out_dtype)


def normalize(
    x: np.ndarray,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    attrs: NormAttributes,
    *,
    rms: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Returns (Y, inverse std or inverse RMS, mean or None); statistics float32, keepdims."""
    y, inv, mean = normalized(x, scale, bias, attrs, rms=rms)
    return output(y, x, attrs), inv.astype(np.float32), None if mean is None else mean.astype(np.float32)
