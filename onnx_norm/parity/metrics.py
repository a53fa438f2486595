"""Error metrics of the parity gate: one tensor of the optimized model against the original's, over all samples,
both against the float64 golden result, and where the two models' NaN/Inf values differ. Numbers only: what they
mean for the verdict is the table in onnx_norm/parity/verdict.py."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnx_norm.accuracy import ulp
from onnx_norm.parity.tolerances import Tolerance

_MAX_FIRST_MISMATCHES = 5
_MAX_ROWS = 5


@dataclasses.dataclass
class Metrics:
    """Error of `actual` against `expected`, over all samples. The statistics and `mismatched` are over the elements
    finite in both models; the NaN/Inf cases are counted apart (`nonfinite_*`, and `NonFinite` for their meaning)."""

    max_abs: float
    max_rel: float
    mean_abs: float
    p99_abs: float
    cosine: float
    mismatched: int  # elements finite in both and out of elementwise tolerance
    total: int
    nonfinite_mismatched: int  # NaN/Inf on one side only (or Inf of the other sign), less the repaired ones
    first_mismatches: list[dict[str, Any]]  # {"sample": i, "index": [...], "actual": v, "expected": v}
    nonfinite_matched: int = 0  # NaN, or Inf of one sign, in both models at the same place: not in the stats
    #: Finite in the optimized model where the original is NaN/Inf and the float64 result is finite and within
    #: tolerance of the optimized value: the original overflowed where the exact result did not.
    nonfinite_repaired: int = 0
    #: NaN and Inf counts of each model: {"original": {"nan": n, "inf": n}, "optimized": {...}}.
    nonfinite_counts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    #: The first rows (sample, index of the row: all axes but the last) whose NaN/Inf pattern differs, not repaired.
    nonfinite_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def nonfinite_text(self) -> str:
        """NaN/Inf in words, "" when neither model has any: the report always says so when there are."""
        parts = []
        for role in ("original", "optimized"):
            counts = self.nonfinite_counts.get(role, {})
            found = [f"{counts[kind]} {label}" for kind, label in (("nan", "NaN"), ("inf", "Inf")) if counts.get(kind)]
            if found:
                parts.append(f"{role} {' and '.join(found)}")
        if not parts:
            return ""
        text = "NaN/Inf: " + "; ".join(parts)
        if self.nonfinite_matched:
            text += f"; {self.nonfinite_matched}/{self.total} NaN/Inf in both at the same places"
        if self.nonfinite_mismatched:
            rows = ", ".join(f"sample {r['sample']} row {r['row']}" for r in self.nonfinite_rows)
            text += f"; {self.nonfinite_mismatched} where only one model is NaN/Inf (first: {rows})"
        if self.nonfinite_repaired:
            text += (
                f"; {self.nonfinite_repaired} finite in the optimized model where the original is NaN/Inf and the "
                "float64 result is finite (repaired)"
            )
        return text


@dataclasses.dataclass
class GoldenComparison:
    """Both models against the float64 evaluation of the original."""

    original_max_abs: float
    original_mean_abs: float
    optimized_max_abs: float
    optimized_mean_abs: float
    #: Every element finite in both models no farther from exact than the original's, plus the tolerance or one
    #: ulp of the type the output is computed in, whichever is larger.
    within_envelope: bool
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


def as_float64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


@dataclasses.dataclass
class _SampleDiff:
    """One sample's differences over the elements finite in both models (`absdiff`, `rel`, the values), where
    only one model is NaN/Inf (`one_sided`, a mask), and the counts of the NaN/Inf cases and of the finite elements
    out of tolerance."""

    absdiff: np.ndarray
    rel: np.ndarray
    actual_finite: np.ndarray
    expected_finite: np.ndarray
    one_sided: np.ndarray
    nonfinite_matched: int
    mismatched: int


def _sample_diff(
    sample: int, a: np.ndarray, b: np.ndarray, tolerance: Tolerance, first: list[dict[str, Any]]
) -> _SampleDiff:
    """Differences of one sample; appends its first out-of-tolerance elements, NaN/Inf on one side included, to
    `first` (up to the maximum)."""
    finite = np.isfinite(a) & np.isfinite(b)
    same_special = ~finite & ((np.isnan(a) & np.isnan(b)) | (a == b))
    one_sided = ~finite & ~same_special
    absdiff = np.where(finite, np.abs(a - b), 0.0)
    magnitude = np.abs(np.where(finite, b, 0.0))
    rel = np.where(absdiff == 0, 0.0, absdiff / magnitude)
    out = finite & (absdiff > tolerance.atol + tolerance.rtol * magnitude)
    wanted = _MAX_FIRST_MISMATCHES - len(first)
    flagged = out | one_sided
    for index in np.argwhere(flagged)[:wanted] if wanted > 0 and flagged.any() else ():
        position = tuple(int(i) for i in index)
        first.append(
            {"sample": sample, "index": list(position), "actual": float(a[position]), "expected": float(b[position])}
        )
    return _SampleDiff(
        absdiff[finite].ravel(),
        rel[finite].ravel(),
        a[finite].ravel(),
        b[finite].ravel(),
        one_sided,
        int(same_special.sum()),
        int(out.sum()),
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    if not a.size:
        return math.nan  # no element finite in both: nothing to measure
    if norm > 0 and math.isfinite(norm):
        return float(np.dot(a, b) / norm)
    return 1.0 if not a.any() and not b.any() else 0.0


def _counts(arrays: Sequence[np.ndarray]) -> dict[str, int]:
    return {
        "nan": sum(int(np.isnan(x).sum()) for x in arrays),
        "inf": sum(int(np.isinf(x).sum()) for x in arrays),
    }


def measure(
    actual: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    tolerance: Tolerance,
    golden: Sequence[np.ndarray] | None = None,
) -> tuple[Metrics, np.ndarray, np.ndarray]:
    """Metrics, and the absolute and relative differences of the elements finite in both models over all samples
    (flattened). Elements that are the same NaN/Inf in both are counted, not compared; those NaN/Inf in one model
    only are counted apart, as repaired when `golden` shows the optimized value right (see Metrics)."""
    first: list[dict[str, Any]] = []
    with np.errstate(all="ignore"):  # NaN/Inf and huge values are expected here, and handled
        a64, b64 = [as_float64(a) for a in actual], [as_float64(b) for b in expected]
        diffs = [_sample_diff(i, a, b, tolerance, first) for i, (a, b) in enumerate(zip(a64, b64, strict=True))]
        absdiff = np.concatenate([d.absdiff for d in diffs])
        rel = np.concatenate([d.rel for d in diffs])
        cosine = _cosine(
            np.concatenate([d.actual_finite for d in diffs]), np.concatenate([d.expected_finite for d in diffs])
        )
        matched = sum(d.nonfinite_matched for d in diffs)
        one_sided = [d.one_sided for d in diffs]
        repaired = _repaired(a64, b64, golden, one_sided, tolerance)
        unrepaired = [m & ~r for m, r in zip(one_sided, repaired, strict=True)]
        metrics = Metrics(
            max_abs=float(absdiff.max()) if absdiff.size else math.nan,
            max_rel=float(rel.max()) if absdiff.size else math.nan,
            mean_abs=float(absdiff.mean()) if absdiff.size else math.nan,
            p99_abs=float(np.quantile(absdiff, 0.99)) if absdiff.size else math.nan,
            cosine=cosine,
            mismatched=sum(d.mismatched for d in diffs),
            total=int(absdiff.size) + matched + sum(int(m.sum()) for m in one_sided),
            nonfinite_mismatched=sum(int(m.sum()) for m in unrepaired),
            first_mismatches=first,
            nonfinite_matched=matched,
            nonfinite_repaired=sum(int(r.sum()) for r in repaired),
            nonfinite_counts={"original": _counts(b64), "optimized": _counts(a64)},
            nonfinite_rows=_rows(unrepaired),
        )
    return metrics, absdiff, rel


def _repaired(
    actual: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    golden: Sequence[np.ndarray] | None,
    one_sided: Sequence[np.ndarray],
    tolerance: Tolerance,
) -> list[np.ndarray]:
    """Masks of the one-sided elements where the optimized value is finite, the original's NaN/Inf, and the float64
    result finite and within tolerance of the optimized value. Without a float64 result, none."""
    if golden is None or not np.issubdtype(np.asarray(golden[0]).dtype, np.floating):
        return [np.zeros_like(mask) for mask in one_sided]
    masks = []
    for a, b, g_raw, mask in zip(actual, expected, golden, one_sided, strict=True):
        g = as_float64(g_raw)
        close = np.abs(a - g) <= tolerance.atol + tolerance.rtol * np.abs(g)
        masks.append(mask & np.isfinite(a) & ~np.isfinite(b) & np.isfinite(g) & close)
    return masks


def _rows(masks: Sequence[np.ndarray]) -> list[dict[str, Any]]:
    """The first rows (all axes but the last) holding a True of `masks`, one mask per sample."""
    rows: list[dict[str, Any]] = []
    for sample, mask in enumerate(masks):
        if not mask.any():
            continue
        flat = mask.reshape(-1, mask.shape[-1]) if mask.ndim else mask.reshape(1, 1)
        for row in np.flatnonzero(flat.any(axis=1))[: _MAX_ROWS - len(rows)]:
            index = np.unravel_index(int(row), mask.shape[:-1]) if mask.ndim > 1 else ()
            rows.append({"sample": sample, "row": [int(i) for i in index]})
        if len(rows) >= _MAX_ROWS:
            break
    return rows


def stat_passes(absdiff: np.ndarray, rel: np.ndarray, metrics: Metrics, tolerance: Tolerance) -> bool:
    """Whether the elements finite in both models are within tolerance of the original by the chosen statistic."""
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


def golden_comparison(
    actual: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    golden: Sequence[np.ndarray],
    tolerance: Tolerance,
    compute_dtype: np.dtype | None = None,
) -> GoldenComparison:
    """Both models' distance from the float64 result and whether the optimized model is inside the original's own
    error envelope, over the elements finite in both models and in the float64 result."""
    opt_err, orig_err = [], []
    envelope_ok = True
    types = [np.asarray(expected[0]).dtype, *([compute_dtype] if compute_dtype is not None else [])]
    for a_raw, b_raw, g_raw in zip(actual, expected, golden, strict=True):
        a, b, g = as_float64(a_raw), as_float64(b_raw), as_float64(g_raw)
        g_finite = np.isfinite(g)
        with np.errstate(all="ignore"):
            ea = np.where(g_finite, np.abs(a - g), 0.0)
            eb = np.where(g_finite, np.abs(b - g), 0.0)
            ea = np.where(np.isnan(ea), np.inf, ea)
            eb = np.where(np.isnan(eb), np.inf, eb)
            # Element by element, the optimized value may be as far from exact as the original's value is, plus
            # the tolerance or one ulp of the narrowest type the output is computed in (a fused op rounds once
            # where the chain rounded several times), whichever is larger. NaN/Inf on one side is NonFinite's.
            slack = np.maximum(tolerance.atol + tolerance.rtol * np.abs(np.where(g_finite, g, 0.0)), _ulps(g, types))
            compared = g_finite & np.isfinite(a) & np.isfinite(b)
            inside = ~compared | (ea <= slack + eb)
        envelope_ok = envelope_ok and bool(inside.all())
        # The distances over the same elements for both models: those NaN/Inf in one model only are judged by the
        # table's non-finite row, and counting them on one side would tip the means either way.
        opt_err.append(ea[compared].ravel())
        orig_err.append(eb[compared].ravel())
    opt_max, opt_mean = _error_stats(np.concatenate(opt_err))
    orig_max, orig_mean = _error_stats(np.concatenate(orig_err))
    finite_golden = [np.abs(as_float64(g))[np.isfinite(as_float64(g))] for g in golden]
    largest = max((float(g.max()) for g in finite_golden if g.size), default=0.0)
    # A model is only as exact as the narrowest type it computes in: a float16 graph cast to float32 at the end may
    # differ by float16's ulp, as the proof of each rewrite allows (onnx_norm/rewrite/prove.py).
    margin = max(ulp(dtype, largest) for dtype in types)
    return GoldenComparison(orig_max, orig_mean, opt_max, opt_mean, envelope_ok, margin)


def _ulps(exact: np.ndarray, types: Sequence[np.dtype]) -> np.ndarray:
    """One ulp of the widest-spaced of `types` at each exact value (0 where it is not finite)."""
    magnitude = np.abs(np.where(np.isfinite(exact), exact, 0.0))
    spacing = np.zeros_like(magnitude)
    for dtype in types:
        if np.dtype(dtype).kind == "f" and np.dtype(dtype).itemsize <= 8:
            with np.errstate(all="ignore"):
                narrow = np.minimum(magnitude, float(np.finfo(dtype).max)).astype(dtype)
                spacing = np.maximum(spacing, np.abs(np.spacing(narrow)).astype(np.float64))
        else:  # bfloat16 (ml_dtypes): the scalar rule at the largest value, an upper bound for every element
            spacing = np.maximum(spacing, ulp(dtype, float(magnitude.max(initial=0.0))))
    return spacing


def _error_stats(errors: np.ndarray) -> tuple[float, float]:
    if not errors.size:
        return 0.0, 0.0
    finite = errors[np.isfinite(errors)]
    mean = float(finite.mean()) if finite.size else math.inf
    return float(errors.max()), mean
