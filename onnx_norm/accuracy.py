"""Whether one result is less accurate than another against a float64 result: the one rule behind the proof of
each rewrite (onnx_norm/rewrite/prove.py) and `verify` (onnx_norm/parity/metrics.py).

"Less accurate" is by max and by mean absolute error, with a margin of one unit in the last place of the output's
element type at the largest exact value: a fused op rounds once where a chain of ops may round several times,
and may legitimately differ by that much in either direction.
"""

from __future__ import annotations

import math

import numpy as np

#: (stored mantissa bits, smallest normal exponent) by numpy dtype name (bfloat16 is ml_dtypes', which np.finfo
#: does not know).
_FORMATS = {"float16": (10, -14), "bfloat16": (7, -126), "float32": (23, -126), "float64": (52, -1022)}


def ulp(dtype: np.dtype, magnitude: float) -> float:
    """One unit in the last place of `dtype` at `magnitude` (float32's for other types)."""
    bits, min_exponent = _FORMATS.get(np.dtype(dtype).name, _FORMATS["float32"])
    exponent = math.floor(math.log2(abs(magnitude))) if magnitude else min_exponent
    return 2.0 ** (max(exponent, min_exponent) - bits)


def accuracy_loss(
    fused: np.ndarray, original: np.ndarray, exact: np.ndarray, *, original_name: str = "the subgraph's"
) -> str | None:
    """Why `fused` is less accurate than `original` (both against `exact`, float64), or None: its max or mean
    absolute error is larger by more than one unit in the last place of the output's type at the largest exact
    value. Elements where the exact value or either result is not finite are left out."""
    f, o, e = (np.asarray(a).astype(np.float64) for a in (fused, original, exact))
    finite = np.isfinite(e) & np.isfinite(f) & np.isfinite(o)
    if not finite.any():
        return None
    fused_err, original_err = np.abs(f - e)[finite], np.abs(o - e)[finite]
    margin = ulp(np.asarray(original).dtype, float(np.max(np.abs(e[finite]))))
    for stat, reduce in (("max", np.max), ("mean", np.mean)):
        a, b = float(reduce(fused_err)), float(reduce(original_err))
        if a > b + margin:
            return f"{stat} error {a:.3g} against {original_name} {b:.3g} from the float64 result (margin {margin:.3g})"
    return None
