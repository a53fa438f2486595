"""GroupNorm's CUDA kernel (custom_ops/src/cuda/group_norm_kernels.cuh), run from its real source by the CPU emulator
of the kernels (tools/gpu_harness/emulator.cc) through the real launcher and ctypes entry, against the numpy
reference. Not run on a GPU yet (no GPU was available to this work)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "gpu_harness"))
import modulated_check as check

from onnx_norm.ops.reference import group_norm, np_dtype

F32, F16, BF16 = check.F32, check.F16, check.BF16

needs_emulator = pytest.mark.skipif(
    check.cuda_include() is None or shutil.which("g++") is None,
    reason="the CPU emulator of the kernels needs the CUDA headers (cuda_fp16.h) and g++",
)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> check.Harness:
    include = check.cuda_include()
    assert include is not None
    return check.Harness(check.build_emulator(include, tmp_path_factory.mktemp("emulator")))


def _run(harness: check.Harness, shape, groups, x_type, *, affine=True, silu=True, rounding=0, offset=0):
    """(kernel's Y, reference Y, kernel name) for X of `shape`; `offset` elements misalign X and Y."""
    rng = np.random.default_rng(0)
    dtype = np_dtype(x_type)
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32).astype(dtype)
    channels = shape[1]
    scale = (1 + 0.5 * rng.standard_normal(channels)).astype(np.float32).astype(dtype) if affine else None
    bias = (0.5 * rng.standard_normal(channels)).astype(np.float32).astype(dtype) if affine else None
    x_buf = np.zeros(x.size + 8, dtype)
    x_buf[offset : offset + x.size] = x.reshape(-1)
    y_buf = np.full(x.size + 8, np.nan, np.float32).astype(dtype)
    spatial = int(np.prod(shape[2:]))
    harness.launch(
        x=x_buf[offset:].ctypes.data, y=y_buf[offset:].ctypes.data, rows=shape[0] * groups,
        cols=channels // groups * spatial, x_type=x_type, y_type=x_type, stream=0,
        scale=None if scale is None else scale.ctypes.data, bias=None if bias is None else bias.ctypes.data,
        scale_type=x_type if affine else 0, normalized_type=rounding, multiply_type=rounding,
        num_groups=groups, spatial=spatial, activation=int(silu),
    )  # fmt: skip
    got = y_buf[offset : offset + x.size].reshape(shape)
    attrs = {"num_groups": groups, "activation": int(silu), "normalized_type": rounding, "multiply_type": rounding}
    (want,) = group_norm(x, scale, bias, **attrs)
    assert np.isnan(y_buf[offset + x.size :].astype(np.float32)).all(), "wrote past Y"
    return got, want, harness.last_kernel()


# Each kernel variant: vector units in registers, scalar units (misaligned X/Y, odd spatial), rows re-read (a
# group longer than 1024 threads x 4 vectors), GroupNorm(1), fp16/bf16 with the graph's rounding points.
CASES = [
    ((2, 8, 4, 4), 4, F32, {}, "group_norm vector registers"),
    ((2, 8, 3, 5), 2, F16, {"offset": 1}, "group_norm scalar registers"),
    ((1, 4, 96, 96), 2, F32, {"silu": False}, "group_norm vector reread"),
    ((2, 6, 5, 3), 1, BF16, {"rounding": BF16, "affine": False}, "group_norm scalar registers"),
    ((2, 16, 8, 8), 4, F16, {"rounding": F16}, "group_norm vector registers"),
]


@needs_emulator
@pytest.mark.parametrize(("shape", "groups", "x_type", "options", "kernel"), CASES)
def test_kernel_matches_the_reference_in_the_emulator(harness, shape, groups, x_type, options, kernel) -> None:
    got, want, ran = _run(harness, shape, groups, x_type, **options)
    assert ran is not None and ran.rsplit(" group=", 1)[0] == kernel
    tolerance = {F32: 2e-5, F16: 2e-3, BF16: 2e-2}[x_type]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tolerance, atol=tolerance)


@needs_emulator
def test_the_launcher_rejects_a_group_count_that_does_not_divide_the_rows(harness) -> None:
    x = np.zeros(64, np.float32)
    with pytest.raises(RuntimeError, match="GroupNorm: rows must be N \\* num_groups"):
        harness.launch(
            x=x.ctypes.data, y=np.zeros(64, np.float32).ctypes.data, rows=3, cols=16, x_type=F32, y_type=F32,
            stream=0, num_groups=2, spatial=4,
        )  # fmt: skip
