"""GroupNorm's CUDA kernel (custom_ops/src/cuda/group_norm_kernels.cuh), run from its real source by the CPU emulator
of the kernels (tools/gpu_harness/emulator.cc) through the real launcher and ctypes entry, against the numpy
reference (the op record's), with the runners of tools/gpu_harness/row_op_checks.py. Not run on a GPU yet (no GPU
was available to this work)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "gpu_harness"))
import group_norm_check
import row_op_checks as check
from emulator_fixtures import needs_emulator

F32, F16, BF16 = check.F32, check.F16, check.BF16


# `emulator_library`: the emulator of the kernels, built once per run for this module, tests/test_cuda_build.py and
# tests/test_adaln_cuda.py (the same build: gpu_build.build_emulator of the repository's kernels, ~11 CPU-s at
# -O1), whose emulator tests share this module's pytest-xdist unit (conftest.py): one worker builds it and runs all.
pytest_plugins = ("emulator_fixtures",)
pytestmark = pytest.mark.xdist_group("cuda-emulator")


@pytest.fixture(scope="module")
def harness(emulator_library: Path) -> check.Harness:
    return check.Harness(emulator_library)


@needs_emulator
def test_kernel_matches_the_reference_in_the_emulator(harness: check.Harness) -> None:
    """The cases tools/gpu_check.py runs on a GPU (group_norm_check.py, quick set), here in the emulator: each kernel
    variant reached, every case equal to the reference within a unit of Y's type, nothing written outside Y."""
    runner = check.HostRunner(harness)
    cases = group_norm_check.build_cases(quick=True)
    assert check.run_cases(runner, cases) == []
    assert set(runner.kernels) == {
        "group_norm vector registers",
        "group_norm scalar registers",
        "group_norm vector reread",
    }, runner.kernels


@needs_emulator
def test_a_wrong_output_is_caught(harness: check.Harness) -> None:
    """The comparison fails where the kernel and the reference disagree: a reference without the SiLU."""
    case = group_norm_check.build_cases(quick=True)[0]
    inputs = case.inputs(np.random.default_rng(0))
    got = check.HostRunner(harness).run(case, inputs)
    assert case.compare(got, case.reference(inputs)) is None
    assert case.compare(got, dataclasses.replace(case, silu=False).reference(inputs)) is not None


@needs_emulator
def test_the_launcher_rejects_a_group_count_that_does_not_divide_the_rows(harness) -> None:
    x = np.zeros(64, np.float32)
    with pytest.raises(RuntimeError, match="GroupNorm: rows must be N \\* num_groups"):
        harness.launch(
            x=x.ctypes.data, y=np.zeros(64, np.float32).ctypes.data, rows=3, cols=16, x_type=F32, y_type=F32,
            stream=0, row_op="GroupNorm", op_ints=(2, 4),
        )  # fmt: skip
