"""The CUDA kernel of the modulated (adaLN) ops, run from its real source by the CPU emulator of the kernels
(tools/gpu_harness/emulator.cc) through the real launcher, against the op records' float64 references. The cases
are tools/gpu_harness/modulated_check.py's, the runners row_op_checks.py's; a GPU runs the same cases with
`python tools/gpu_harness/row_op_checks.py --gpu --op modulated`."""

from __future__ import annotations

from pathlib import Path

import modulated_check as check
import numpy as np
import pytest
import row_op_checks as rows
from emulator_fixtures import needs_emulator

F32, F16, BF16 = rows.F32, rows.F16, rows.BF16


# `emulator_library`: the emulator of the kernels, built once per run for this module and
# tests/kernels/test_cuda_build.py,
# whose emulator tests share this module's pytest-xdist unit (conftest.py): one worker builds it and runs both.
pytest_plugins = ("emulator_fixtures",)
pytestmark = pytest.mark.xdist_group("cuda-emulator")


@pytest.fixture(scope="module")
def emulated(emulator_library: Path) -> rows.HostRunner:
    return rows.HostRunner(rows.Harness(emulator_library))


# One case per kernel variant and per feature of the epilogue, small enough for the emulator (one coroutine per
# CUDA thread): vector units in registers, scalar units (odd length, misaligned tensors), the re-reading kernel
# (rows past 1024 threads x 4 units), the norm's affine with rounding, a shared modulation, other Y/Scale types.
CASES = [
    check.Case(False, F16, 2, 3, 96),
    check.Case(True, BF16, 2, 2, 1152, affine=True, rounding=BF16),
    check.Case(False, F32, 2, 2, 7),
    check.Case(True, F16, 2, 3, 96, misaligned=True),
    check.Case(False, F16, 1, 2, 40000),
    check.Case(False, F32, 3, 2, 64, shared=True, affine=True),
    check.Case(True, F32, 2, 3, 256, param_type=BF16, output_type=F16),
    check.Case(False, BF16, 2, 3, 256, param_type=F32, output_type=F32, rounding=BF16),
]


@needs_emulator
def test_kernel_matches_the_reference_in_the_emulator(emulated: rows.HostRunner) -> None:
    failures = rows.run_cases(emulated, CASES)
    assert failures == []
    assert set(emulated.kernels) == {
        "modulated vector registers",
        "modulated scalar registers",
        "modulated vector reread",
    }, emulated.kernels


@needs_emulator
def test_a_wrong_output_is_caught(emulated: rows.HostRunner) -> None:
    """The comparison fails where the kernel and the reference disagree: a reference without the `1 +`."""
    case = CASES[0]
    inputs = case.inputs(np.random.default_rng(0))
    got = emulated.run(case, inputs)
    assert case.compare(got, case.reference(inputs)) is None
    wrong = dict(inputs, mod_scale=(inputs["mod_scale"].astype(np.float32) - 1).astype(inputs["mod_scale"].dtype))
    assert case.compare(got, case.reference(wrong)) is not None


def test_gpu_mode_without_a_gpu_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: --gpu runs")
    assert rows.main(["--gpu", "--quick"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "needs a CUDA GPU" in captured.err
