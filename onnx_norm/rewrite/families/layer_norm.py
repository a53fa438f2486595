"""LayerNorm statistics: the centred variance, however it is spelled.

`var = mean((x - mean(x))^2)` with `Pow(d, 2)` or `Mul(d, d)`, the mean computed once or twice (older TorchScript
exports duplicate the ReduceMean/Sub pair), or `var = mean(x^2) - mean(x)^2` (LayerNormalization's ONNX function
expansion). The normalised value is `(x - mean(x)) * (var + eps)^-1/2`.

The unbiased variance `sum((x - mean(x))^2) / (N-1)` (`x.var(-1, unbiased=True)`) is `c * var` with
`c = N/(N-1)`, and `(x - mean) / sqrt(c * var + eps)` is exactly a LayerNorm with epsilon `eps / c` and its scale
times `c^-1/2`; the statistic carries `c` and the candidate folds it in (the proof checks the result).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

from onnx_norm.ops.numerics import normalize
from onnx_norm.ops.schema import NormAttributes
from onnx_norm.rewrite import targets
from onnx_norm.rewrite.family import FusionRule, NormFamily
from onnx_norm.rewrite.reductions import row_mean
from onnx_norm.rewrite.spec import Statistic
from onnx_norm.rewrite.structure import centred, difference, same_data, squared

KIND = "layer"


def layer_statistic(stat: ir.Value) -> Statistic | None:
    """Recognises `stat` as the variance of some tensor over some axes."""
    variance = row_mean(stat, dropped_ok=True, unbiased_ok=True)
    if variance is not None:
        base = variance.input if variance.squared else squared(variance.input)
        if base is None:
            return None
        found = centred(base)
        if found is None or found[1] != variance.axes:
            return None
        if variance.correction != 1.0:
            return Statistic(KIND, found[0], variance.axes, "unbiased variance", variance.correction, centred=True)
        return Statistic(KIND, found[0], variance.axes, "centred variance", centred=True)
    return _mean_square_minus_square_mean(stat)


def _mean_square_minus_square_mean(stat: ir.Value) -> Statistic | None:
    """`E[x^2] - E[x]^2`, the variance as LayerNormalization's function expansion computes it."""
    operands = difference(stat)
    if operands is None:
        return None
    p, q = operands
    mean_of_square = row_mean(p, dropped_ok=True)
    square_of_mean = squared(q)
    if mean_of_square is None or square_of_mean is None:
        return None
    x = mean_of_square.input if mean_of_square.squared else squared(mean_of_square.input)
    mean = row_mean(square_of_mean, dropped_ok=True)
    if x is None or mean is None or mean.squared or mean.axes != mean_of_square.axes or not same_data(mean.input, x):
        return None
    if mean.kept != mean_of_square.kept:
        return None
    return Statistic(KIND, x, mean.axes, "E[x^2] - E[x]^2", centred=True)


def reference(
    x: np.ndarray, params: Mapping[str, np.ndarray | None], attrs: NormAttributes, *, rms: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The float64 reference of the built-in families (`rms`: RMSNorm's), from ops.reference."""
    return normalize(x, params.get("scale"), params.get("bias"), attrs, rms=rms)


FAMILY = NormFamily(
    kind=KIND,
    summary="LayerNorm: (x - mean(x)) / sqrt(var(x) + eps) * scale + bias",
    rules=(
        FusionRule("skip_layer_norm", KIND, residual=True),
        FusionRule("layer_norm_channels_first", KIND, channels_first=True),
        FusionRule("layer_norm", KIND),
    ),
    reference=reference,
    lowerings=targets.standard_lowerings(),
    statistic=layer_statistic,
    outputs=("mean", "inv_std"),
)
