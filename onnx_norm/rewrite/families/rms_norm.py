"""RMSNorm statistics: the mean square `mean(x^2)` (`Pow(x, 2)` or `Mul(x, x)` over ReduceMean or ReduceSum/N, or
ReduceSumSquare/N).

The normalised value is `x * (mean(x^2) + eps)^-1/2`, spelled `Div(x, Sqrt(..))`, `Mul(x, Reciprocal(Sqrt(..)))`
(dynamo's rsqrt), `Mul(x, Div(1, Sqrt(..)))` (TorchScript's rsqrt) or `Pow(.., -0.5)`; `structure.flatten` covers
them all.
The mean square may be taken with its dims dropped and restored after the epsilon or the square root.
"""

from __future__ import annotations

import functools

import onnx_ir as ir

from onnx_norm.rewrite import targets
from onnx_norm.rewrite.families import layer_norm
from onnx_norm.rewrite.family import FusionRule, NormFamily
from onnx_norm.rewrite.reductions import row_mean
from onnx_norm.rewrite.spec import Statistic
from onnx_norm.rewrite.structure import centred, squared

KIND = "rms"


def rms_statistic(stat: ir.Value) -> Statistic | None:
    """Recognises `stat` as the mean square of a tensor that is not itself centred."""
    mean = row_mean(stat, dropped_ok=True)
    if mean is None:
        return None
    base = mean.input if mean.squared else squared(mean.input)
    if base is None:
        return None
    found = centred(base)
    if found is not None and found[1] == mean.axes:
        return None  # a variance: the LayerNorm family's
    return Statistic(KIND, base, mean.axes, "mean square")


FAMILY = NormFamily(
    kind=KIND,
    summary="RMSNorm: x / sqrt(mean(x^2) + eps) * scale",
    rules=(
        FusionRule("skip_rms_norm", KIND, residual=True),
        FusionRule("rms_norm_channels_first", KIND, channels_first=True),
        FusionRule("rms_norm", KIND),
    ),
    reference=functools.partial(layer_norm.reference, rms=True),
    lowerings=targets.standard_lowerings(),
    statistic=rms_statistic,
    outputs=("inv_std",),
)
