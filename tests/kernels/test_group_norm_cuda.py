"""GroupNorm's CUDA kernel (custom_ops/src/cuda/group_norm_kernels.cuh), run from its real source by the CPU emulator
of the kernels (tools/gpu_harness/emulator.cc) through the real launcher and ctypes entry, against the numpy
reference (the op record's), with the runners of tools/gpu_harness/row_op_checks.py. Not run on a GPU yet (no GPU
was available to this work)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import group_norm_check
import numpy as np
import pytest
import row_op_checks as check
from emulator_fixtures import needs_emulator

F32, F16, BF16 = check.F32, check.F16, check.BF16


# `emulator_library`: the emulator of the kernels, built once per run for this module, tests/kernels/test_cuda_build.py
# and
# tests/kernels/test_adaln_cuda.py (the same build: gpu_build.build_emulator of the repository's kernels, ~11 CPU-s at
# -O1), whose emulator tests share this module's pytest-xdist unit (conftest.py): one worker builds it and runs all.
pytest_plugins = ("emulator_fixtures",)
pytestmark = pytest.mark.xdist_group("cuda-emulator")


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


class _DeferredHarness:
    """The emulator's harness whose launches, while a (fake) CUDA graph capture is open, are recorded instead of
    run, as a capture records kernel nodes; the replay runs them."""

    def __init__(self, harness: check.Harness) -> None:
        self.harness, self.capturing, self.recorded = harness, False, []

    def launch(self, **fields: object) -> None:
        if self.capturing:
            self.recorded.append(fields)
        else:
            self.harness.launch(**fields)


@needs_emulator
def test_capture_check_replays_the_launch_on_new_inputs(harness: check.Harness) -> None:
    """The row ops' CUDA-graph check (TorchRunner with `captured_over`, GPU-only) on CPU tensors, the emulator in
    place of the GPU and a stand-in for torch.cuda's capture: the launch is made inside the capture (recorded, not
    run), the case's new inputs are written into the captured buffers before the replay, and Y is read after it: Y
    is the new inputs' result, not the captured draw's."""
    torch = pytest.importorskip("torch")
    deferred = _DeferredHarness(harness)
    replayed: list[int] = []

    class Graph:
        def replay(self) -> None:
            replayed.append(len(deferred.recorded))
            for fields in deferred.recorded:
                harness.launch(**fields)
            deferred.recorded.clear()

    class Capture:
        def __init__(self, graph: Graph) -> None:
            pass

        def __enter__(self) -> None:
            deferred.capturing = True

        def __exit__(self, *_: object) -> None:
            deferred.capturing = False

    cuda = SimpleNamespace(
        CUDAGraph=Graph, graph=Capture, synchronize=lambda: None,
        current_stream=lambda: SimpleNamespace(cuda_stream=0),
    )  # fmt: skip
    runner = check.TorchRunner(deferred, device="cpu")  # type: ignore[arg-type]
    runner.torch = SimpleNamespace(empty=torch.empty, from_numpy=torch.from_numpy, cuda=cuda)
    cases = group_norm_check.build_cases(quick=True)
    assert check.run_cases(runner, cases, captured=True) == []
    assert replayed == [1] * len(cases)  # one launch captured per case, run by the replay
    case = cases[0]
    first, second = case.inputs(np.random.default_rng(1)), case.inputs(np.random.default_rng(2))
    got = runner.run(case, second, captured_over=first)
    assert case.compare(got, case.reference(second)) is None
    assert case.compare(got, case.reference(first)) is not None
    # The eager path through the same runner (the GPU's case loop): the same Y, and every guard element untouched.
    assert np.array_equal(runner.run(case, second), got, equal_nan=True) and not deferred.recorded
