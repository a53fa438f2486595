"""GatedRMSNorm's CUDA kernel (custom_ops/src/cuda/gated_norm_kernels.cuh: the row ops' loop with the gate before the
norm as its input stage, or after it in the epilogue), run from its real source by the CPU emulator of the kernels
(tools/gpu_harness/emulator.cc) through the real launcher and ctypes entry, against the numpy reference (the op
record's), with the runners of tools/gpu_harness/row_op_checks.py."""

from __future__ import annotations

import dataclasses

import gated_norm_check
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
    """The quick cases gpu_check.py runs on a GPU, here in the emulator: both gate orders, groups, each kernel
    variant reached, every case equal to the reference within a unit of Y's type, nothing written outside Y."""
    runner = check.HostRunner(harness)
    assert check.run_cases(runner, gated_norm_check.build_cases(quick=True)) == []
    assert set(runner.kernels) == {
        f"gated_norm {order} {units} {row}"
        for order in ("before", "after")
        for units, row in (("vector", "registers"), ("scalar", "registers"), ("vector", "reread"))
    }


@needs_emulator
@pytest.mark.parametrize("gate_after", [False, True])
def test_each_group_has_its_own_statistic_and_its_part_of_scale(harness: check.Harness, gate_after: bool) -> None:
    """Mamba2's groups: the kernel's rows are the groups, and row r scales by the part of Scale of its group (a
    kernel that read Scale from 0 in every group, or normalised the whole row, fails)."""
    case = gated_norm_check.Case(F32, 3, 64, group_size=16, gate_after=gate_after)
    inputs = case.inputs(np.random.default_rng(0))
    got = check.HostRunner(harness).run(case, inputs)
    assert case.compare(got, case.reference(inputs)) is None
    scale = inputs["scale"]
    assert scale is not None
    first_part = {**inputs, "scale": np.tile(scale[:16], 4)}
    assert case.compare(got, case.reference(first_part)) is not None
    whole_row = dataclasses.replace(case, group_size=0)
    assert case.compare(got, whole_row.reference(inputs)) is not None


@needs_emulator
def test_the_gates_order_is_the_attributes(harness: check.Harness) -> None:
    """The same X and Z give different Y before and after the norm, each equal to its own reference: the launcher
    picks the kernel of the order it is given."""
    before = gated_norm_check.Case(F16, 4, 128)
    after = dataclasses.replace(before, gate_after=True)
    inputs = before.inputs(np.random.default_rng(1))
    got_before = check.HostRunner(harness).run(before, inputs)
    got_after = check.HostRunner(harness).run(after, inputs)
    assert before.compare(got_before, before.reference(inputs)) is None
    assert after.compare(got_after, after.reference(inputs)) is None
    assert before.compare(got_before, after.reference(inputs)) is not None


@needs_emulator
def test_a_saturated_gate_is_finite(harness: check.Harness) -> None:
    """|z| ~ 30 (exp(-z) overflows float32 for z < -88 at the tails): silu is 0 or z, never NaN."""
    case = gated_norm_check.Case(F32, 3, 64, group_size=16, gate_magnitude=60.0)
    inputs = case.inputs(np.random.default_rng(2))
    got = check.HostRunner(harness).run(case, inputs)
    assert np.all(np.isfinite(got))
    assert case.compare(got, case.reference(inputs)) is None


@needs_emulator
def test_the_launcher_rejects_a_scale_that_is_not_a_row(harness: check.Harness) -> None:
    x = np.zeros(64, np.float32)
    with pytest.raises(RuntimeError, match="GatedRMSNorm: Scale must hold a whole row of X"):
        harness.launch(
            x=x.ctypes.data, y=np.zeros(64, np.float32).ctypes.data, rows=4, cols=16, x_type=F32, y_type=F32,
            stream=0, scale=np.ones(24, np.float32).ctypes.data, scale_size=24, scale_type=F32, rms=True,
            row_op="GatedRMSNorm", op_inputs=(x.ctypes.data,), op_ints=(0,),
        )  # fmt: skip
    with pytest.raises(RuntimeError, match="GatedRMSNorm: X, Z and Y are required"):
        harness.launch(
            x=x.ctypes.data, y=np.zeros(64, np.float32).ctypes.data, rows=4, cols=16, x_type=F32, y_type=F32,
            stream=0, scale_type=F32, rms=True, row_op="GatedRMSNorm", op_inputs=(None,), op_ints=(0,),
        )  # fmt: skip
