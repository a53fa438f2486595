"""L2Norm's CUDA kernel (custom_ops/src/cuda/l2_norm_kernels.cuh), run from its real source by the CPU emulator of
the kernels (tools/gpu_harness/emulator.cc) through the real launcher and ctypes entry, against the numpy reference
(the op record's), with the runners of tools/gpu_harness/row_op_checks.py."""

from __future__ import annotations

import dataclasses

import l2_norm_check
import numpy as np
import pytest
import row_op_checks as check
from emulator_fixtures import needs_emulator

F32, F16 = check.F32, check.F16

# The emulator build shared with the other emulator tests (emulator_fixtures.py), in their pytest-xdist unit.
pytest_plugins = ("emulator_fixtures",)
pytestmark = pytest.mark.xdist_group("cuda-emulator")


@needs_emulator
def test_kernel_matches_the_reference_in_the_emulator(harness: check.Harness) -> None:
    """The quick cases gpu_check.py runs on a GPU, here in the emulator: each kernel variant reached, every case
    equal to the reference within a unit of Y's type (zero rows: eps, or NaN with eps 0), nothing written outside Y."""
    runner = check.HostRunner(harness)
    cases = l2_norm_check.build_cases(quick=True)
    assert check.run_cases(runner, cases) == []
    assert set(runner.kernels) == {"l2_norm vector registers", "l2_norm scalar registers", "l2_norm vector reread"}


@needs_emulator
def test_float16_rows_whose_squares_overflow_float16_are_exact(harness: check.Harness) -> None:
    """|x| ~ 1000 in float16: float32 sums, a finite Y within a unit of float16 of the float64 reference."""
    case = next(c for c in l2_norm_check.build_cases(quick=True) if c.magnitude == 1000.0)
    inputs = case.inputs(np.random.default_rng(0))
    assert np.max(np.sum(inputs["x"].astype(np.float32) ** 2, axis=1)) > 65504  # the float16 statistic overflows
    got = check.HostRunner(harness).run(case, inputs)
    assert np.all(np.isfinite(got.astype(np.float64)))
    assert case.compare(got, case.reference(inputs)) is None


@needs_emulator
def test_a_zero_row_without_epsilon_is_nan(harness: check.Harness) -> None:
    """x / ||x|| of a zero row is 0/0 = NaN, in the graph, the reference and the kernel alike; the other rows are
    exact."""
    case = l2_norm_check.Case(F32, 3, 32, epsilon=0.0, zero_row=True)
    inputs = case.inputs(np.random.default_rng(0))
    got = check.HostRunner(harness).run(case, inputs)
    assert np.all(np.isnan(got[0])) and np.all(np.isfinite(got[1:]))
    assert case.compare(got, case.reference(inputs)) is None


@needs_emulator
def test_a_wrong_output_is_caught(harness: check.Harness) -> None:
    """The comparison fails where the kernel and the reference disagree: a reference with another epsilon on a
    zero row, and one without the Scale."""
    case = l2_norm_check.build_cases(quick=True)[0]
    inputs = case.inputs(np.random.default_rng(0))
    got = check.HostRunner(harness).run(case, inputs)
    assert case.compare(got, case.reference(inputs)) is None
    assert (
        case.compare(got, dataclasses.replace(case, scale_size=None).reference({**inputs, "scale": None})) is not None
    )


@needs_emulator
def test_the_launcher_rejects_a_scale_that_does_not_divide_the_row(harness: check.Harness) -> None:
    x = np.zeros(64, np.float32)
    with pytest.raises(RuntimeError, match="L2Norm: rows and cols must be below 2\\^31, scale_size must divide"):
        harness.launch(
            x=x.ctypes.data, y=np.zeros(64, np.float32).ctypes.data, rows=4, cols=16, x_type=F32, y_type=F32,
            stream=0, scale=np.ones(5, np.float32).ctypes.data, scale_size=5, scale_type=F32, row_op="L2Norm",
        )  # fmt: skip
