"""numpy reference of the fused norm ops, float64 statistics (semantics: docs/ops.md).

The kernels and the ONNX function bodies are tested against this module.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper

from onnx_norm.ops.schema import ACTIVATIONS, GroupNormAttributes, NormAttributes

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


def _round_to(values: np.ndarray, to: int) -> np.ndarray:
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


def _normalized(
    x: np.ndarray,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    attrs: NormAttributes,
    *,
    rms: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(y in float64 before the output cast, inverse std or RMS, mean or None); statistics keepdims, float64."""
    axes = _normalized_axes(x, attrs.axis)
    xf = x.astype(np.float64)
    if rms:
        mean = None
        centred = xf
    else:
        mean = xf.mean(axis=axes, keepdims=True)
        centred = xf - mean
    var = np.mean(centred * centred, axis=axes, keepdims=True)
    # A constant row with epsilon 0 gives 0 * inf = NaN, as the graphs with epsilon 0 do (ONNX Runtime's fusion cases).
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / np.sqrt(var + np.float64(np.float32(attrs.epsilon)))
        y = _round_to(centred * inv, attrs.normalized_type)
    if scale is not None:
        y = _round_to(y * scale.astype(np.float64), attrs.multiply_type)
    if bias is not None:
        y = _round_to(y + bias.astype(np.float64), attrs.multiply_type)
    return y, inv, mean


def _output(y: np.ndarray, x: np.ndarray, attrs: NormAttributes) -> np.ndarray:
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
    y, inv, mean = _normalized(x, scale, bias, attrs, rms=rms)
    return _output(y, x, attrs), inv.astype(np.float32), None if mean is None else mean.astype(np.float32)


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
    y, _, _ = _normalized(x, scale, bias, attrs, rms=rms)
    m = attrs.multiply_type
    s = mod_scale.astype(np.float64).reshape(modulation_shape(mod_scale.shape, x.shape, attrs.axis))
    t = mod_shift.astype(np.float64).reshape(modulation_shape(mod_shift.shape, x.shape, attrs.axis))
    y = _round_to(y * _round_to(1.0 + s, m), m)
    y = _round_to(y + t, m)
    return _output(y, x, attrs)


def layer_norm(
    x: np.ndarray, scale: np.ndarray | None = None, bias: np.ndarray | None = None, **attrs: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm -> (Y, Mean, InvStdDev)."""
    y, inv, mean = normalize(x, scale, bias, NormAttributes(**attrs), rms=False)
    assert mean is not None
    return y, mean, inv


def rms_norm(x: np.ndarray, scale: np.ndarray | None = None, **attrs: float) -> tuple[np.ndarray, np.ndarray]:
    """RMSNorm -> (Y, InvRMS)."""
    y, inv, _ = normalize(x, scale, None, NormAttributes(**attrs), rms=True)
    return y, inv


def _skip_norm(
    x: np.ndarray,
    skip: np.ndarray,
    params: tuple[np.ndarray | None, np.ndarray | None],
    attrs: NormAttributes,
    *,
    rms: bool,
    rounded_sum: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """(Y, Sum): the row normalised is the float32 sum x + skip, Sum is that sum rounded to X's type.

    `rounded_sum` normalises the rounded Sum instead, as the CUDA kernels do (docs/ops.md): ONNX Runtime's CUDA
    provider rounds an fp16/bf16 Add, its CPU provider runs one in float32 and keeps the unrounded sum."""
    if skip.shape != x.shape or skip.dtype != x.dtype:
        raise ValueError(f"Skip must match X: {skip.dtype}{skip.shape} vs {x.dtype}{x.shape}")
    total = x.astype(np.float32) + skip.astype(np.float32)
    s = total.astype(x.dtype)
    y, _, _ = _normalized(s if rounded_sum else total, params[0], params[1], attrs, rms=rms)
    return _output(y, x, attrs), s


def skip_layer_norm(
    x: np.ndarray,
    skip: np.ndarray,
    scale: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    rounded_sum: bool = False,
    **attrs: float,
) -> tuple[np.ndarray, np.ndarray]:
    """SkipLayerNorm -> (Y, Sum)."""
    return _skip_norm(x, skip, (scale, bias), NormAttributes(**attrs), rms=False, rounded_sum=rounded_sum)


def skip_rms_norm(
    x: np.ndarray, skip: np.ndarray, scale: np.ndarray | None = None, *, rounded_sum: bool = False, **attrs: float
) -> tuple[np.ndarray, np.ndarray]:
    """SkipRMSNorm -> (Y, Sum)."""
    return _skip_norm(x, skip, (scale, None), NormAttributes(**attrs), rms=True, rounded_sum=rounded_sum)


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
        y = _round_to(centred * inv, attrs.normalized_type).reshape(n, c, -1)
    m = attrs.multiply_type
    if scale is not None:
        y = _round_to(y * scale.astype(np.float64).reshape(c, 1), m)
    if bias is not None:
        y = _round_to(y + bias.astype(np.float64).reshape(c, 1), m)
    if attrs.activation == ACTIVATIONS["silu"]:
        with np.errstate(over="ignore"):
            y = _round_to(y * _round_to(1.0 / (1.0 + np.exp(-y)), m), m)
    elif attrs.activation != ACTIVATIONS["none"]:
        raise ValueError(f"unknown activation {attrs.activation}; expected one of {ACTIVATIONS}")
    return y.reshape(x.shape), inv, mean


def group_norm(
    x: np.ndarray, scale: np.ndarray | None = None, bias: np.ndarray | None = None, **attrs: float
) -> tuple[np.ndarray]:
    """GroupNorm -> (Y,)."""
    a = GroupNormAttributes(**attrs)  # type: ignore[arg-type]
    y, _, _ = grouped(x, scale, bias, a)
    return (_output(y, x, a),)


REFERENCES = {
    "LayerNorm": layer_norm,
    "RMSNorm": rms_norm,
    "SkipLayerNorm": skip_layer_norm,
    "SkipRMSNorm": skip_rms_norm,
    "ModulatedLayerNorm": modulated_layer_norm,
    "ModulatedRMSNorm": modulated_rms_norm,
    "GroupNorm": group_norm,
}
