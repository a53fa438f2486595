"""bench's parity check: before anything is timed, the first input sample runs through the original and the
optimized model (the sessions the bench times), and every output is compared, so that a speedup is never reported
between two models that compute different things (a LLaMA against an optimized BERT that happens to take and give
tensors of the same names, types and ranks: `onnx_norm.correspond` cannot tell them apart).

It is not the parity gate (`onnx-norm verify` is: several samples, the float64 result, exact tolerances). It only
has to tell "the same computation, rounded differently" from "a different computation", without refusing an
optimized model that rounds less than its original (an fp16 model whose fused norms do not overflow where the
original's chain of Casts does). Per output, the first test that passes decides:

1. verify's comparison (`onnx_norm.parity.metrics.compare`) with verify's tolerance for the output's element type
   (`onnx_norm.parity.tolerances.DEFAULT_TOLERANCES`, elementwise), or the `atol`/`rtol` given for the output, which
   then decide alone;
2. a looser normwise test (`looser`): the RMS of the difference at most RELATIVE_RMS_LIMIT of the original output's
   RMS (plus the dtype's atol, for outputs near zero). Rounding noise, even bf16's through a whole model, stays
   a few per cent of the signal; a different model's output differs by about as much as the output itself.
   Normwise, not the cosine similarity (blind to a scale) nor the largest relative difference (one element near
   zero, in fp16, can be off by 100% and mean nothing); 0.05 means a cosine similarity of 0.9987 or more.
   Elements where only the original is NaN/Inf are left out (the optimized norm may be the one that does not
   overflow); NaN/Inf where only the optimized model has them fail. Integer and bool outputs (token ids, masks)
   pass when at most DIFFERING_LIMIT of their elements differ (an argmax may flip at a near tie);
3. for a float output that fails both, the float64 evaluation of the original on the sample (verify's golden
   model, `onnx_norm.parity.GoldenEvaluator`): the optimized output may be as far from it as the original's is,
   plus (2)'s allowance. The original overflowing in fp16 (a row of zeros where the exact result is not) passes
   here; a different computation does not. It costs a float64 copy of the original, so it runs only on this path,
   when every other test failed and the copy fits the memory left beside the bench's sessions: a pair that passes
   (1) or (2) never pays for it.

Where every element is NaN/Inf in both, there is nothing to compare: the output passes, and says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from onnx_norm.errors import InputError
from onnx_norm.inputs import is_float
from onnx_norm.options import ParityCheckOptions
from onnx_norm.parity.tolerances import Tolerance, ToleranceSpec
from onnx_norm.parity.verdict import Comparison, compare

#: The largest RMS of the difference a float output may have, relative to the original output's RMS, when verify's
#: tolerance fails and none was given (see the module docstring).
RELATIVE_RMS_LIMIT = 0.05
#: The largest share of an integer or bool output's elements that may differ in that case.
DIFFERING_LIMIT = 0.01
#: Outputs larger than this are compared on this many elements, evenly strided: the comparison makes float64
#: copies of both sides (logits of a long batch are gigabytes) and a different computation shows in any subset.
CHECKED_ELEMENTS = 1 << 22
#: How the refusal line tells the user to skip the check or set its tolerance.
_ESCAPE = "--atol/--rtol set the check's tolerance, --no-parity-check (parity_check=False) skips it"


@dataclasses.dataclass
class OutputCheck:
    """One output of the first sample compared: whether it passed and how (`verdict`), the largest absolute
    difference, the elements out of the tolerance `atol`/`rtol`, and the normwise relative difference and cosine
    similarity of the elements finite in both (None for non-float outputs or when nothing was compared). An output
    of more than CHECKED_ELEMENTS elements is compared on an evenly strided subset of them (`total`)."""

    name: str
    passed: bool
    verdict: str
    atol: float
    rtol: float
    by: str = ""  # what passed it: "tolerance", "looser", "float64", "nothing to compare"; "" when it failed
    max_abs: float | None = None
    mismatched: int | None = None
    total: int | None = None
    relative_rms: float | None = None
    cosine: float | None = None


@dataclasses.dataclass
class ParityCheck:
    """The check's result in the bench report: `outputs` compared on the first sample, or `skipped` and why."""

    outputs: list[OutputCheck] = dataclasses.field(default_factory=list)
    skipped: str = ""

    @property
    def passed(self) -> bool | None:
        return None if self.skipped else all(output.passed for output in self.outputs)

    @property
    def summary(self) -> str:
        """One line for the bench's printout."""
        if self.skipped:
            return f"parity check skipped: {self.skipped}"
        groups: dict[str, list[OutputCheck]] = {}
        for output in self.outputs:  # one phrase per way of passing, not one per output (a model may have dozens)
            key = _PASSED_BY.get(output.by, output.verdict)
            groups.setdefault(key, []).append(output)
        parts = []
        for phrase, outputs in groups.items():
            relative = [o.relative_rms for o in outputs if o.relative_rms is not None and math.isfinite(o.relative_rms)]
            looser = relative and phrase == _PASSED_BY["looser"]
            worst = f" (relative RMS difference up to {max(relative):.3g})" if looser else ""
            parts.append(f"{_names([o.name for o in outputs])} {phrase}{worst}")
        return f"parity check on the first input sample: {'; '.join(parts) or 'no output read back'}"


#: How the printout says an output passed the looser tests (their verdicts carry numbers per output).
_PASSED_BY = {
    "looser": "within the looser normwise test",
    "float64": "within the original's own error from the float64 result",
}


def _names(names: list[str], shown: int = 3) -> str:
    listed = ", ".join(names[:shown])
    return listed if len(names) <= shown else f"{listed} and {len(names) - shown} more outputs"


def tolerances(options: ParityCheckOptions) -> ToleranceSpec | None:
    """The check's tolerances, their values validated (InputError naming the option); None when it is skipped.
    NaN/Inf are not allowed by them: a pattern that differs goes on to the looser test, which tells the original's
    overflow from the optimized model's; NaN/Inf everywhere in both passes in `_from_comparison`."""
    if not options.parity_check:
        return None
    return ToleranceSpec(options.atol, options.rtol)


def _given(value: Any, name: str) -> bool:
    """Whether the caller set a tolerance for output `name` (by its name or for all outputs)."""
    if value is None:
        return False
    return not isinstance(value, Mapping) or name in value or "*" in value


#: The float64 results of the original on the sample, or None and why there are none (called only when needed).
Exact = Callable[[], tuple[Mapping[str, np.ndarray] | None, str]]


def check_outputs(
    optimized: Mapping[str, np.ndarray],
    original: Mapping[str, np.ndarray],
    spec: ToleranceSpec,
    exact: Exact | None = None,
) -> list[OutputCheck]:
    """Every output of the original compared with the optimized model's (the module docstring): the tolerance, then
    the looser normwise check, then, for float outputs that fail both, the float64 result from `exact`."""
    checks, undecided = [], {}
    for name, value in original.items():
        if name not in optimized:  # not read back (a bfloat16 output in device memory): not compared
            continue
        actual, expected = _subset(np.asarray(optimized[name]), np.asarray(value))
        tolerance = spec.for_output(name, expected.dtype)
        comparison = compare(name, [actual], [expected], tolerance)
        check = _from_comparison(comparison)
        given = _given(spec.atol, name) or _given(spec.rtol, name)
        if not check.passed and comparison.metrics is not None and not given:
            check = looser(check, actual, expected, tolerance)
            if not check.passed and check.relative_rms is not None:
                undecided[len(checks)] = (actual, expected, tolerance)
        checks.append(check)
    if undecided and exact is not None:
        results, why = exact()
        for index, (actual, expected, tolerance) in undecided.items():
            check = checks[index]
            if results is None or check.name not in results:
                checks[index] = dataclasses.replace(check, verdict=f"{check.verdict}; no float64 result: {why}")
            else:
                (golden,) = _subset(np.asarray(results[check.name]))  # the elements `expected` kept
                checks[index] = against_exact(check, actual, expected, golden, tolerance)
    return checks


def _subset(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The arrays, or CHECKED_ELEMENTS of their elements evenly strided when they are larger and of one shape (the
    stride depends on the size alone: the same elements of every array of that size)."""
    size = arrays[0].size
    if size <= CHECKED_ELEMENTS or any(array.shape != arrays[0].shape for array in arrays):
        return arrays
    step = -(-size // CHECKED_ELEMENTS)
    return tuple(array.reshape(-1)[::step] for array in arrays)


def _from_comparison(comparison: Comparison) -> OutputCheck:
    tolerance, metrics = comparison.tolerance, comparison.metrics
    verdict, by, passed = comparison.verdict, "", comparison.passed
    if passed:
        verdict, by = f"within atol={tolerance.atol:g} rtol={tolerance.rtol:g}", "tolerance"
    elif comparison.row == "all-nonfinite":  # the check can tell nothing from it, and bench times it alike
        verdict, by, passed = "NaN/Inf everywhere in both, nothing to compare", "nothing to compare", True
    check = OutputCheck(comparison.name, passed, verdict, tolerance.atol, tolerance.rtol, by)
    if metrics is not None:
        check.max_abs, check.mismatched, check.total = metrics.max_abs, metrics.mismatched, metrics.total
        check.cosine = None if math.isnan(metrics.cosine) else metrics.cosine
    return check


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(values**2))) if values.size else 0.0


def looser(check: OutputCheck, actual: np.ndarray, expected: np.ndarray, tolerance: Tolerance) -> OutputCheck:
    """`check` decided by the looser test (the module docstring) instead of the elementwise tolerance."""
    if not is_float(expected.dtype):
        share = float(np.mean(actual != expected)) if expected.size else 0.0
        passed = share <= DIFFERING_LIMIT
        relation = "<=" if passed else ">"
        verdict = f"{100 * share:.2g}% of the elements differ ({relation} {100 * DIFFERING_LIMIT:g}% allowed)"
        return dataclasses.replace(check, passed=passed, verdict=verdict, by="looser" if passed else "")
    a, b = actual.astype(np.float64), expected.astype(np.float64)
    only_optimized = int((np.isfinite(b) & ~np.isfinite(a)).sum())
    if only_optimized:
        return dataclasses.replace(check, verdict=f"{only_optimized} NaN/Inf where the original is finite")
    both = np.isfinite(a) & np.isfinite(b)
    if not both.any():  # only the original is NaN/Inf: nothing finite on both sides to compare
        verdict = "NaN/Inf only in the original, nothing to compare"
        return dataclasses.replace(check, passed=True, verdict=verdict, by="nothing to compare")
    difference, scale = _rms(a[both] - b[both]), _rms(b[both])
    relative = difference / scale if scale > 0 else math.inf
    passed = difference <= tolerance.atol + RELATIVE_RMS_LIMIT * scale
    left_out = int((~both).sum())
    verdict = (
        f"relative RMS difference {relative:.3g} ({'<=' if passed else '>'} {RELATIVE_RMS_LIMIT:g} allowed"
        + (f"; {left_out} NaN/Inf of the original left out" if left_out else "")
        + ")"
    )
    by = "looser" if passed else ""
    return dataclasses.replace(check, passed=passed, verdict=verdict, by=by, relative_rms=relative)


def against_exact(
    check: OutputCheck, actual: np.ndarray, expected: np.ndarray, exact: np.ndarray, tolerance: Tolerance
) -> OutputCheck:
    """`check` decided by the float64 result: the optimized output may be as far from it (RMS) as the original's
    is, plus the looser test's allowance; on the elements finite in all three."""
    a, b, g = (np.asarray(x).astype(np.float64) for x in (actual, expected, exact))
    finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(g)
    optimized_error, original_error = _rms(a[finite] - g[finite]), _rms(b[finite] - g[finite])
    allowed = original_error + tolerance.atol + RELATIVE_RMS_LIMIT * _rms(g[finite])
    passed = optimized_error <= allowed
    errors = f"RMS error {optimized_error:.3g}, the original's {original_error:.3g}"
    if passed:
        verdict = f"within the original's own error from the float64 result ({errors}; {check.verdict})"
    else:
        verdict = f"{check.verdict}; beyond the original's own error from the float64 result ({errors})"
    return dataclasses.replace(check, passed=passed, verdict=verdict, by="float64" if passed else "")


def refusal(checks: list[OutputCheck], original: str, optimized: str) -> InputError | None:
    """The one-line error for outputs that differ, naming the first and its difference; None when all passed."""
    failed = [check for check in checks if not check.passed]
    if not failed:
        return None
    first = failed[0]
    details = []
    if first.max_abs is not None:
        details.append(f"max abs {first.max_abs:.3g}")
    if first.mismatched is not None:
        details.append(f"{first.mismatched}/{first.total} elements out of atol={first.atol:g} rtol={first.rtol:g}")
    if first.verdict != "differs from the original" or not details:  # compare's word for "out of tolerance"
        details.append(first.verdict)
    more = f" (and {len(failed) - 1} more output(s))" if len(failed) > 1 else ""
    return InputError(
        f"{optimized} does not compute what {original} does: output {first.name!r} on the first input sample: "
        f"{', '.join(details)}{more}; {_ESCAPE}"
    )
