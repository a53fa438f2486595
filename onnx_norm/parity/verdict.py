"""The parity gate's verdict on one output: the table below, applied in order, the first row that applies deciding.

Each `Comparison` records the row that decided it (`Comparison.row`); docs/results.md#parity and the README's
exit-code section describe this table, and tests/parity/test_verdict_table.py exercises every row, the reverse
pairs included. "Finite elements" are those finite in both models; a NaN/Inf in one model only is "one-sided".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from onnx_norm.parity.metrics import GoldenComparison, Metrics, golden_comparison, measure, stat_passes
from onnx_norm.parity.tolerances import Tolerance


@dataclasses.dataclass(frozen=True)
class VerdictRow:
    key: str
    when: str
    passes: str  # "yes", "no", or when it depends on a flag, what


VERDICT_TABLE: tuple[VerdictRow, ...] = (
    VerdictRow("layout", "the optimized output's shape or element type differs", "no"),
    VerdictRow(
        "all-nonfinite", "every element is NaN/Inf in both models, at the same places", "with --allow-nonfinite"
    ),
    VerdictRow(
        "less-accurate",
        "farther from the float64 result than the original: mean error by more than one ulp of the narrowest type "
        "on the output's path, or max error by more than the original's own max error plus that ulp",
        "no",
    ),
    VerdictRow(
        "nonfinite-pattern",
        "NaN/Inf in one model only, other than repaired elements (finite in the optimized model where the original "
        "is NaN/Inf and the float64 result is finite and within tolerance of it)",
        "with --allow-nonfinite (the report names the rows)",
    ),
    VerdictRow("tolerance", "the finite elements are within tolerance of the original (the chosen statistic)", "yes"),
    VerdictRow(
        "envelope",
        "each finite element is no farther from the float64 result than the original's, plus the tolerance or one "
        "ulp of the narrowest type on the output's path, whichever is larger",
        "yes",
    ),
    VerdictRow("differs", "none of the above", "no"),
)

ROW_KEYS = tuple(row.key for row in VERDICT_TABLE)


@dataclasses.dataclass
class Comparison:
    """One output (or one fused norm's value) compared across the two models."""

    name: str
    dtype: str
    shape: list[int] | None
    tolerance: Tolerance
    passed: bool
    verdict: str
    metrics: Metrics | None = None
    golden: GoldenComparison | None = None
    #: The row of VERDICT_TABLE that decided ("" for a failure before any comparison: the model did not run).
    row: str = ""
    #: The narrowest floating-point type on the output's path, when narrower than the output's own type: the
    #: tolerance defaults and the accuracy margin are that type's (a float16 model with a float32 output).
    computed_in: str | None = None

    @property
    def message(self) -> str:
        m = self.metrics
        if m is None or m.nonfinite_matched == m.total:
            return self.verdict
        computed = f", judged as {self.computed_in}: computed in it on its path" if self.computed_in else ""
        nonfinite = m.nonfinite_text()
        text = (
            f"{self.verdict} (max abs {m.max_abs:.3g}, max rel {m.max_rel:.3g}, "
            f"{m.mismatched}/{m.total} out of atol={self.tolerance.atol:g} rtol={self.tolerance.rtol:g}{computed}"
            f"{'; ' + nonfinite if nonfinite else ''})"
        )
        if self.golden is not None and not self.passed:
            g = self.golden
            text += (
                f"; vs exact: optimized max {g.optimized_max_abs:.3g} mean {g.optimized_mean_abs:.3g}, "
                f"original max {g.original_max_abs:.3g} mean {g.original_mean_abs:.3g}"
            )
        return text


def compare(
    name: str,
    actual: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    tolerance: Tolerance,
    golden: Sequence[np.ndarray] | None = None,
    *,
    compute_dtype: np.dtype | None = None,
) -> Comparison:
    """Compares the optimized (`actual`) and original (`expected`) values of one tensor over all samples, with the
    float64 result (`golden`) when there is one; `compute_dtype`, a type narrower than the tensor's that its path
    computes in, widens the accuracy margin to one ulp of it (the tolerance is chosen by the caller)."""
    dtype = np.asarray(expected[0]).dtype
    shape = list(np.shape(expected[0]))
    computed = None if compute_dtype is None else np.dtype(compute_dtype).name

    def result(
        passed: bool, verdict: str, row: str, metrics: Metrics | None = None, golden: GoldenComparison | None = None
    ) -> Comparison:
        return Comparison(name, dtype.name, shape, tolerance, passed, verdict, metrics, golden, row, computed)

    for a, b in zip(actual, expected, strict=True):
        if np.shape(a) != np.shape(b):
            return result(False, f"shape {list(np.shape(a))} != {list(np.shape(b))}", "layout")
        if np.asarray(a).dtype != np.asarray(b).dtype:
            return result(False, f"dtype {np.asarray(a).dtype} != {dtype}", "layout")
    float_golden = golden if golden is not None and np.issubdtype(np.asarray(golden[0]).dtype, np.floating) else None
    metrics, absdiff, rel = measure(actual, expected, tolerance, float_golden)
    golden_cmp = None
    if float_golden is not None:
        golden_cmp = golden_comparison(actual, expected, float_golden, tolerance, compute_dtype)
    passed, verdict, row = decide(metrics, stat_passes(absdiff, rel, metrics, tolerance), golden_cmp, tolerance)
    return result(passed, verdict, row, metrics, golden_cmp)


def decide(
    metrics: Metrics, within_tolerance: bool, golden: GoldenComparison | None, tolerance: Tolerance
) -> tuple[bool, str, str]:
    """(passed, verdict, row) by VERDICT_TABLE, after its layout row (checked by `compare`)."""
    allow = tolerance.allow_nonfinite
    if metrics.total and metrics.nonfinite_matched == metrics.total:
        # Nothing finite to compare: agreeing on NaN everywhere says nothing about the computation.
        verdict = f"every element is NaN/Inf in both models ({metrics.total}/{metrics.total})" + (
            ", allowed" if allow else ": nothing to compare (--allow-nonfinite, allow_nonfinite=True, accepts it)"
        )
        return allow, verdict, "all-nonfinite"
    if golden is not None and golden.less_accurate:
        return False, golden.less_accurate, "less-accurate"
    if metrics.nonfinite_mismatched and not allow:
        return False, f"{_pattern(metrics)} (--allow-nonfinite accepts it)", "nonfinite-pattern"
    allowed = f"; {_pattern(metrics)}, allowed" if metrics.nonfinite_mismatched else ""
    if within_tolerance:
        return True, "matches the original" + allowed, "tolerance"
    if golden is not None and golden.within_envelope:
        if golden.closer:
            return True, "closer to the exact result than the original" + allowed, "envelope"
        return True, "within the original's own error from the exact result" + allowed, "envelope"
    return False, "differs from the original" + allowed, "differs"


def _pattern(metrics: Metrics) -> str:
    """The one-sided NaN/Inf elements in words, with the first rows."""
    counts = metrics.nonfinite_counts
    rows = ", ".join(f"sample {r['sample']} row {r['row']}" for r in metrics.nonfinite_rows)
    original = counts.get("original", {})
    optimized = counts.get("optimized", {})
    return (
        f"NaN/Inf pattern differs in {metrics.nonfinite_mismatched} element(s) (original {original.get('nan', 0)} "
        f"NaN {original.get('inf', 0)} Inf, optimized {optimized.get('nan', 0)} NaN {optimized.get('inf', 0)} Inf; "
        f"first rows: {rows})"
    )
