"""LayerNorm, RMSNorm and their Skip (residual) forms: their records, numpy references, function bodies and the
ONNX / ONNX Runtime ops they map to and from (semantics: docs/ops.md). The body pieces (`make_body`) serve ops
that are one of these norms plus an epilogue."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from onnx_norm.ops.body import FLOAT, INT64_MAX, Body
from onnx_norm.ops.numerics import normalize, normalized, output
from onnx_norm.ops.signature import MS_DOMAIN, BodyBuilder, NativeOp, NormOpAttributes, OpSignature

__all__ = [
    "LAYER_NORM",
    "NORM_OPS",
    "RMS_NORM",
    "SKIP_LAYER_NORM",
    "SKIP_RMS_NORM",
    "layer_norm",
    "make_body",
    "rms_norm",
    "skip_layer_norm",
    "skip_rms_norm",
]

# --------------------------------------------------------------------------------------------------------------
# References


def layer_norm(
    x: np.ndarray, scale: np.ndarray | None = None, bias: np.ndarray | None = None, **attrs: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm -> (Y, Mean, InvStdDev)."""
    y, inv, mean = normalize(x, scale, bias, NormOpAttributes(**attrs), rms=False)  # type: ignore[arg-type]
    assert mean is not None
    return y, mean, inv


def rms_norm(x: np.ndarray, scale: np.ndarray | None = None, **attrs: float) -> tuple[np.ndarray, np.ndarray]:
    """RMSNorm -> (Y, InvRMS)."""
    y, inv, _ = normalize(x, scale, None, NormOpAttributes(**attrs), rms=True)  # type: ignore[arg-type]
    return y, inv


def _skip_norm(
    x: np.ndarray,
    skip: np.ndarray,
    params: tuple[np.ndarray | None, np.ndarray | None],
    attrs: NormOpAttributes,
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
    y, _, _ = normalized(s if rounded_sum else total, params[0], params[1], attrs, rms=rms)
    return output(y, x, attrs), s


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
    a = NormOpAttributes(**attrs)  # type: ignore[arg-type]
    return _skip_norm(x, skip, (scale, bias), a, rms=False, rounded_sum=rounded_sum)


def skip_rms_norm(
    x: np.ndarray, skip: np.ndarray, scale: np.ndarray | None = None, *, rounded_sum: bool = False, **attrs: float
) -> tuple[np.ndarray, np.ndarray]:
    """SkipRMSNorm -> (Y, Sum)."""
    a = NormOpAttributes(**attrs)  # type: ignore[arg-type]
    return _skip_norm(x, skip, (scale, None), a, rms=True, rounded_sum=rounded_sum)


# --------------------------------------------------------------------------------------------------------------
# Function bodies

_STATISTICS = ("Mean", "InvStdDev", "InvRMS")


@dataclasses.dataclass
class _Normalised:
    """What the normalisation step leaves: Y before its affine, and the statistics outputs (None when absent)."""

    y: ir.Value
    mean: ir.Value | None
    inv: ir.Value | None


def _skip_stage(body: Body, formal: dict[str, ir.Value], results: dict[str, ir.Value], xf: ir.Value) -> ir.Value:
    """The Skip ops' input stage: the float32 residual sum X + Skip, which is also their Sum output, rounded to X's
    type. The float32 sum is normalised, not the rounded Sum (docs/ops.md)."""
    x_type = body.sig.x_type
    total = body.op("Add", [xf, body.to_float(formal["Skip"], x_type)])
    results["Sum"] = total if x_type == FLOAT else body.cast(total, x_type)
    return total


def _wants_statistics(body: Body, n_out: int) -> bool:
    return any(n in _STATISTICS for n in body.record.outputs[:n_out])


def _normalise_trailing(body: Body, xf: ir.Value, axis: int, n_out: int) -> _Normalised:
    """A negative axis: the normalised dims are the last -axis ones whatever the rank; reducing over them with
    keepdims also gives the statistics their shape."""
    axes = list(range(axis, 0))
    centred, mean, inv = body.statistics(xf, axes, rms=body.record.rms)
    y = body.op("Mul", [centred, inv])
    if _wants_statistics(body, n_out):
        # ONNX Runtime (1.31) reduces an empty tensor to its input shape; keep one element per normalised dim.
        starts, ends = [0] * len(axes), [1] * len(axes)
        mean = None if mean is None else body.slice(mean, starts, ends, axes)
        inv = body.slice(inv, starts, ends, axes)
    return _Normalised(y, mean, inv)


def _normalise_flattened(body: Body, xf: ir.Value, x: ir.Value, axis: int, n_out: int) -> _Normalised:
    """A non-negative axis of an input of unknown rank: flatten to [rows, N] and reduce over axis 1."""
    x_shape = body.op("Shape", [x])
    rows = body.op("Flatten", [xf], {"axis": axis})
    centred, mean, inv = body.statistics(rows, [1], rms=body.record.rms)
    reshape_attrs = {"allowzero": 1} if body.sig.opset >= 14 else {}
    y = body.op("Reshape", [body.op("Mul", [centred, inv]), x_shape], reshape_attrs)
    if not _wants_statistics(body, n_out):
        return _Normalised(y, None, None)
    # Statistics keep X's leading dims and have 1 for every normalised dim.
    leading = body.slice(x_shape, [0], [axis])
    tail = body.slice(x_shape, [axis], [INT64_MAX])
    ones = body.op("Add", [body.op("Mul", [tail, body.i64(0)]), body.i64(1)])
    stat_shape = body.op("Concat", [leading, ones], {"axis": 0})
    mean = None if mean is None else body.op("Reshape", [mean, stat_shape], reshape_attrs)
    return _Normalised(y, mean, body.op("Reshape", [inv, stat_shape], reshape_attrs))


#: `epilogue(body, formal inputs, Y after the affine, X) -> Y`: what an op adds after the norm's affine (what an op
#: built on a norm adds to it).
Epilogue = Callable[[Body, dict[str, ir.Value], ir.Value, ir.Value], ir.Value]


def make_body(epilogue: Epilogue | None = None) -> BodyBuilder:
    """The body of a norm op (Y, its statistics, its input stage's outputs), with `epilogue` applied to Y after the
    affine."""

    def body_of(body: Body, formal: dict[str, ir.Value], results: dict[str, ir.Value], n_out: int) -> None:
        x = formal["X"]
        xf = body.input(formal, results)
        axis = body.sig.attrs.axis
        if axis >= 0 and body.sig.rank is not None:
            axis -= body.sig.rank
        if axis < 0:
            normalised = _normalise_trailing(body, xf, axis, n_out)
        else:
            normalised = _normalise_flattened(body, xf, x, axis, n_out)
        y = body.affine(formal, normalised.y)
        if epilogue is not None:
            y = epilogue(body, formal, y, x)
        results["Y"] = body.output(y)
        if normalised.mean is not None:
            results["Mean"] = normalised.mean
        results["InvRMS" if body.record.rms else "InvStdDev"] = normalised.inv

    return body_of


# --------------------------------------------------------------------------------------------------------------
# The ONNX / ONNX Runtime ops and the records

_LAYER_STATISTICS = {"mean": 1, "inv_std": 2}
_ONNX_AND_CONTRIB = ("", MS_DOMAIN)  # ONNX Runtime registers its contrib norms in the ONNX domain too
#: ONNX's LayerNormalization (opset >= 17), which ONNX Runtime also runs.
_LAYER_NORMALIZATION = NativeOp(
    "LayerNormalization", "", 17, True, _LAYER_STATISTICS, targets=("onnx", "ort"), take_over=("",)
)
#: Below opset 17 the default-domain name is ONNX Runtime's contrib op (Y of the scale's type, rounded once).
_ORT_LAYER_NORMALIZATION = NativeOp(
    "LayerNormalization", "", 1, False, _LAYER_STATISTICS, targets=("ort",), take_over=_ONNX_AND_CONTRIB
)
#: The only built-in op without an inverse-std output.
_RMS_NORMALIZATION = NativeOp("RMSNormalization", "", 23, True, {}, ("onnx",), ("",), takes_bias=False)
#: ONNX Runtime 1.31's CPU SimplifiedLayerNormalization has no kernel for a bfloat16 X with a float32 scale.
_SIMPLIFIED_LAYER_NORMALIZATION = NativeOp(
    "SimplifiedLayerNormalization",
    "",
    1,
    False,
    {"inv_std": 1},
    targets=("ort",),
    take_over=_ONNX_AND_CONTRIB,
    takes_bias=False,
    narrow_x_with_float_y=frozenset({int(ir.DataType.FLOAT16)}),
)
_SKIP_OUTPUTS = {"mean": 1, "inv_std": 2, "sum": 3}
_SKIP = {"targets": ("ort",), "take_over": (MS_DOMAIN,), "axis_attrs": False, "takes_skip": True}
_SKIP_LAYER_NORMALIZATION = NativeOp("SkipLayerNormalization", MS_DOMAIN, 1, True, _SKIP_OUTPUTS, **_SKIP)
_SKIP_SIMPLIFIED = NativeOp(
    "SkipSimplifiedLayerNormalization", MS_DOMAIN, 1, True, _SKIP_OUTPUTS, takes_bias=False, **_SKIP
)

_NORM_BODY = make_body()

LAYER_NORM = OpSignature(
    "LayerNorm",
    ("X", "Scale", "Bias"),
    frozenset({"Scale", "Bias"}),
    ("Y", "Mean", "InvStdDev"),
    rms=False,
    skip=False,
    kind="layer",
    reference=layer_norm,
    body=_NORM_BODY,
    attributes=NormOpAttributes,
    natives=(_LAYER_NORMALIZATION, _ORT_LAYER_NORMALIZATION),
)
RMS_NORM = OpSignature(
    "RMSNorm",
    ("X", "Scale"),
    frozenset({"Scale"}),
    ("Y", "InvRMS"),
    rms=True,
    skip=False,
    kind="rms",
    reference=rms_norm,
    body=_NORM_BODY,
    attributes=NormOpAttributes,
    natives=(_RMS_NORMALIZATION, _SIMPLIFIED_LAYER_NORMALIZATION),
)
SKIP_LAYER_NORM = OpSignature(
    "SkipLayerNorm",
    ("X", "Skip", "Scale", "Bias"),
    frozenset({"Scale", "Bias"}),
    ("Y", "Sum"),
    rms=False,
    skip=True,
    kind="layer",
    reference=skip_layer_norm,
    body=_NORM_BODY,
    input_stage=_skip_stage,
    attributes=NormOpAttributes,
    natives=(_SKIP_LAYER_NORMALIZATION,),
)
SKIP_RMS_NORM = OpSignature(
    "SkipRMSNorm",
    ("X", "Skip", "Scale"),
    frozenset({"Scale"}),
    ("Y", "Sum"),
    rms=True,
    skip=True,
    kind="rms",
    reference=skip_rms_norm,
    body=_NORM_BODY,
    input_stage=_skip_stage,
    attributes=NormOpAttributes,
    natives=(_SKIP_SIMPLIFIED,),
)
#: The ops of this module: the LayerNorm/RMSNorm semantics (their tests and GPU cases select them).
NORM_OPS: tuple[OpSignature, ...] = (LAYER_NORM, RMS_NORM, SKIP_LAYER_NORM, SKIP_RMS_NORM)
