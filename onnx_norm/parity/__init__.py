"""The parity gate: does an optimized model compute what the original computes?

Both models run on the same inputs and provider; every output of the optimized model is compared with the
original's. Both are also compared with a float64 evaluation of the original (the "golden" result: an upcast copy
of the model run by ONNX Runtime, or by onnx's ReferenceEvaluator when ORT lacks a double kernel), because a fused
norm that accumulates in float32 is often *more* accurate than the decomposed fp16 graph it replaced.

An output passes by the verdict table of `onnx_norm.parity.verdict` (VERDICT_TABLE, first row that applies):
a differing shape or type fails; NaN/Inf everywhere in both fails unless `allow_nonfinite`; farther from the float64
result than the original (by mean, or by max beyond the original's own max error, with one ulp of margin) fails;
NaN/Inf in one model only fails unless `allow_nonfinite`, except where the optimized value is finite, the original's
not and the exact result finite and within tolerance (a repair); then the finite elements pass within tolerance of
the original, or element by element no farther from the exact result than the original:
`|optimized - golden| <= max(atol + rtol * |golden|, ulp) + |original - golden|`.

Default tolerances by the narrowest float type on the output's path in the original (`precision`: an fp16 model
with an fp32 output is judged as fp16), else by its element type (`atol`, `rtol`):

| dtype    | atol  | rtol  |
|----------|-------|-------|
| float64  | 1e-7  | 1e-7  |
| float32  | 1e-4  | 1e-4  |
| float16  | 1e-2  | 1e-2  |
| bfloat16 | 5e-2  | 5e-2  |
| integer, bool | 0 | 0   |

Statistics (`check_error_stat`, Polygraphy's names): `elementwise` (default) requires every element to satisfy
`|a - b| <= atol + rtol * |b|`; `max`, `mean` and `quantile` require that statistic of the absolute error to be
<= atol or that of the relative error to be <= rtol.

With `per_node=True` every fused norm of the optimized model (nodes tagged `onnx_norm.rule`) and the value it
replaced in the original are exposed as extra outputs, together with the norm's inputs, so a failure names the
first norm whose inputs still agree but whose output does not.

Modules, one job each: `tolerances` (defaults, per-output settings, option checks), `precision` (the type each
output is computed in), `metrics` (one tensor's errors and NaN/Inf), `verdict` (the table), `golden` (the float64
model), `mapping` (fused nodes back to the values they replaced), `report` (the report type) and `gate` (`verify`).
"""

from __future__ import annotations

from onnx_norm.parity.gate import verify
from onnx_norm.parity.golden import GoldenEvaluator, upcast_to_double
from onnx_norm.parity.mapping import RULE_KEY, FusedNorm, find_fused_norms
from onnx_norm.parity.metrics import GoldenComparison, Metrics
from onnx_norm.parity.report import NormComparison, ParityReport
from onnx_norm.parity.tolerances import (
    DEFAULT_TOLERANCES,
    GOLDEN_METHODS,
    OPT_LEVELS,
    PROVIDERS,
    STATS,
    GoldenMethod,
    PerOutput,
    Stat,
    Tolerance,
    ToleranceSpec,
    check_options,
    default_tolerance,
)
from onnx_norm.parity.verdict import ROW_KEYS, VERDICT_TABLE, Comparison, VerdictRow, compare

__all__ = [
    "DEFAULT_TOLERANCES",
    "GOLDEN_METHODS",
    "OPT_LEVELS",
    "PROVIDERS",
    "ROW_KEYS",
    "RULE_KEY",
    "STATS",
    "VERDICT_TABLE",
    "Comparison",
    "FusedNorm",
    "GoldenComparison",
    "GoldenEvaluator",
    "GoldenMethod",
    "Metrics",
    "NormComparison",
    "ParityReport",
    "PerOutput",
    "Stat",
    "Tolerance",
    "ToleranceSpec",
    "VerdictRow",
    "check_options",
    "compare",
    "default_tolerance",
    "find_fused_norms",
    "upcast_to_double",
    "verify",
]
