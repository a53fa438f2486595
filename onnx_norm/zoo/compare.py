"""Compare a rewritten model's outputs with the original's, with a float64 golden as the arbiter for fp16.

Used by tests/rewrite/test_zoo.py and tools/coverage.py so that both apply the same criterion to every tool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    golden_slack: float  # the rewritten model may be this many times further from float64 than the original


TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-3, golden_slack=1.5),
    # fp16: ulp(1) is ~1e-3, and the rounding of one norm propagates through every layer after it.
    "fp16": Tolerance(atol=2e-2, rtol=2e-2, golden_slack=1.5),
    "fp16-converted": Tolerance(atol=2e-2, rtol=2e-2, golden_slack=1.5),
}


@dataclasses.dataclass(frozen=True)
class Parity:
    """Outcome of one comparison: whether it passed, the largest difference from the original, and why not."""

    passed: bool
    max_abs: float
    reason: str = ""

    def __str__(self) -> str:
        return f"ok ({self.max_abs:.1e})" if self.passed else f"FAIL ({self.reason})"


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(np.nanmax(diff, initial=0.0)) if diff.size else 0.0


def compare_outputs(
    original: Mapping[str, np.ndarray],
    rewritten: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray] | None,
    tolerance: Tolerance,
) -> Parity:
    """Each output elementwise within tolerance of the original's, or, where a float64 golden is known, no
    further from the golden than the original is (times `golden_slack`): a fused op that computes more exactly
    than the graph it replaced must not count as a failure."""
    if set(rewritten) != set(original):
        return Parity(False, float("nan"), f"outputs {sorted(rewritten)} != {sorted(original)}")
    worst = 0.0
    for name, expected in original.items():
        actual = rewritten[name]
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            return Parity(
                False,
                float("nan"),
                f"{name}: {actual.dtype}{list(actual.shape)} != {expected.dtype}{list(expected.shape)}",
            )
        if not np.array_equal(np.isfinite(actual), np.isfinite(expected)):
            return Parity(False, float("nan"), f"{name}: NaN/Inf positions differ")
        error = _max_abs(actual, expected)
        worst = max(worst, error)
        close = np.isclose(actual.astype(np.float64), expected.astype(np.float64), tolerance.rtol, tolerance.atol)
        if close.all():
            continue
        reference = None if golden is None else golden.get(name)
        if reference is None or reference.shape != expected.shape:
            return Parity(False, worst, f"{name}: max abs diff {error:.2e}")
        original_error, rewritten_error = _max_abs(expected, reference), _max_abs(actual, reference)
        if rewritten_error > tolerance.golden_slack * original_error + tolerance.atol:
            return Parity(
                False,
                worst,
                f"{name}: max abs diff {error:.2e}; from float64: rewritten {rewritten_error:.2e}, "
                f"original {original_error:.2e}",
            )
    return Parity(True, worst)
