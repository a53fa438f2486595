"""Error metrics of the parity gate: one tensor of the optimized model against the original's, over all samples,
and both against the float64 golden result."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnx_norm.accuracy import ulp
from onnx_norm.parity.tolerances import Tolerance

_MAX_FIRST_MISMATCHES = 5


@dataclasses.dataclass
class Metrics:
    """Error of `actual` against `expected`, over all samples."""

    max_abs: float
    max_rel: float
    mean_abs: float
    p99_abs: float
    cosine: float
    mismatched: int  # elements out of elementwise tolerance
    total: int
    nonfinite_mismatched: int  # NaN/Inf on one side only (or Inf of the other sign)
    first_mismatches: list[dict[str, Any]]  # {"sample": i, "index": [...], "actual": v, "expected": v}
    nonfinite_matched: int = 0  # NaN, or Inf of one sign, in both models at the same place: not in the stats


@dataclasses.dataclass
class GoldenComparison:
    """Both models against the float64 evaluation of the original."""

    original_max_abs: float
    original_mean_abs: float
    optimized_max_abs: float
    optimized_mean_abs: float
    within_envelope: bool  # optimized no farther from exact than the original (plus tolerance)
    #: One unit in the last place of the output's type at the largest exact value: how much farther from exact
    #: than the original the optimized model may be, by max and by mean (onnx_norm/accuracy.py).
    margin: float = 0.0

    @property
    def closer(self) -> bool:
        return self.optimized_mean_abs <= self.original_mean_abs

    @property
    def less_accurate(self) -> str | None:
        """Why the optimized values are less accurate than the original's (beyond the margin), or None.

        The mean error must not grow by more than the margin. The max error of a whole model's output is one
        extreme draw of the rounding noise every layer after a norm propagates: a rewrite that sums in another
        order draws it again, so the max may grow up to the original's own max error (twice it) plus the margin;
        a loss of accuracy beyond that (a norm rounding where it should not) is still caught."""
        for stat, opt, allowed in (
            ("max", self.optimized_max_abs, 2 * self.original_max_abs),
            ("mean", self.optimized_mean_abs, self.original_mean_abs),
        ):
            orig = self.original_max_abs if stat == "max" else self.original_mean_abs
            if opt > allowed + self.margin:
                return (
                    f"less accurate than the original: {stat} error {opt:.3g} from the float64 result against the "
                    f"original's {orig:.3g} (margin {self.margin:.3g})"
                )
        return None


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

    @property
    def message(self) -> str:
        m = self.metrics
        if m is None or m.nonfinite_matched == m.total:
            return self.verdict
        both = f", {m.nonfinite_matched}/{m.total} NaN/Inf in both at the same places" if m.nonfinite_matched else ""
        text = (
            f"{self.verdict} (max abs {m.max_abs:.3g}, max rel {m.max_rel:.3g}, "
            f"{m.mismatched}/{m.total} out of atol={self.tolerance.atol:g} rtol={self.tolerance.rtol:g}{both})"
        )
        if self.golden is not None and not self.passed:
            g = self.golden
            text += (
                f"; vs exact: optimized max {g.optimized_max_abs:.3g} mean {g.optimized_mean_abs:.3g}, "
                f"original max {g.original_max_abs:.3g} mean {g.original_mean_abs:.3g}"
            )
        return text


def _as_float64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def compare(
    name: str,
    actual: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    tolerance: Tolerance,
    golden: Sequence[np.ndarray] | None = None,
    *,
    compute_dtype: np.dtype | None = None,
) -> Comparison:
    """Compares the optimized (`actual`) and original (`expected`) values of one tensor over all samples;
    `compute_dtype`, a type narrower than the tensor's that the model computes in (a float16 model with float32
    outputs), sets the accuracy margin: one ulp of it."""
    dtype = np.asarray(expected[0]).dtype
    shape = list(np.shape(expected[0]))
    for a, b in zip(actual, expected, strict=True):
        if np.shape(a) != np.shape(b):
            return Comparison(
                name, dtype.name, shape, tolerance, False, f"shape {list(np.shape(a))} != {list(np.shape(b))}"
            )
        if np.asarray(a).dtype != np.asarray(b).dtype:
            return Comparison(name, dtype.name, shape, tolerance, False, f"dtype {np.asarray(a).dtype} != {dtype}")
    metrics, absdiff, rel = _metrics(actual, expected, tolerance)
    if metrics.total and metrics.nonfinite_matched == metrics.total:
        # Nothing finite to compare: agreeing on NaN everywhere says nothing about the computation.
        passed = tolerance.allow_nonfinite
        verdict = f"every element is NaN/Inf in both models ({metrics.total}/{metrics.total})" + (
            ", allowed" if passed else ": nothing to compare (--allow-nonfinite, allow_nonfinite=True, accepts it)"
        )
        return Comparison(name, dtype.name, shape, tolerance, passed, verdict, metrics)
    passed = metrics.nonfinite_mismatched == 0 and _stat_passes(absdiff, rel, metrics, tolerance)
    golden_cmp = None
    if golden is not None and np.issubdtype(np.asarray(golden[0]).dtype, np.floating):
        golden_cmp = _golden(actual, expected, golden, tolerance, compute_dtype)
    passed, verdict = _verdict(passed, metrics, golden_cmp)
    return Comparison(name, dtype.name, shape, tolerance, passed, verdict, metrics, golden_cmp)


def _verdict(passed: bool, metrics: Metrics, golden: GoldenComparison | None) -> tuple[bool, str]:
    """Whether the output passes, and why: never less accurate than the original against the exact result (by max
    and mean, one ulp of margin), and within tolerance of the original or within the original's own distance from
    the exact result."""
    if golden is not None and golden.less_accurate:
        return False, golden.less_accurate
    if passed:
        return True, "matches the original"
    if golden is not None and golden.within_envelope:
        if golden.closer:
            return True, "closer to the exact result than the original"
        return True, "within the original's own error from the exact result"
    if metrics.nonfinite_mismatched:
        return False, f"{metrics.nonfinite_mismatched} NaN/Inf where the other model is finite"
    return False, "differs from the original"


@dataclasses.dataclass
class _SampleDiff:
    """One sample's differences: `absdiff`/`rel` of the compared elements (inf where only one side is NaN/Inf),
    the values finite in both, and counts of the NaN/Inf cases and of the elements out of tolerance."""

    absdiff: np.ndarray
    rel: np.ndarray
    actual_finite: np.ndarray
    expected_finite: np.ndarray
    nonfinite_mismatched: int
    nonfinite_matched: int
    mismatched: int


def _sample_diff(
    sample: int, a: np.ndarray, b: np.ndarray, tolerance: Tolerance, first: list[dict[str, Any]]
) -> _SampleDiff:
    """Differences of one sample; appends its first out-of-tolerance elements to `first` (up to the maximum)."""
    finite = np.isfinite(a) & np.isfinite(b)
    same_special = ~finite & ((np.isnan(a) & np.isnan(b)) | (a == b))
    absdiff = np.where(finite, np.abs(a - b), np.where(same_special, 0.0, np.inf))
    magnitude = np.abs(np.where(finite, b, 0.0))
    rel = np.where(absdiff == 0, 0.0, absdiff / magnitude)
    ok = absdiff <= tolerance.atol + tolerance.rtol * magnitude
    wanted = _MAX_FIRST_MISMATCHES - len(first)
    for index in np.argwhere(~ok)[:wanted] if wanted > 0 and not ok.all() else ():
        position = tuple(int(i) for i in index)
        first.append(
            {"sample": sample, "index": list(position), "actual": float(a[position]), "expected": float(b[position])}
        )
    compared = ~same_special
    return _SampleDiff(
        absdiff[compared].ravel(),
        rel[compared].ravel(),
        a[finite].ravel(),
        b[finite].ravel(),
        int((~finite & ~same_special).sum()),
        int(same_special.sum()),
        int((~ok).sum()),
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    if not a.size:
        return math.nan  # no element finite in both: nothing to measure
    if norm > 0 and math.isfinite(norm):
        return float(np.dot(a, b) / norm)
    return 1.0 if not a.any() and not b.any() else 0.0


def _metrics(
    actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], tolerance: Tolerance
) -> tuple[Metrics, np.ndarray, np.ndarray]:
    """Metrics, and the absolute and relative differences of the compared elements of all samples (flattened;
    inf where only one side is NaN/Inf). Elements that are the same NaN/Inf in both are counted, not compared."""
    first: list[dict[str, Any]] = []
    with np.errstate(all="ignore"):  # NaN/Inf and huge values are expected here, and handled
        diffs = [
            _sample_diff(sample, _as_float64(a), _as_float64(b), tolerance, first)
            for sample, (a, b) in enumerate(zip(actual, expected, strict=True))
        ]
        absdiff = np.concatenate([d.absdiff for d in diffs])
        rel = np.concatenate([d.rel for d in diffs])
        finite_abs = absdiff[np.isfinite(absdiff)]
        cosine = _cosine(
            np.concatenate([d.actual_finite for d in diffs]), np.concatenate([d.expected_finite for d in diffs])
        )
        matched = sum(d.nonfinite_matched for d in diffs)
        metrics = Metrics(
            max_abs=float(absdiff.max()) if absdiff.size else math.nan,
            max_rel=float(rel.max()) if absdiff.size else math.nan,
            mean_abs=float(finite_abs.mean()) if finite_abs.size else math.nan,
            p99_abs=float(np.quantile(finite_abs, 0.99)) if finite_abs.size else math.nan,
            cosine=cosine,
            mismatched=sum(d.mismatched for d in diffs),
            total=int(absdiff.size) + matched,
            nonfinite_mismatched=sum(d.nonfinite_mismatched for d in diffs),
            first_mismatches=first,
            nonfinite_matched=matched,
        )
    return metrics, absdiff, rel


def _stat_passes(absdiff: np.ndarray, rel: np.ndarray, metrics: Metrics, tolerance: Tolerance) -> bool:
    if tolerance.stat == "elementwise":
        return metrics.mismatched == 0
    if not absdiff.size:
        return True
    if tolerance.stat == "max":
        abs_stat, rel_stat = absdiff.max(), rel.max()
    elif tolerance.stat == "mean":
        abs_stat, rel_stat = absdiff.mean(), rel.mean()
    else:
        abs_stat, rel_stat = np.quantile(absdiff, tolerance.quantile), np.quantile(rel, tolerance.quantile)
    return bool(abs_stat <= tolerance.atol or rel_stat <= tolerance.rtol)


def _golden(
    actual: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    golden: Sequence[np.ndarray],
    tolerance: Tolerance,
    compute_dtype: np.dtype | None = None,
) -> GoldenComparison:
    opt_err, orig_err = [], []
    envelope_ok = True
    for a_raw, b_raw, g_raw in zip(actual, expected, golden, strict=True):
        a, b, g = _as_float64(a_raw), _as_float64(b_raw), _as_float64(g_raw)
        g_finite = np.isfinite(g)
        with np.errstate(all="ignore"):
            ea = np.where(g_finite, np.abs(a - g), 0.0)
            eb = np.where(g_finite, np.abs(b - g), 0.0)
            ea = np.where(np.isnan(ea), np.inf, ea)
            eb = np.where(np.isnan(eb), np.inf, eb)
            # Element by element, the optimized value may be as far from exact as the original's value is, plus
            # the tolerance; where the original is non-finite against a finite exact value, any finite value is
            # closer.
            allowed = tolerance.atol + tolerance.rtol * np.abs(np.where(g_finite, g, 0.0)) + eb
            inside = (ea <= allowed) | (~np.isfinite(eb) & np.isfinite(ea))
        envelope_ok = envelope_ok and bool(inside.all())
        opt_err.append(ea.ravel())
        orig_err.append(eb.ravel())
    ea_all, eb_all = np.concatenate(opt_err), np.concatenate(orig_err)

    def stats(errors: np.ndarray) -> tuple[float, float]:
        if not errors.size:
            return 0.0, 0.0
        finite = errors[np.isfinite(errors)]
        mean = float(finite.mean()) if finite.size else math.inf
        return float(errors.max()), mean

    opt_max, opt_mean = stats(ea_all)
    orig_max, orig_mean = stats(eb_all)
    finite_golden = [np.abs(_as_float64(g))[np.isfinite(_as_float64(g))] for g in golden]
    largest = max((float(g.max()) for g in finite_golden if g.size), default=0.0)
    # A model is only as exact as the narrowest type it computes in: a float16 graph cast to float32 at the end may
    # differ by float16's ulp, as the proof of each rewrite allows (onnx_norm/rewrite/prove.py).
    margin = max(ulp(dtype, largest) for dtype in (np.asarray(expected[0]).dtype, compute_dtype) if dtype is not None)
    return GoldenComparison(orig_max, orig_mean, opt_max, opt_mean, envelope_ok, margin)
