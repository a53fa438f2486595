#!/usr/bin/env python3
"""Checks the CUDA norm kernels on a machine with an NVIDIA GPU and measures their bandwidth.

One prepared command (under 8 minutes on an H200, no network; `tools/device/run_gpu.sh kernels` runs it):

1. builds `tools/gpu_harness/harness.cu` with `custom_ops/src/cuda/*.cu` into a small shared library with the
   machine's nvcc, for the GPU's own architecture, and loads it with ctypes;
2. captures one launch of every kernel path in a CUDA graph (torch's strictest capture mode) and replays it on
   new inputs; a failed capture is reported and the timings fall back to CUDA events around eager launches;
3. runs every op x X type x hidden size (1 to 262144, odd sizes), the rounding attributes, Scale/Y types,
   broadcast Scale, Skip and statistics outputs, special values, unaligned tensors, Sum written over X or Skip
   (in place) and 1 to 70000 rows through `LaunchNorm` on torch tensors (on a side stream, inside guard bands
   that must stay untouched), and compares each output with `onnx_norm/ops/reference.py`;
4. measures each kernel's effective bandwidth (bytes read + written / median time, CUDA-graph replays, inputs
   rotated to defeat L2) against a device-to-device copy of the same bytes, torch's kernels and a
   one-row-per-program Triton kernel, until --budget seconds have passed;
5. where onnxruntime-gpu and the built `onnx_norm` library are installed, runs a subset through ONNX Runtime's
   CUDA provider (confirming from the profile that our node ran on CUDA) and times our ops against ONNX
   Runtime's own LayerNorm/SkipLayerNorm/SimplifiedLayerNorm kernels, CUDA graphs off and on.

Tables go to stdout and, with --out (default $OUT), to gpu_check.md and gpu_check.json there.
Exits 1 on any mismatch or failed check, 2 when it cannot run (no GPU, no nvcc, build failure).
`--self-test` runs the parts that need no GPU (case list, reference comparisons against a fake backend, every
case through the CPU emulator of the kernels, the ORT comparison on the CPU provider, the harness build);
`--plan` prints the launch configuration per op x dtype x shape for an H200 (docs/cuda_kernels.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    # Runs from a checkout without `pip install`: the reference and schema are plain Python.
    sys.path.insert(0, str(REPO))

from onnx import TensorProto  # noqa: E402

from onnx_norm.dtypes import type_name  # noqa: E402
from onnx_norm.ops import reference  # noqa: E402
from onnx_norm.ops.reference import np_dtype  # noqa: E402
from onnx_norm.ops.schema import OPS as SIGNATURES  # noqa: E402
from onnx_norm.ops.schema import NormAttributes  # noqa: E402

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
TYPE_NAMES = {t: type_name(t) for t in (0, F32, F16, BF16)}  # the spellings of onnx_norm.dtypes
FLOAT_TYPES = (F32, F16, BF16)
# The modulated (adaLN) ops go through the same launcher and harness entry; their cases, reference and runners are
# tools/gpu_harness/modulated_check.py's, run from here too (check_modulated).
OPS = tuple(name for name, signature in SIGNATURES.items() if not signature.modulated)
HIDDEN_SIZES = (1, 7, 127, 768, 4097, 16384)
# The goals: >= 85% of copy bandwidth at [8192, 4096] and [32768, 1024], >= 75% from 16K to 64K hidden,
# [1, 4096] RMSNorm in <= 2 us.
BENCH_SHAPES = (
    (1, 4096), (64, 4096), (8192, 768), (8192, 4096), (32768, 1024), (4096, 16384), (2048, 32768), (1024, 65536),
    (256, 262144),
)  # fmt: skip
GUARD = 64  # elements of sentinel before and after every output
SOURCES = REPO / "custom_ops" / "src" / "cuda"
HARNESS = REPO / "tools" / "gpu_harness" / "harness.cu"


# --------------------------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    x_type: int
    shape: tuple[int, ...]
    axis: int = -1
    scale_type: int | None = None  # None: no Scale input (and no Bias)
    bias: bool = False
    scale_shape: tuple[int, ...] | None = None  # None: the normalised dims
    output_type: int = 0
    normalized_type: int = 0
    multiply_type: int = 0
    epsilon: float = 1e-5
    outputs: bool = True  # Mean/InvStdDev (LayerNorm), InvRMS (RMSNorm) or Sum (Skip ops)
    data: str = "normal"  # normal | offset | constant | nonfinite | overflow16
    # contiguous | shifted (one common element offset) | misaligned (mixed offsets) | sum-on-x / sum-on-skip
    # (Skip ops: the Sum output bound onto the X or Skip buffer, in-place)
    layout: str = "contiguous"
    clusters: bool = True  # False: LaunchNorm may not split a row over a thread-block cluster

    @property
    def rms(self) -> bool:
        return "RMS" in self.op

    @property
    def skip(self) -> bool:
        return self.op.startswith("Skip")

    @property
    def rows(self) -> int:
        return math.prod(self.shape[: self.axis % len(self.shape)])

    @property
    def cols(self) -> int:
        return math.prod(self.shape[self.axis % len(self.shape) :])

    @property
    def y_type(self) -> int:
        return self.output_type or self.x_type

    def param_shape(self) -> tuple[int, ...]:
        return self.scale_shape if self.scale_shape is not None else self.shape[self.axis % len(self.shape) :]

    def attrs(self) -> dict[str, Any]:
        return {
            "axis": self.axis,
            "epsilon": self.epsilon,
            "normalized_type": self.normalized_type,
            "multiply_type": self.multiply_type,
            "output_type": self.output_type,
        }

    def name(self) -> str:
        parts = [self.op, TYPE_NAMES[self.x_type], "x".join(map(str, self.shape))]
        if self.axis != -1:
            parts.append(f"axis{self.axis}")
        if self.scale_type is not None:
            parts.append(f"scale:{TYPE_NAMES[self.scale_type]}" + ("+bias" if self.bias else ""))
            if self.scale_shape is not None:
                parts.append("bcast" + "x".join(map(str, self.scale_shape)))
        if self.output_type:
            parts.append(f"y:{TYPE_NAMES[self.output_type]}")
        if self.normalized_type or self.multiply_type:
            parts.append(f"round:{TYPE_NAMES[self.normalized_type]}/{TYPE_NAMES[self.multiply_type]}")
        if self.data != "normal":
            parts.append(self.data)
        if self.layout != "contiguous":
            parts.append(self.layout)
        if not self.outputs:
            parts.append("y-only")
        if not self.clusters:
            parts.append("no-cluster")
        return " ".join(parts)


def _default_case(op: str, x_type: int, shape: tuple[int, ...], **changes: Any) -> Case:
    bias = "Bias" in SIGNATURES[op].inputs
    return dataclasses.replace(Case(op, x_type, shape, scale_type=x_type, bias=bias), **changes)


def _size_cases(quick: bool) -> list[Case]:
    """Every op x X type x hidden size, plus one-row, empty and Scale-less inputs."""
    cases: list[Case] = []
    hidden_sizes = (7, 768, 4097) if quick else HIDDEN_SIZES
    for op in OPS:
        for x_type in FLOAT_TYPES:
            for hidden in hidden_sizes:
                cases.append(_default_case(op, x_type, (37, hidden)))
                if hidden <= 768 and not quick:
                    # Many rows: several rows per block and more than one wave of blocks.
                    cases.append(_default_case(op, x_type, (3000, hidden)))
            cases.append(_default_case(op, x_type, (1, 768), outputs=False))
            cases.append(_default_case(op, x_type, (0, 768)))
            cases.append(_default_case(op, x_type, (5, 4097), scale_type=None, bias=False))
    return cases


def _rounding_cases() -> list[Case]:
    """The rounding attributes and mixed Scale/Y types that real exporters' graphs fuse into."""
    cases: list[Case] = []
    for op in (name for name in OPS if not SIGNATURES[name].skip):
        for hidden in (768, 4097):
            for x_type in (F16, BF16):
                # LLaMA/T5 (round the normalised value, multiply in the narrow type), and an all-fp16 graph.
                cases.append(_default_case(op, x_type, (9, hidden), normalized_type=x_type, multiply_type=x_type))
                # Gemma: fp32 Scale (1 + w folded), fp32 multiply, narrow output.
                cases.append(_default_case(op, x_type, (9, hidden), scale_type=F32))
                cases.append(_default_case(op, x_type, (9, hidden), output_type=F32))
                cases.append(_default_case(op, x_type, (9, hidden), normalized_type=F32, multiply_type=x_type))
            cases.append(_default_case(op, F32, (9, hidden), output_type=F16, scale_type=BF16))
            cases.append(_default_case(op, F32, (9, hidden), output_type=BF16, scale_type=F16, normalized_type=F16))
            cases.append(_default_case(op, F16, (9, hidden), output_type=BF16, scale_type=BF16, multiply_type=F32))
    return cases


def _layout_cases(quick: bool) -> list[Case]:
    """Broadcast Scale, several normalised dims, special values, unaligned and in-place tensors."""
    cases: list[Case] = []
    for op in OPS:
        for x_type in FLOAT_TYPES:
            # Scale over a suffix of the normalised dims (vector and scalar paths), and a 2-D normalisation.
            cases.append(_default_case(op, x_type, (5, 6, 128), axis=1, scale_shape=(128,)))
            cases.append(_default_case(op, x_type, (4, 3, 7), axis=1, scale_shape=(7,)))
            cases.append(_default_case(op, x_type, (4, 2, 3, 64), axis=-3, scale_shape=(3, 64)))
            cases.append(_default_case(op, x_type, (6, 12, 64), axis=-2))
            for data in ("offset", "constant", "nonfinite"):
                cases.append(_default_case(op, x_type, (6, 768), data=data))
            if x_type != F32:
                cases.append(_default_case(op, x_type, (6, 768), data="overflow16"))
            for layout in ("shifted", "misaligned"):
                for hidden in (7, 768, 4097) if not quick else (768,):
                    cases.append(_default_case(op, x_type, (7, hidden), layout=layout))
                    if x_type != F32:
                        cases.append(_default_case(op, x_type, (7, hidden), layout=layout, output_type=F32))
    for op in (name for name in OPS if SIGNATURES[name].skip):
        for x_type in FLOAT_TYPES:
            for layout in IN_PLACE:
                for hidden in (7, 4097) if quick else (7, 768, 4097, 20000):
                    cases.append(_default_case(op, x_type, (5, hidden), layout=layout))
    return cases


def _wide_row_cases(op: str) -> list[Case]:
    """Every kernel path past the register rows: looping blocks, shared-memory cache, clusters, re-read."""
    return [
        # Blocks that loop over several rows (the grid is capped at a few waves): shared-memory cache with
        # a layout that moves the row's scalar ends from row to row, and the register path with many rows.
        _default_case(op, F32, (40, 8201), layout="shifted"),
        _default_case(op, F16, (70000, 8)),
        # The widest rows: past shared memory (float32 65536, float16 262144), and a decode-sized row.
        _default_case(op, F32, (2, 65536)),
        _default_case(op, F16, (1, 262144)),
        _default_case(op, F16, (1, 4096)),
        # A row split over a cluster with scalar ends on rank 0, clusters looping over rows; the paths that
        # the split replaces (re-read, one block per decode row), as on a GPU without clusters.
        _default_case(op, F32, (5, 65537), layout="shifted"),
        _default_case(op, F32, (2, 65536), clusters=False),
        _default_case(op, F16, (1, 4096), clusters=False),
    ]


def _long_row_cases(op: str) -> list[Case]:
    """Rows longer than the register path (shared-memory cache) and longer than shared memory (re-read)."""
    return [
        _default_case(op, F32, (3, 40000)),
        _default_case(op, F16, (3, 40004)),
        _default_case(op, F32, (3, 70001)),
        _default_case(op, BF16, (2, 130000)),
        _default_case(op, F16, (3, 16392), layout="shifted"),
    ]


def build_cases(quick: bool = False) -> list[Case]:
    """Every op x X type x hidden size, then the attribute, type, layout and special-value cases."""
    cases = _size_cases(quick) + _rounding_cases() + _layout_cases(quick)
    for op in OPS:
        # 4 vectors per thread (512 threads per row), and rows that share a block with a shifted layout.
        cases.append(_default_case(op, F32, (3, 8000)))
        cases.append(_default_case(op, BF16, (3, 16000), layout="shifted"))
    if not quick:
        cases += [case for op in OPS for case in _wide_row_cases(op)]
        cases += [case for op in OPS for case in _long_row_cases(op)]
    return cases


IN_PLACE = ("sum-on-x", "sum-on-skip")

# The CPU emulator's devices (tools/gpu_harness/emulator.cc, kDevices): 0 has an H100's clusters and shared
# memory (every case runs there), 1 no clusters (the fallbacks of the paths that split a row), 2 many SMs and
# 48 KiB of shared memory (few rows split over 4 and 8 blocks, rows over 8 blocks at small sizes).
EMULATED_DEVICES = {0: "clusters, 227 KiB, 3 SMs", 1: "no clusters, 163 KiB, 3 SMs", 2: "clusters, 48 KiB, 64 SMs"}


def device_cases(device: int, quick: bool = False) -> list[Case]:
    """The cases for emulated device 1 or 2: the shapes that split a row over a cluster where there are
    clusters, with scalar ends, in place, and too wide even for 8 blocks of 48 KiB."""
    shapes = [(F16, (1, 4096), "contiguous"), (F32, (1, 4096), "contiguous"), (F16, (5, 4096), "shifted")]
    shapes += [(F32, (2, 50000), "contiguous"), (BF16, (3, 50001), "shifted"), (F32, (2, 8000), "misaligned")]
    if device == 1 or not quick:
        shapes += [(F32, (2, 70001), "contiguous"), (F16, (1, 131072), "sum-on-x")]
    if device == 2 and not quick:
        shapes += [(F32, (1, 200000), "contiguous")]  # 800 KB: more than 8 x 48 KiB, re-read
    cases = []
    for op in OPS:
        for x_type, shape, layout in shapes:
            usable = layout if layout not in IN_PLACE or op.startswith("Skip") else "contiguous"
            cases.append(_default_case(op, x_type, shape, layout=usable))
    return cases


def layout_offsets(case: Case) -> dict[str, int]:
    """Element offsets of each tensor from a 256-byte-aligned allocation: one common offset keeps the vector
    path (with a scalar head), mixed offsets force the scalar fallback."""
    offsets = {"x": GUARD, "skip": GUARD, "y": GUARD, "sum": GUARD, "param": GUARD}
    if case.layout == "shifted":
        offsets = dict.fromkeys(offsets, GUARD + 3)
    elif case.layout == "misaligned":
        offsets = {"x": GUARD + 1, "skip": GUARD + 2, "y": GUARD + 3, "sum": GUARD + 1, "param": GUARD + 1}
    return offsets


# --------------------------------------------------------------------------------------------- data


@dataclasses.dataclass
class Inputs:
    x: np.ndarray
    skip: np.ndarray | None
    scale: np.ndarray | None
    bias: np.ndarray | None


def make_inputs(case: Case, seed: int) -> Inputs:
    rng = np.random.default_rng(seed)
    x64 = rng.standard_normal(case.shape) * 1.5 + 0.25
    if case.data == "offset":
        x64 = x64 * 0.5 + 1000.0  # a mean far from zero: E[x^2] - E[x]^2 would lose the variance
    elif case.data == "constant":
        x64 = np.broadcast_to(rng.standard_normal((*case.shape[: case.axis % len(case.shape)], 1)), case.shape)
        x64 = x64.reshape(case.shape)
    elif case.data == "overflow16":
        x64 = x64 * 150.0  # x^2 summed over the row overflows float16
    x = x64.astype(np.float32).astype(np_dtype(case.x_type))
    if case.data == "nonfinite" and case.rows >= 3:
        flat = x.reshape(case.rows, case.cols)
        flat[0, case.cols // 2] = np.nan
        flat[1, 0] = np.inf
        flat[2, -1] = -np.inf
    skip = None
    if case.skip:
        skip = (rng.standard_normal(case.shape) * 0.5).astype(np.float32).astype(np_dtype(case.x_type))
    scale = bias = None
    if case.scale_type is not None:
        shape = case.param_shape()
        dtype = np_dtype(case.scale_type)
        scale = (1.0 + 0.5 * rng.standard_normal(shape)).astype(np.float32).astype(dtype)
        if case.bias:
            bias = (0.2 * rng.standard_normal(shape)).astype(np.float32).astype(dtype)
    return Inputs(x, skip, scale, bias)


def reference_outputs(case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
    """Outputs of the numpy reference, keyed like the backends' results; statistics flattened to [rows]."""
    attrs = case.attrs()
    if case.op == "LayerNorm":
        y, mean, inv = reference.layer_norm(inputs.x, inputs.scale, inputs.bias, **attrs)
        return {"Y": y, "Mean": mean.reshape(-1), "InvStdDev": inv.reshape(-1)}
    if case.op == "RMSNorm":
        y, inv = reference.rms_norm(inputs.x, inputs.scale, **attrs)
        return {"Y": y, "InvRMS": inv.reshape(-1)}
    assert inputs.skip is not None
    # The CUDA kernels normalise the rounded Sum, as ONNX Runtime's CUDA Add rounds (docs/ops.md).
    if case.op == "SkipLayerNorm":
        y, s = reference.skip_layer_norm(inputs.x, inputs.skip, inputs.scale, inputs.bias, rounded_sum=True, **attrs)
    else:
        y, s = reference.skip_rms_norm(inputs.x, inputs.skip, inputs.scale, rounded_sum=True, **attrs)
    return {"Y": y, "Sum": s}


def requested_outputs(case: Case) -> tuple[str, ...]:
    extra = {
        "LayerNorm": ("Mean", "InvStdDev"),
        "RMSNorm": ("InvRMS",),
        "SkipLayerNorm": ("Sum",),
        "SkipRMSNorm": ("Sum",),
    }[case.op]
    return ("Y", *extra) if case.outputs else ("Y",)


# --------------------------------------------------------------------------------------------- comparison

_EPS = {F32: 2.0**-23, F16: 2.0**-10, BF16: 2.0**-7}


def _spread(x: np.ndarray) -> float:
    finite = x[np.isfinite(x.astype(np.float32))].astype(np.float64)
    return float(np.max(np.abs(finite))) if finite.size else 1.0


def _row_inverse(case: Case, inputs: Inputs, want: dict[str, np.ndarray]) -> np.ndarray:
    """The reference's 1/std (1/rms) per row, keepdims (broadcasts over X's shape)."""
    effective = want["Sum"] if case.skip else inputs.x
    _, inv, _ = reference.normalize(effective, None, None, NormAttributes(**case.attrs()), rms=case.rms)
    return inv.astype(np.float64)


def y_tolerance(case: Case, inputs: Inputs, want: dict[str, np.ndarray]) -> tuple[float, np.ndarray]:
    """(rtol, per-element atol) for Y.

    float32 statistics: the mean (and the sums) are off by a few float32 units of the row's largest |x|, which
    reaches Y multiplied by 1/std and |Scale|; on a zero-variance row 1/std is 1/sqrt(epsilon), so a float32
    mean that is one unit off gives a small non-zero Y where the float64 reference gives exactly Bias.
    Each rounding to a narrow type (normalized_type, multiply_type, Y) may land one unit either side of the
    reference when a value sits on a rounding boundary: up to three units of the narrowest type, relative to
    the magnitude before the Bias add, |n * Scale| <= |Y| + |Bias|.
    """
    effective = (want["Sum"] if case.skip else inputs.x).astype(np.float64)
    axes = tuple(range(case.axis % len(case.shape), len(case.shape)))
    with np.errstate(invalid="ignore"):
        row_max = np.max(np.where(np.isfinite(effective), np.abs(effective), 0.0), axis=axes, keepdims=True)
    scale = np.abs(inputs.scale.astype(np.float64)) if inputs.scale is not None else 1.0
    inv = np.nan_to_num(_row_inverse(case, inputs, want), nan=0.0, posinf=0.0)
    atol = 1e-6 + 32 * _EPS[F32] * row_max * inv * scale
    narrow = [t for t in (case.y_type, case.normalized_type, case.multiply_type) if t in (F16, BF16)]
    if not narrow:
        return 2e-5, atol
    eps = max(_EPS[t] for t in narrow)
    if inputs.bias is not None:
        atol = atol + 3.0 * eps * np.abs(inputs.bias.astype(np.float64))
    return 3.0 * eps, atol


def _as_f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32).astype(np.float64)


def compare(
    name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float | np.ndarray, exact: bool = False
) -> str | None:
    """None when `got` matches `want` (same shape and dtype, NaN/Inf in the same places, values within
    atol + rtol * |want|, or bit-identical when `exact`), else a one-line description of the worst element."""
    if got.shape != want.shape:
        return f"{name}: shape {got.shape} != {want.shape}"
    if got.dtype != want.dtype:
        return f"{name}: dtype {got.dtype} != {want.dtype}"
    if got.size == 0:
        return None
    g, w = _as_f64(got), _as_f64(want)
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    if not np.array_equal(nan_g, nan_w):
        where = np.argwhere(nan_g != nan_w)[0]
        return f"{name}: NaN mismatch at {tuple(where)}: got {g[tuple(where)]}, want {w[tuple(where)]}"
    inf_g, inf_w = np.isinf(g), np.isinf(w)
    if not np.array_equal(inf_g, inf_w) or not np.array_equal(g[inf_g], w[inf_w]):
        where = np.argwhere((inf_g != inf_w) | (inf_g & (g != w)))[0]
        return f"{name}: Inf mismatch at {tuple(where)}: got {g[tuple(where)]}, want {w[tuple(where)]}"
    finite = ~(nan_w | inf_w)
    limit = np.broadcast_to(np.asarray(atol, dtype=np.float64), w.shape) + rtol * np.abs(w)
    bad = finite & ((g != w) if exact else (np.abs(g - w) > limit))
    if bad.any():
        err = np.where(finite, np.abs(g - w), 0.0)
        where = tuple(np.unravel_index(int(np.argmax(np.where(bad, err, -1.0))), err.shape))
        return (
            f"{name}: {int(bad.sum())}/{bad.size} elements off, worst at {where}: got {g[where]!r}, "
            f"want {w[where]!r} (allowed {limit[where]:.3g})"
        )
    return None


def check_case(case: Case, inputs: Inputs, got: dict[str, np.ndarray]) -> list[str]:
    """Mismatch messages for one case's outputs (empty when all match)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        want = reference_outputs(case, inputs)
        rtol, atol = y_tolerance(case, inputs, want)
        return _check_outputs(case, inputs, got, want, rtol, atol)


def _check_outputs(
    case: Case,
    inputs: Inputs,
    got: dict[str, np.ndarray],
    want: dict[str, np.ndarray],
    rtol: float,
    atol: np.ndarray,
) -> list[str]:
    problems = []
    for output in requested_outputs(case):
        if output not in got:
            problems.append(f"{output}: missing")
            continue
        if output == "Y":
            message = compare(output, got[output], want[output], rtol, atol)
        elif output == "Sum":
            # float32 add rounded once to X's type, like the reference: bit-identical.
            message = compare(output, got[output], want[output], 0.0, 0.0, exact=True)
        elif output == "Mean":
            message = compare(output, got[output], want[output], 1e-5, 2e-6 * max(1.0, _spread(inputs.x)))
        else:
            message = compare(output, got[output], want[output], 2e-5, 0.0)
        if message:
            problems.append(message)
    return problems


# --------------------------------------------------------------------------------------------- build


def find_nvcc(explicit: str | None) -> str | None:
    if explicit:
        return explicit if Path(explicit).is_file() and os.access(explicit, os.X_OK) else None
    candidates = [os.environ.get("CUDACXX"), shutil.which("nvcc")]
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates.append(str(Path(root) / "bin" / "nvcc"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def build_harness(nvcc: str, arch: str, out_dir: Path, jobs: int | None = None) -> Path:
    """Compiles the kernels and the harness entry into out_dir/libonnx_norm_harness.so for one `arch` (e.g.
    "90"); each .cu in parallel. Raises RuntimeError with nvcc's output on failure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = [*sorted(SOURCES.glob("*.cu")), HARNESS]
    flags = [
        "-std=c++17",
        "-O3",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "-Xcompiler=-fPIC,-fvisibility=hidden",
        f"-I{SOURCES}",
    ]

    def compile_one(source: Path) -> Path:
        obj = out_dir / f"{source.stem}.o"
        cmd = [nvcc, *flags, "-c", str(source), "-o", str(obj)]
        result = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}\n{result.stdout}{result.stderr}")
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or min(len(sources), os.cpu_count() or 1)) as pool:
        objects = list(pool.map(compile_one, sources))
    library = out_dir / "libonnx_norm_harness.so"
    cmd = [nvcc, "-shared", f"-gencode=arch=compute_{arch},code=sm_{arch}", *map(str, objects), "-o", str(library)]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{result.stdout}{result.stderr}")
    return library


def find_cuda_include(nvcc: str | None) -> Path | None:
    """A CUDA include directory (for cuda_fp16.h and friends), or None."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    roots += ["/usr/local/cuda", *sorted(map(str, Path("/usr/local").glob("cuda-*")), reverse=True)]
    for root in roots:
        if root and (Path(root) / "include" / "cuda_fp16.h").is_file():
            return Path(root) / "include"
    return None


def build_emulator(cuda_include: Path, out_dir: Path, cxx: str = "g++", sources: Path = SOURCES) -> Path:
    """Builds the CPU emulator of the kernels (tools/gpu_harness/emulator.cc) with the real launcher and
    harness entry into out_dir/libonnx_norm_emulator.so; `sources`: the kernels' folder (a test's altered
    copy)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / "libonnx_norm_emulator.so"
    cmd = [
        cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{cuda_include}", f"-I{sources}",
        str(HARNESS.parent / "emulator.cc"), "-x", "c++", str(sources / "launch.cu"), str(HARNESS),
        "-o", str(library),
    ]  # fmt: skip
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{result.stdout}{result.stderr}")
    return library


class Harness:
    """ctypes binding of onnx_norm_harness_launch (tools/gpu_harness/harness.cu)."""

    def __init__(self, library: Path) -> None:
        self._lib = ctypes.CDLL(str(library))
        fn = self._lib.onnx_norm_harness_launch
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        fn.argtypes = [p, p, p, p, p, p, p, p, i64, i64, i64, ctypes.c_float, i32, i32, i32, i32, i32, i32, i32, i32]
        fn.argtypes += [p, p, i64, i64, p, ctypes.POINTER(ctypes.c_char_p)]
        fn.restype = i32
        self._fn = fn
        last_kernel = getattr(self._lib, "onnx_norm_emulator_last_kernel", None)
        if last_kernel is not None:
            last_kernel.restype = ctypes.c_char_p
        self._last_kernel = last_kernel

    def last_kernel(self) -> str | None:
        """The emulator's name for the kernel of the last launch; None on a GPU build."""
        return self._last_kernel().decode() if self._last_kernel is not None else None

    def launch(
        self,
        *,
        x: int,
        y: int,
        rows: int,
        cols: int,
        x_type: int,
        y_type: int,
        stream: int,
        skip: int | None = None,
        scale: int | None = None,
        bias: int | None = None,
        sum_out: int | None = None,
        mean: int | None = None,
        inv_std: int | None = None,
        scale_size: int = 0,
        scale_type: int = 0,
        epsilon: float = 1e-5,
        rms: bool = False,
        normalized_type: int = 0,
        multiply_type: int = 0,
        device: int = -1,
        clusters: bool = True,
        mod_scale: int | None = None,
        mod_shift: int | None = None,
        mod_batch: int = 0,
        rows_per_sample: int = 0,
    ) -> None:
        """device: the tensors' CUDA device, -1 to let LaunchNorm read it from X's pointer attributes; clusters:
        False keeps one block per row (never a thread-block cluster); mod_*: the modulated ops' ModScale/ModShift
        (of scale_type), [mod_batch, cols], one row per rows_per_sample rows of X."""
        error = ctypes.c_char_p()
        rc = self._fn(
            x, skip, scale, bias, y, sum_out, mean, inv_std, rows, cols, scale_size, epsilon, int(rms), x_type,
            scale_type, y_type, normalized_type, multiply_type, device, int(clusters), mod_scale, mod_shift,
            mod_batch, rows_per_sample, stream, ctypes.byref(error),
        )  # fmt: skip
        if rc != 0:
            message = error.value.decode() if error.value else "no message"
            raise RuntimeError(f"LaunchNorm returned {rc}: {message}")


# --------------------------------------------------------------------------------------------- torch backend


class TorchHarnessBackend:
    """Runs cases through LaunchNorm on torch CUDA tensors (side stream, guarded outputs)."""

    def __init__(self, harness: Harness, device: int = 0) -> None:
        import ml_dtypes
        import torch

        self.torch = torch
        self.harness = harness
        self.device = torch.device("cuda", device)
        self._bf16 = np.dtype(ml_dtypes.bfloat16)
        self._torch_types = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}

    # numpy <-> torch, bfloat16 through its bit pattern
    def to_device(self, a: np.ndarray, offset: int = 0) -> Any:
        torch = self.torch
        flat = np.ascontiguousarray(a).reshape(-1)
        if flat.dtype == self._bf16:
            src = torch.from_numpy(flat.view(np.int16).copy()).view(torch.bfloat16)
        else:
            src = torch.from_numpy(flat.copy())
        buf = torch.empty(offset + flat.size + GUARD, dtype=src.dtype, device=self.device)
        view = buf[offset : offset + flat.size]
        view.copy_(src)
        return view.view(a.shape)

    def to_host(self, t: Any) -> np.ndarray:
        torch = self.torch
        t = t.detach().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).cpu().numpy().view(self._bf16)
        return t.cpu().numpy()

    def guarded_empty(self, shape: tuple[int, ...], elem: int, offset: int) -> tuple[Any, Any]:
        """(buffer, view): the view starts `offset` elements in; everything else is NaN and must stay so."""
        count = math.prod(shape)
        buf = self.torch.full(
            (offset + count + GUARD,), float("nan"), dtype=self._torch_types[elem], device=self.device
        )
        return buf, buf[offset : offset + count].view(shape)

    def run(self, case: Case, inputs: Inputs, stream: Any = None, launch_only: bool = False) -> dict[str, np.ndarray]:
        torch = self.torch
        # Element offsets of each tensor from a 256-byte-aligned allocation: one common offset keeps the
        # vector path (with a scalar head), mixed offsets force the scalar fallback.
        offsets = layout_offsets(case)
        x = self.to_device(inputs.x, offsets["x"])
        skip = self.to_device(inputs.skip, offsets["skip"]) if inputs.skip is not None else None
        scale = self.to_device(inputs.scale, offsets["param"]) if inputs.scale is not None else None
        bias = self.to_device(inputs.bias, offsets["param"]) if inputs.bias is not None else None
        wanted = requested_outputs(case)
        guarded: dict[str, tuple[Any, Any]] = {"Y": self.guarded_empty(case.shape, case.y_type, offsets["y"])}
        if "Sum" in wanted:
            guarded["Sum"] = self.guarded_empty(case.shape, case.x_type, offsets["sum"])
        for stat in ("Mean", "InvStdDev", "InvRMS"):
            if stat in wanted:
                guarded[stat] = self.guarded_empty((case.rows,), F32, GUARD)
        if case.layout in IN_PLACE:
            # Sum's guarded buffer holds the input it replaces: the kernel reads it, then writes Sum over it.
            target = guarded["Sum"][1]
            if case.layout == "sum-on-x":
                target.copy_(x)
                x = target
            else:
                assert skip is not None
                target.copy_(skip)
                skip = target
        side = stream if stream is not None else torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.harness.launch(
                x=x.data_ptr(),
                y=guarded["Y"][1].data_ptr(),
                rows=case.rows,
                cols=case.cols,
                x_type=case.x_type,
                y_type=case.y_type,
                stream=side.cuda_stream,
                skip=skip.data_ptr() if skip is not None else None,
                scale=scale.data_ptr() if scale is not None else None,
                bias=bias.data_ptr() if bias is not None else None,
                sum_out=guarded["Sum"][1].data_ptr() if "Sum" in guarded else None,
                mean=guarded["Mean"][1].data_ptr() if "Mean" in guarded else None,
                inv_std=next((guarded[s][1].data_ptr() for s in ("InvStdDev", "InvRMS") if s in guarded), None),
                scale_size=math.prod(case.param_shape()) if case.scale_type is not None else 0,
                scale_type=case.scale_type or 0,
                epsilon=case.epsilon,
                rms=case.rms,
                normalized_type=case.normalized_type,
                multiply_type=case.multiply_type,
                device=self.device.index,
                clusters=case.clusters,
            )
        side.synchronize()
        results = {}
        for name, (buf, view) in guarded.items():
            outside = torch.cat([buf[: view.storage_offset()], buf[view.storage_offset() + view.numel() :]])
            if not bool(torch.isnan(outside.float()).all()):
                raise RuntimeError(f"{name}: the kernel wrote outside its output")
            results[name] = self.to_host(view)
        return results


class HostHarnessBackend:
    """Runs cases through LaunchNorm on host memory, for the CPU emulator of the kernels: the same launches,
    offsets and guard bands as TorchHarnessBackend, without a GPU."""

    def __init__(self, harness: Harness, device: int = 0) -> None:
        self.harness = harness
        self.device = device  # an emulated device (EMULATED_DEVICES)
        self.kernels: dict[str, int] = {}
        self._keep: list[np.ndarray] = []

    @staticmethod
    def _aligned(count: int, dtype: np.dtype, offset: int) -> tuple[np.ndarray, np.ndarray]:
        """(buffer, view of `count` elements starting `offset` elements after a 256-byte boundary)."""
        total = (offset + count + GUARD) * dtype.itemsize
        raw = np.empty(total + 256, dtype=np.uint8)
        start = (-raw.ctypes.data) % 256
        buf = raw[start : start + total].view(dtype)
        return buf, buf[offset : offset + count]

    def _input(self, a: np.ndarray | None, offset: int) -> int | None:
        if a is None:
            return None
        buf, view = self._aligned(a.size, a.dtype, offset)
        view[...] = a.reshape(-1)
        self._keep.append(buf)
        return view.ctypes.data

    def run(self, case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
        offsets = layout_offsets(case)
        self._keep = []
        wanted = requested_outputs(case)
        outputs: dict[str, tuple[np.ndarray, np.ndarray, tuple[int, ...]]] = {}
        kinds = {"Y": (case.y_type, case.shape, offsets["y"]), "Sum": (case.x_type, case.shape, offsets["sum"])}
        for stat in ("Mean", "InvStdDev", "InvRMS"):
            kinds[stat] = (F32, (case.rows,), GUARD)
        for name in wanted:
            elem, shape, offset = kinds[name]
            buf, view = self._aligned(math.prod(shape), np_dtype(elem), offset)
            buf[...] = np.asarray(np.nan, dtype=np.float32).astype(buf.dtype)
            outputs[name] = (buf, view, shape)
        x = self._input(inputs.x, offsets["x"]) or 0
        skip = self._input(inputs.skip, offsets["skip"])
        if case.layout in IN_PLACE:
            # Sum's guarded buffer holds the input it replaces: the kernel reads it, then writes Sum over it.
            target = outputs["Sum"][1]
            target[...] = (inputs.x if case.layout == "sum-on-x" else inputs.skip).reshape(-1)
            if case.layout == "sum-on-x":
                x = target.ctypes.data
            else:
                skip = target.ctypes.data
        self.harness.launch(
            x=x,
            y=outputs["Y"][1].ctypes.data,
            rows=case.rows,
            cols=case.cols,
            x_type=case.x_type,
            y_type=case.y_type,
            stream=0,
            skip=skip,
            scale=self._input(inputs.scale, offsets["param"]),
            bias=self._input(inputs.bias, offsets["param"]),
            sum_out=outputs["Sum"][1].ctypes.data if "Sum" in outputs else None,
            mean=outputs["Mean"][1].ctypes.data if "Mean" in outputs else None,
            inv_std=next((outputs[s][1].ctypes.data for s in ("InvStdDev", "InvRMS") if s in outputs), None),
            scale_size=math.prod(case.param_shape()) if case.scale_type is not None else 0,
            scale_type=case.scale_type or 0,
            epsilon=case.epsilon,
            rms=case.rms,
            normalized_type=case.normalized_type,
            multiply_type=case.multiply_type,
            device=self.device,
            clusters=case.clusters,
        )
        kernel = self.harness.last_kernel()
        if kernel and case.rows > 0:
            self.kernels[kernel] = self.kernels.get(kernel, 0) + 1
        results = {}
        for name, (buf, view, shape) in outputs.items():
            start = (view.ctypes.data - buf.ctypes.data) // buf.itemsize
            outside = np.concatenate([buf[:start], buf[start + view.size :]]).astype(np.float32)
            if not np.isnan(outside).all():
                raise RuntimeError(f"{name}: the kernel wrote outside its output")
            results[name] = view.reshape(shape).copy()
        return results


# --------------------------------------------------------------------------------------------- ORT backend


class OrtBackend:
    """Runs cases through ONNX Runtime with the built onnx_norm library on one provider (CUDA on a GPU
    machine; the CPU provider in --self-test, to check the model building and the profile reading)."""

    def __init__(self, provider: str = "CUDAExecutionProvider") -> None:
        import onnxruntime as ort

        self.ort = ort
        self.provider = provider
        self.profiles_checked = 0

    @staticmethod
    def available() -> str | None:
        """None when usable, else why not."""
        try:
            import onnxruntime as ort
        except ImportError:
            return "onnxruntime is not installed"
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu is not installed)"
        try:
            ort.preload_dlls()  # the CUDA/cuDNN libraries of the nvidia-* wheels, when they are installed
        except Exception as exc:  # older onnxruntime, or nothing to preload: the probe below decides
            print(f"(onnxruntime.preload_dlls: {exc})")
        # onnxruntime-gpu lists CUDA even when its CUDA libraries are missing, then silently runs on the CPU.
        from onnx import helper

        probe = helper.make_model(
            helper.make_graph(
                [helper.make_node("Add", ["a", "a"], ["b"])],
                "probe",
                [helper.make_tensor_value_info("a", F32, [4])],
                [helper.make_tensor_value_info("b", F32, [4])],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        )
        probe.ir_version = 10
        try:
            session = ort.InferenceSession(probe.SerializeToString(), providers=["CUDAExecutionProvider"])
        except Exception as exc:  # any failure to start the provider
            return f"onnxruntime's CUDA provider does not start here ({exc})"
        if session.get_providers()[0] != "CUDAExecutionProvider":
            return "onnxruntime-gpu is installed but its CUDA provider fell back to the CPU (CUDA/cuDNN libraries?)"
        try:
            import onnx_norm

            path = Path(onnx_norm.get_library_path())
        except Exception as exc:  # any failure means the library is not built/installed
            return f"the onnx_norm custom-op library is not available ({exc})"
        if not path.is_file():
            return f"the onnx_norm custom-op library is missing at {path}"
        return None

    def _session_options(self, profile: bool = True) -> Any:
        import onnx_norm

        try:
            options = onnx_norm.session_options()
        except TypeError:
            options = self.ort.SessionOptions()
            options.register_custom_ops_library(str(onnx_norm.get_library_path()))
        if profile:
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(tempfile.gettempdir()) / "onnx_norm_gpu_check")
        return options

    def _model(self, case: Case) -> bytes:
        from onnx import helper

        from onnx_norm.ops.schema import DOMAIN, OPSET_VERSION

        signature = SIGNATURES[case.op]
        inputs = [helper.make_tensor_value_info("X", case.x_type, case.shape)]
        names = ["X"]
        if case.skip:
            inputs.append(helper.make_tensor_value_info("Skip", case.x_type, case.shape))
            names.append("Skip")
        if case.scale_type is not None:
            inputs.append(helper.make_tensor_value_info("Scale", case.scale_type, case.param_shape()))
            names.append("Scale")
            if case.bias:
                inputs.append(helper.make_tensor_value_info("Bias", case.scale_type, case.param_shape()))
                names.append("Bias")
        wanted = requested_outputs(case)
        out_names = [name if name in wanted else "" for name in signature.outputs]
        while out_names and not out_names[-1]:
            out_names.pop()
        outputs = []
        for name in wanted:
            if name == "Y":
                outputs.append(helper.make_tensor_value_info("Y", case.y_type, case.shape))
            elif name == "Sum":
                outputs.append(helper.make_tensor_value_info("Sum", case.x_type, case.shape))
            else:
                first = case.axis % len(case.shape)
                stat_shape = [*case.shape[:first]] + [1] * (len(case.shape) - first)
                outputs.append(helper.make_tensor_value_info(name, F32, stat_shape))
        node = helper.make_node(case.op, names, out_names, domain=DOMAIN, name="fused", **case.attrs())
        graph = helper.make_graph([node], "gpu_check", inputs, outputs)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
        )
        model.ir_version = 10  # ONNX Runtime <= 1.31 rejects newer IR versions
        return model.SerializeToString()

    def run(self, case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
        ort = self.ort
        session = ort.InferenceSession(
            self._model(case), sess_options=self._session_options(), providers=[self.provider]
        )
        if session.get_providers()[0] != self.provider:
            raise RuntimeError(f"session fell back to {session.get_providers()}")
        feeds = {"X": inputs.x}
        if inputs.skip is not None:
            feeds["Skip"] = inputs.skip
        if inputs.scale is not None:
            feeds["Scale"] = inputs.scale
        if inputs.bias is not None:
            feeds["Bias"] = inputs.bias
        wanted = requested_outputs(case)
        values = session.run(list(wanted), feeds)
        profile = Path(session.end_profiling())
        try:
            events = json.loads(profile.read_text())
        finally:
            profile.unlink(missing_ok=True)
        providers = {
            e.get("args", {}).get("provider")
            for e in events
            if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == case.op
        }
        if providers != {self.provider}:
            raise RuntimeError(f"profile shows {case.op} on {sorted(map(str, providers))}, not {self.provider}")
        self.profiles_checked += 1
        results = {}
        for name, value in zip(wanted, values, strict=True):
            results[name] = value.reshape(-1) if name in ("Mean", "InvStdDev", "InvRMS") else value
        return results


def ort_cases(cases: Iterable[Case], limit: int = 80) -> list[Case]:
    """The subset that ONNX Runtime's numpy interface can feed (no bfloat16) with the default layout, thinned
    to `limit` sessions (each costs a session creation) while keeping every op."""
    usable = [
        c
        for c in cases
        if c.layout == "contiguous"
        and c.clusters
        and BF16 not in (c.x_type, c.scale_type, c.output_type)
        and c.rows > 0
        and c.cols <= 16384
    ]
    step = max(1, math.ceil(len(usable) / limit))
    return usable[::step]


# --------------------------------------------------------------------------------------------- ORT's kernels

# ONNX Runtime's own op for each of ours (ORT registers SimplifiedLayerNormalization in the ONNX domain).
ORT_EQUIVALENTS = {
    "LayerNorm": ("LayerNormalization", ""),
    "RMSNorm": ("SimplifiedLayerNormalization", ""),
    "SkipLayerNorm": ("SkipLayerNormalization", "com.microsoft"),
    "SkipRMSNorm": ("SkipSimplifiedLayerNormalization", "com.microsoft"),
}
ORT_SHAPES = ((1, 4096), (8192, 768), (8192, 4096), (32768, 1024), (4096, 16384))


def ort_native_model(case: Case) -> bytes:
    """ONNX Runtime's own kernel for `case` (last-axis norm, Scale and Bias in X's type), with Y (and, for the
    Skip ops, the sum) as outputs, like ours in OrtBackend._model with outputs=case.skip."""
    from onnx import helper

    name, domain = ORT_EQUIVALENTS[case.op]
    inputs = [helper.make_tensor_value_info("X", case.x_type, case.shape)]
    names = ["X"]
    if case.skip:
        inputs.append(helper.make_tensor_value_info("Skip", case.x_type, case.shape))
        names.append("Skip")
    inputs.append(helper.make_tensor_value_info("Scale", case.x_type, case.param_shape()))
    names.append("Scale")
    if case.bias:
        inputs.append(helper.make_tensor_value_info("Bias", case.x_type, case.param_shape()))
        names.append("Bias")
    outputs = [helper.make_tensor_value_info("Y", case.x_type, case.shape)]
    out_names = ["Y"]
    if case.skip:
        outputs.append(helper.make_tensor_value_info("Sum", case.x_type, case.shape))
        out_names += ["", "", "Sum"]  # output, mean, inv_std_var, input_skip_bias_sum
    attrs: dict[str, Any] = {"epsilon": case.epsilon}
    if not case.skip:
        attrs["axis"] = -1
    node = helper.make_node(name, names, out_names, domain=domain, name="native", **attrs)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph([node], "ort_native", inputs, outputs), opset_imports=opsets)
    model.ir_version = 10
    return model.SerializeToString()


def time_ort_session(
    ort: Any, model: bytes, options: Any, feeds: dict[str, np.ndarray], outputs: dict[str, tuple], provider: str,
    graphs: bool, runs: int,
) -> tuple[float, dict[str, np.ndarray]]:  # fmt: skip
    """Mean microseconds per run_with_iobinding over `runs` runs (inputs and outputs bound on the
    provider's device once; CUDA graphs on or off), and the outputs of the last run."""
    cuda = provider == "CUDAExecutionProvider"
    device = "cuda" if cuda else "cpu"
    provider_options = {"enable_cuda_graph": "1" if graphs else "0"} if cuda else {}
    session = ort.InferenceSession(model, sess_options=options, providers=[(provider, provider_options)])
    if session.get_providers()[0] != provider:
        raise RuntimeError(f"session fell back to {session.get_providers()}")
    binding = session.io_binding()
    keep = []
    for name, value in feeds.items():
        ort_value = ort.OrtValue.ortvalue_from_numpy(value, device, 0)
        keep.append(ort_value)
        binding.bind_ortvalue_input(name, ort_value)
    bound = {}
    for name, (shape, dtype) in outputs.items():
        bound[name] = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, device, 0)
        binding.bind_ortvalue_output(name, bound[name])
    for _ in range(3):  # warm-up; with CUDA graphs ORT captures during these
        session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    started = time.perf_counter()
    for _ in range(runs):
        session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    elapsed = (time.perf_counter() - started) * 1e6 / runs
    return elapsed, {name: value.numpy() for name, value in bound.items()}


def compare_with_ort_kernels(
    provider: str, shapes: Iterable[tuple[int, int]], dtypes: Iterable[int], runs: int, deadline: float
) -> list[list[str]]:
    """Our ops and ONNX Runtime's own kernels in ONNX Runtime, same inputs, same binding: time per run (CUDA
    graphs off and on) and the largest difference of Y. One row per op x dtype x shape; a failure (a capture
    that ORT refused, a missing kernel) is written into the row, not raised."""
    import onnxruntime as ort

    backend = OrtBackend(provider)
    rows = []
    for op in OPS:
        for dtype in dtypes:
            for shape in shapes:
                if time.perf_counter() > deadline:
                    return rows
                case = dataclasses.replace(_default_case(op, dtype, shape), outputs=op.startswith("Skip"))
                inputs = make_inputs(case, seed=7)
                feeds = {"X": inputs.x, "Scale": inputs.scale}
                if inputs.skip is not None:
                    feeds["Skip"] = inputs.skip
                if inputs.bias is not None:
                    feeds["Bias"] = inputs.bias
                dtype_np = np_dtype(dtype)
                outputs = dict.fromkeys(requested_outputs(case), (case.shape, dtype_np))
                cells = [op, TYPE_NAMES[dtype], "x".join(map(str, shape))]
                results: dict[str, dict[str, np.ndarray]] = {}
                for graphs in (False, True):
                    for who, model, options in (
                        ("ours", backend._model(case), backend._session_options(profile=False)),
                        ("ort", ort_native_model(case), ort.SessionOptions()),
                    ):
                        if graphs and provider != "CUDAExecutionProvider":
                            cells.append("-")
                            continue
                        try:
                            us, got = time_ort_session(ort, model, options, feeds, outputs, provider, graphs, runs)
                            results[who] = got
                            cells.append(f"{us:.1f}")
                        except Exception as exc:  # written into the table
                            cells.append(f"failed: {type(exc).__name__}: {str(exc)[:80]}")
                ratios = []
                for i in (3, 5):
                    try:
                        ratios.append(f"{float(cells[i + 1]) / float(cells[i]):.2f}x")
                    except ValueError:
                        ratios.append("-")
                if "ours" in results and "ort" in results:
                    diff = np.max(np.abs(_as_f64(results["ours"]["Y"]) - _as_f64(results["ort"]["Y"])))
                    ratios.append(f"{diff:.3g}")
                else:
                    ratios.append("-")
                rows.append(cells + ratios)
    return rows


ORT_HEADER = [
    "op", "dtype", "shape", "ours us", "ORT us", "ours us (graph)", "ORT us (graph)", "ORT/ours", "ORT/ours (graph)",
    "max |Y diff|",
]  # fmt: skip
ORT_NOTE = (
    "Both through ONNX Runtime with IO binding (inputs and outputs on the device, bound once): mean time per "
    "run_with_iobinding over the runs, so each includes ORT's per-run overhead; (graph): the session's CUDA graph "
    "(enable_cuda_graph). ORT: LayerNormalization, SimplifiedLayerNormalization, SkipLayerNormalization, "
    "SkipSimplifiedLayerNormalization (com.microsoft); the Skip ops write Y and the sum."
)


# --------------------------------------------------------------------------------------------- fake backend


class FakeBackend:
    """The reference itself, optionally with one element of one output nudged: checks the checker."""

    def __init__(self, perturb: str | None = None) -> None:
        self.perturb = perturb

    def run(self, case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            reference_values = reference_outputs(case, inputs)
        out = {k: v.copy() for k, v in reference_values.items() if k in requested_outputs(case)}
        if self.perturb and self.perturb in out and out[self.perturb].size:
            target = out[self.perturb].reshape(-1)
            finite = np.flatnonzero(np.isfinite(target.astype(np.float32)))
            if finite.size:
                i = int(finite[len(finite) // 2])
                value = np.float64(target[i].astype(np.float32))
                target[i] = np.asarray(value + 0.05 * max(1.0, abs(value)), dtype=np.float32).astype(target.dtype)
            else:
                target[0] = np.asarray(0.0, dtype=np.float32).astype(target.dtype)
        return out


# --------------------------------------------------------------------------------------------- running checks


@dataclasses.dataclass
class Outcome:
    checked: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    quiet: bool = False

    def fail(self, what: str) -> None:
        self.failures.append(what)
        if not self.quiet:
            print(f"FAIL {what}", flush=True)


def _modulated_check() -> Any:
    """tools/gpu_harness/modulated_check.py, imported when used (it imports this module)."""
    if str(HARNESS.parent) not in sys.path:
        sys.path.insert(0, str(HARNESS.parent))
    import modulated_check

    return modulated_check


def check_modulated(harness: Harness, on_gpu: bool, quick: bool, outcome: Outcome) -> str:
    """The modulated ops' cases (modulated_check.py) through `harness`: torch tensors on the GPU, or host memory
    in the CPU emulator. Failures go to `outcome`; returns the summary line."""
    check = _modulated_check()
    runner = check.TorchRunner(harness) if on_gpu else check.HostRunner(harness)
    cases = check.build_cases(quick)
    started = time.perf_counter()
    failures = check.run_cases(runner, cases)
    outcome.checked += len(cases) - len(failures)
    for failure in failures:
        outcome.fail(f"[modulated] {failure}")
    seconds = time.perf_counter() - started
    kernels = "".join(f", {k} x{n}" for k, n in sorted(runner.kernels.items()))
    return f"modulated ops: {len(cases)} cases, {len(failures)} failures ({seconds:.0f} s){kernels}"


def run_cases(backend: Any, cases: list[Case], label: str, outcome: Outcome) -> None:
    for index, case in enumerate(cases):
        inputs = make_inputs(case, seed=index)
        try:
            got = backend.run(case, inputs)
        except Exception as exc:  # every failure is reported, then the run goes on
            outcome.fail(f"[{label}] {case.name()}: {type(exc).__name__}: {exc}")
            continue
        problems = check_case(case, inputs, got)
        outcome.checked += 1
        for problem in problems:
            outcome.fail(f"[{label}] {case.name()}: {problem}")


# One capture per kernel path: register rows, shared-memory cache, a wide row over a cluster (with clusters off:
# re-read), a decode row over a cluster (off: register rows). The last field: clusters allowed.
CAPTURE_CASES = (
    ("SkipLayerNorm", F16, (64, 4096), True),
    ("LayerNorm", F32, (3, 20000), True),
    ("SkipRMSNorm", F32, (2, 70001), True),
    ("SkipRMSNorm", F32, (2, 70001), False),
    ("RMSNorm", BF16, (1, 4096), True),
    ("RMSNorm", BF16, (1, 4096), False),
)


def _capture_one(
    backend: TorchHarnessBackend, op: str, x_type: int, shape: tuple[int, int], clusters: bool = True
) -> list[str]:
    """One launch captured in a CUDA graph, replayed after new inputs were written: the mismatches."""
    torch = backend.torch
    case = _default_case(op, x_type, shape)
    inputs = make_inputs(case, seed=1234)
    x = backend.to_device(inputs.x)
    skip = backend.to_device(inputs.skip) if inputs.skip is not None else None
    scale = backend.to_device(inputs.scale)
    bias = backend.to_device(inputs.bias) if inputs.bias is not None else None
    y = torch.empty(case.shape, dtype=backend._torch_types[x_type], device=backend.device)
    s = torch.empty_like(y) if skip is not None else None

    def launch() -> None:
        backend.harness.launch(
            x=x.data_ptr(), y=y.data_ptr(), rows=case.rows, cols=case.cols, x_type=x_type, y_type=x_type,
            stream=torch.cuda.current_stream(backend.device).cuda_stream,
            skip=skip.data_ptr() if skip is not None else None, scale=scale.data_ptr(),
            bias=bias.data_ptr() if bias is not None else None, sum_out=s.data_ptr() if s is not None else None,
            scale_size=case.cols, scale_type=x_type, rms=case.rms, device=backend.device.index, clusters=clusters,
        )  # fmt: skip

    graph = torch.cuda.CUDAGraph()
    warm = torch.cuda.Stream(device=backend.device)
    warm.wait_stream(torch.cuda.current_stream(backend.device))
    with torch.cuda.stream(warm):
        launch()
    torch.cuda.current_stream(backend.device).wait_stream(warm)
    with torch.cuda.graph(graph):
        launch()
    fresh = make_inputs(case, seed=4321)
    x.copy_(backend.to_device(fresh.x))
    if skip is not None:
        skip.copy_(backend.to_device(fresh.skip))
    graph.replay()
    torch.cuda.synchronize(backend.device)
    got = {"Y": backend.to_host(y)}
    if s is not None:
        got["Sum"] = backend.to_host(s)
    checked = dataclasses.replace(case, outputs=s is not None)
    return check_case(checked, Inputs(fresh.x, fresh.skip, inputs.scale, inputs.bias), got)


def check_graph_capture(backend: TorchHarnessBackend, outcome: Outcome) -> tuple[bool, str]:
    """LaunchNorm inside torch.cuda.graph capture (torch's default "global" mode, the strictest): a launch
    that queried the stream, allocated or synchronised would invalidate the capture. Each replay must follow
    new input values. Returns (all captured, one line saying what happened) and records failures."""
    failed = []
    for op, x_type, shape, clusters in CAPTURE_CASES:
        name = _default_case(op, x_type, shape).name() + ("" if clusters else " no-cluster")
        try:
            problems = _capture_one(backend, op, x_type, shape, clusters)
            outcome.checked += 1
        except Exception as exc:  # reported, then the run goes on without graphs
            problems = [f"capture/replay failed: {type(exc).__name__}: {exc}"]
            backend.torch.cuda.synchronize(backend.device)
        for problem in problems:
            outcome.fail(f"[graph] {name}: {problem}")
        if problems:
            failed.append(name)
    if failed:
        return False, f"CUDA graph capture FAILED for {', '.join(failed)}; timings fall back to CUDA events"
    return True, f"CUDA graph capture: {len(CAPTURE_CASES)} kernel paths captured and replayed with new inputs"


def check_other_device(harness: Harness, outcome: Outcome) -> None:
    """With two GPUs: a stream on device 1 while device 0 is current (two CUDA runtimes share a process)."""
    import torch

    if torch.cuda.device_count() < 2:
        print("(one GPU: the check of a launch on device 1 while device 0 is current needs two and was skipped)")
        return
    torch.cuda.set_device(0)
    backend = TorchHarnessBackend(harness, device=1)
    case = _default_case("RMSNorm", BF16, (33, 4096))
    run_cases(backend, [case], "device1", outcome)


# --------------------------------------------------------------------------------------------- bandwidth


def bytes_moved(op: str, element_size: int, rows: int, cols: int) -> int:
    """Bytes one call must read and write at least: X and Y (and Skip and Sum for the Skip ops) once, plus
    Scale (and Bias for LayerNorm)."""
    skip_op, rms = op.startswith("Skip"), "RMS" in op
    return rows * cols * element_size * (2 + (2 if skip_op else 0)) + cols * element_size * (1 if rms else 2)


@dataclasses.dataclass
class BenchRow:
    op: str
    dtype: str
    shape: tuple[int, int]
    bytes_moved: int
    ours_us: float
    copy_us: float
    torch_us: float
    triton_us: float | None
    timing: str  # "graph" or "events" (capture failed)
    # Ours with clusters off (one block per row), where the launcher may split rows over a cluster.
    single_us: float | None = None

    def cells(self) -> list[str]:
        gbs = self.bytes_moved / (self.ours_us * 1e3)
        copy_gbs = self.bytes_moved / (self.copy_us * 1e3)
        triton = "-" if self.triton_us is None else f"{self.triton_us:.1f}"
        vs_triton = "-" if self.triton_us is None else f"{self.triton_us / self.ours_us:.2f}x"
        return [
            self.op,
            self.dtype,
            f"{self.shape[0]}x{self.shape[1]}",
            f"{self.bytes_moved / 1e6:.1f}",
            f"{self.ours_us:.1f}",
            f"{gbs:.0f}",
            f"{copy_gbs:.0f}",
            f"{100 * gbs / copy_gbs:.0f}%",
            f"{self.torch_us:.1f}",
            f"{self.torch_us / self.ours_us:.2f}x",
            triton,
            vs_triton,
            "-" if self.single_us is None else f"{self.single_us:.1f}",
            self.timing,
        ]


BENCH_HEADER = [
    "op", "dtype", "shape", "MB", "ours us", "ours GB/s", "copy GB/s", "of copy", "torch us", "vs torch",
    "triton us", "vs triton", "no-cluster us", "timing",
]  # fmt: skip
BENCH_NOTE = (
    "MB: bytes read + written per call (X, Skip, Scale, Bias, Y, Sum). GB/s = MB / time. copy: a device-to-device "
    "copy moving the same bytes. torch: F.layer_norm / F.rms_norm (Skip ops: x + skip first). triton: one row per "
    "program (tools/gpu_harness/triton_norm.py). vs: their time / ours. no-cluster: ours with clusters off (one "
    "block per row), where rows are few (rows x 2 <= SMs) or wider than a block's shared memory. timing: median "
    "over replays of a CUDA "
    "graph of the calls (inputs rotated past L2), or CUDA events around eager calls where capture failed."
)


def time_calls(torch: Any, calls: list[Callable[[], None]], use_graph: bool, replays: int = 15) -> float:
    """Median microseconds per call: the calls captured once in a CUDA graph and the graph replayed between
    CUDA events (no Python or launch overhead in the timing), or, with use_graph False, the calls launched
    eagerly between the events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # warm-up outside the capture (lazy init, attribute calls)
            call()
    torch.cuda.current_stream().wait_stream(stream)
    run: Callable[[], None]
    if use_graph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for call in calls:
                call()
        run = graph.replay
    else:

        def run() -> None:
            for call in calls:
                call()

    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times)


def _load_triton() -> Any:
    """tools/gpu_harness/triton_norm.py, or None when triton is missing or does not work here."""
    try:
        sys.path.insert(0, str(HARNESS.parent))
        import triton_norm

        return triton_norm if triton_norm.available() else None
    except Exception:  # no triton, or a triton that cannot compile here: the column says "-"
        return None


@dataclasses.dataclass
class _BenchSet:
    """Input sets for one op x dtype x shape (rotated so one graph replay streams past L2), and the calls timed
    on them: our launch, torch's kernels, the Triton stand-in and a same-size device-to-device copy."""

    backend: TorchHarnessBackend
    op: str
    dtype: int
    rows: int
    cols: int
    sets: int
    tensors: dict[str, list[Any]]
    weight: Any
    bias: Any

    @property
    def skip_op(self) -> bool:
        return self.op.startswith("Skip")

    @property
    def rms(self) -> bool:
        return "RMS" in self.op

    @classmethod
    def make(
        cls, backend: TorchHarnessBackend, op: str, dtype: int, shape: tuple[int, int], per_call: int, l2_bytes: int
    ) -> _BenchSet:
        torch, device = backend.torch, backend.device
        tdtype = backend._torch_types[dtype]
        rows, cols = shape
        # Enough input sets that one graph replay streams more than twice the L2 cache.
        sets = max(2, min(8, math.ceil(l2_bytes / per_call)))
        skip_op, rms = op.startswith("Skip"), "RMS" in op
        xs = [torch.randn(rows, cols, device=device, dtype=tdtype) for _ in range(sets)]
        srcs = [torch.empty(per_call // 2, dtype=torch.uint8, device=device) for _ in range(sets)]
        tensors = {
            "x": xs,
            "skip": [torch.randn_like(xs[0]) for _ in range(sets)] if skip_op else [],
            "y": [torch.empty_like(xs[0]) for _ in range(sets)],
            "sum": [torch.empty_like(xs[0]) for _ in range(sets)] if skip_op else [],
            "src": srcs,
            "dst": [torch.empty_like(s) for s in srcs],
        }
        weight = torch.randn(cols, device=device, dtype=tdtype)
        bias = None if rms else torch.randn(cols, device=device, dtype=tdtype)
        return cls(backend, op, dtype, rows, cols, sets, tensors, weight, bias)

    def ours(self, i: int, clusters: bool = True) -> Callable[[], None]:
        t, torch = self.tensors, self.backend.torch

        def call() -> None:
            self.backend.harness.launch(
                x=t["x"][i].data_ptr(), y=t["y"][i].data_ptr(), rows=self.rows, cols=self.cols,
                x_type=self.dtype, y_type=self.dtype, stream=torch.cuda.current_stream().cuda_stream,
                skip=t["skip"][i].data_ptr() if self.skip_op else None, scale=self.weight.data_ptr(),
                bias=self.bias.data_ptr() if self.bias is not None else None,
                sum_out=t["sum"][i].data_ptr() if self.skip_op else None, scale_size=self.cols,
                scale_type=self.dtype, rms=self.rms, device=self.backend.device.index, clusters=clusters,
            )  # fmt: skip

        return call

    def eager(self, i: int) -> Callable[[], None]:
        t, functional = self.tensors, self.backend.torch.nn.functional

        def call() -> None:
            h = t["x"][i] + t["skip"][i] if self.skip_op else t["x"][i]
            if self.rms:
                functional.rms_norm(h, (self.cols,), self.weight, 1e-5)
            else:
                functional.layer_norm(h, (self.cols,), self.weight, self.bias, 1e-5)

        return call

    def triton(self, triton_norm: Any, i: int) -> Callable[[], None]:
        t = self.tensors
        skip = t["skip"][i] if self.skip_op else None
        sum_out = t["sum"][i] if self.skip_op else None
        return lambda: triton_norm.norm(t["x"][i], skip, self.weight, self.bias, t["y"][i], sum_out, 1e-5, self.rms)

    def copy(self, i: int) -> Callable[[], None]:
        return lambda: self.tensors["dst"][i].copy_(self.tensors["src"][i])


def _bench_one(
    backend: TorchHarnessBackend, op: str, dtype: int, rows: int, cols: int, l2_bytes: int, use_graph: bool
) -> BenchRow:
    torch = backend.torch
    size = torch.tensor([], dtype=backend._torch_types[dtype]).element_size()
    per_call = bytes_moved(op, size, rows, cols)
    inputs = _BenchSet.make(backend, op, dtype, (rows, cols), per_call, l2_bytes)
    order = [i % inputs.sets for i in range(2 * inputs.sets)]

    def timed(make: Callable[[int], Callable[[], None]]) -> float:
        return time_calls(torch, [make(i) for i in order], use_graph)

    triton_norm = _load_triton()
    triton_us = None
    if triton_norm is not None and triton_norm.supports(cols, size):
        triton_us = timed(lambda i: inputs.triton(triton_norm, i))
    props = torch.cuda.get_device_properties(backend.device)
    optin = getattr(props, "shared_memory_per_block_optin", 227 * 1024)
    single_us = None
    if rows * 2 <= props.multi_processor_count or cols * size > optin:
        single_us = timed(lambda i: inputs.ours(i, clusters=False))
    mode = "graph" if use_graph else "events"
    return BenchRow(
        op, TYPE_NAMES[dtype], (rows, cols), per_call, timed(inputs.ours), timed(inputs.copy), timed(inputs.eager),
        triton_us, mode, single_us,
    )  # fmt: skip


def bench(
    backend: TorchHarnessBackend,
    shapes: Iterable[tuple[int, int]],
    dtypes: Iterable[int],
    use_graph: bool,
    deadline: float,
) -> tuple[list[BenchRow], int]:
    """The bandwidth rows, in order, until `deadline` (time.perf_counter()); also how many were left out."""
    torch = backend.torch
    l2_bytes = 2 * getattr(torch.cuda.get_device_properties(backend.device), "L2_cache_size", 64 << 20)
    plan = [(op, dtype, shape) for op in OPS for dtype in dtypes for shape in shapes]
    rows = []
    for op, dtype, (n_rows, cols) in plan:
        if time.perf_counter() > deadline:
            break
        try:
            rows.append(_bench_one(backend, op, dtype, n_rows, cols, l2_bytes, use_graph))
        except Exception as exc:  # one shape that cannot be timed (memory, a capture) does not end the table
            print(f"bench {op} {TYPE_NAMES[dtype]} {n_rows}x{cols}: {type(exc).__name__}: {exc}", flush=True)
            torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return rows, len(plan) - len(rows)


def format_table(header: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    """Right-aligned columns for the terminal, or a markdown table."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(widths[i]) for i, cell in enumerate(row)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- launch plan

PLAN_SHAPES = (
    (1, 4096), (64, 4096), (8192, 768), (8192, 4096), (32768, 1024), (4096, 16384), (2048, 32768),
    (1024, 65536), (256, 262144), (65536, 128),
)  # fmt: skip
H200_SMS = 132


def launch_plan(library: Path, shapes: Iterable[tuple[int, int]] = PLAN_SHAPES, sms: int = H200_SMS) -> list[list[str]]:
    """Rows of (op, dtype, shape, MB moved, kernel, vectors per thread, blocks per row (a cluster), threads per
    row in each block, block, grid, dynamic shared memory per block) as LaunchNorm chooses them for a GPU of `sms`
    SMs: the real launcher, run by the CPU emulator in plan-only mode (it reads no tensor). Loads a private copy
    of the emulator library, whose per-device attribute cache then holds `sms`."""
    private = Path(tempfile.mkdtemp(prefix="onnx_norm_plan_")) / "libonnx_norm_plan.so"
    shutil.copyfile(library, private)
    harness = Harness(private)
    harness._lib.onnx_norm_emulator_plan_only(ctypes.c_int(sms))
    harness._lib.onnx_norm_emulator_last_launch.restype = ctypes.c_char_p
    base = 1 << 32  # 256-byte aligned fake addresses, never read
    rows = []
    for op in OPS:
        for dtype in FLOAT_TYPES:
            size = 4 if dtype == F32 else 2
            for n_rows, cols in shapes:
                span = n_rows * cols * size + 4096
                skip_op = op.startswith("Skip")
                harness.launch(
                    x=base, y=base + 2 * span, rows=n_rows, cols=cols, x_type=dtype, y_type=dtype, stream=0,
                    skip=base + span if skip_op else None, sum_out=base + 3 * span if skip_op else None,
                    scale=base + 4 * span, bias=None if "RMS" in op else base + 5 * span, scale_size=cols,
                    scale_type=dtype, rms="RMS" in op, device=0,
                )  # fmt: skip
                kernel = harness.last_kernel() or "?"
                launch = dict(
                    item.split("=") for item in harness._lib.onnx_norm_emulator_last_launch().decode().split()
                )
                fields = dict(item.split("=") for item in kernel.split()[1:])
                smem = f"{int(launch['shared']) / 1024:.0f} KiB" if int(launch["shared"]) else "-"
                rows.append([
                    op, TYPE_NAMES[dtype], f"{n_rows}x{cols}", f"{bytes_moved(op, size, n_rows, cols) / 1e6:.2f}",
                    kernel.split()[0], fields.get("vpt", "-"), launch["cluster"], fields.get("group", launch["block"]),
                    launch["block"], launch["grid"], smem,
                ])  # fmt: skip
    return rows


PLAN_HEADER = [
    "op", "dtype", "shape", "MB moved", "kernel", "vectors/thread", "blocks/row", "threads/block/row", "block", "grid",
    "smem/block",
]  # fmt: skip


# --------------------------------------------------------------------------------------------- results


class Results:
    """What the run found, printed as it goes and, with --out, written as markdown and JSON files there."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.sections: list[tuple[str, str]] = []
        self.data: dict[str, Any] = {}
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.sections.append(("", line))

    def table(self, title: str, header: list[str], rows: list[list[str]], note: str = "") -> None:
        print(f"\n{title}\n{format_table(header, rows)}\n{note}", flush=True)
        self.sections.append((title, format_table(header, rows, markdown=True) + (f"\n\n{note}" if note else "")))
        self.data[title] = [dict(zip(header, row, strict=True)) for row in rows]

    def write(self) -> None:
        if self.out is None:
            return
        text = []
        for title, body in self.sections:
            text.append(f"\n## {title}\n\n{body}\n" if title else body)
        (self.out / "gpu_check.md").write_text("\n".join(text) + "\n")
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=1))


# --------------------------------------------------------------------------------------------- main


def _check_reference(cases: list[Case]) -> bool:
    """The checker itself: a fake backend that is the reference passes, and one nudged output element per case
    is caught."""
    names = [c.name() for c in cases]
    if len(set(names)) != len(names):
        print("FAIL duplicate case names")
        return False
    exact = Outcome()
    run_cases(FakeBackend(), cases, "fake", exact)
    if exact.failures:
        print(f"FAIL the reference does not match itself in {len(exact.failures)} cases")
        return False
    missed = 0
    for output in ("Y", "Sum", "Mean", "InvStdDev", "InvRMS"):
        subset = [c for c in cases if output in requested_outputs(c) and c.rows > 0]
        caught = Outcome(quiet=True)
        run_cases(FakeBackend(perturb=output), subset, f"nudged {output}", caught)
        caught_names = {f.split("] ", 1)[1].split(": ", 1)[0] for f in caught.failures}
        for case in subset:
            if case.name() not in caught_names:
                missed += 1
                print(f"FAIL a nudged {output} passed the check: {case.name()}")
    print(f"self-test: {len(cases)} cases; the exact fake passes; nudged outputs missed: {missed}")
    return not missed


def _check_through_ort(cases: list[Case]) -> bool:
    """A subset through ONNX Runtime's CPU provider with our library, and ours against ONNX Runtime's own CPU
    kernels; skipped (True) when the library is not built."""
    try:
        import onnx_norm

        library = Path(onnx_norm.get_library_path())
    except Exception as exc:  # not built or not installed
        print(f"self-test: the onnx_norm library is not available ({exc}); ONNX Runtime path not checked")
        return True
    if not library.is_file():
        return True
    subset = ort_cases(cases, limit=16)
    through_ort = Outcome()
    cpu = OrtBackend("CPUExecutionProvider")
    run_cases(cpu, subset, "ort-cpu", through_ort)
    print(
        f"self-test: {len(subset)} cases through ONNX Runtime (CPU provider, {library.name}): "
        f"{len(through_ort.failures)} failures, {cpu.profiles_checked} profiles read"
    )
    if through_ort.failures:
        return False
    compared = compare_with_ort_kernels("CPUExecutionProvider", ((8, 64),), (F32,), 3, math.inf)
    broken = [row for row in compared if any(cell.startswith("failed") for cell in row)]
    print(f"self-test: ours vs ONNX Runtime's kernels on the CPU provider: {len(compared)} rows, {len(broken)} failed")
    if broken or len(compared) != len(OPS):
        print(format_table(ORT_HEADER, compared))
        return False
    return True


def _run_emulated(backend: HostHarnessBackend, cases: list[Case], label: str) -> bool:
    started = time.perf_counter()
    outcome = Outcome()
    run_cases(backend, cases, label, outcome)
    print(
        f"self-test: {outcome.checked} cases {label}, {len(outcome.failures)} failures "
        f"({time.perf_counter() - started:.0f} s); kernels used: "
        + ", ".join(f"{k} x{n}" for k, n in sorted(backend.kernels.items()))
    )
    return not outcome.failures


def _check_emulated(cases: list[Case], cuda_include: Path, build_dir: Path | None) -> bool:
    """Every case through the CPU emulator of the kernels (device 0: clusters), then the cases of the other
    emulated devices (no clusters; a small device), then the launch plan."""
    out = build_dir or Path(tempfile.mkdtemp(prefix="onnx_norm_emulator_"))
    emulator = build_emulator(cuda_include, out)
    backend = HostHarnessBackend(Harness(emulator))
    if not _run_emulated(backend, cases, "through the CPU emulator of the kernels"):
        return False
    for device in (1, 2):
        other = HostHarnessBackend(backend.harness, device=device)
        if not _run_emulated(other, device_cases(device), f"on emulated device {device} ({EMULATED_DEVICES[device]})"):
            return False
    outcome = Outcome()
    print(f"self-test: {check_modulated(backend.harness, on_gpu=False, quick=True, outcome=outcome)}")
    if outcome.failures:
        return False
    plan = launch_plan(emulator)
    print(f"self-test: launch plan for an H200, {len(plan)} rows (python tools/gpu_check.py --plan)")
    return True


def self_test(nvcc: str | None, build_dir: Path | None, emulate: bool = True) -> int:
    """The parts that need no GPU: the case list, the reference comparisons (a fake backend that is the
    reference must pass; one nudged output element per case must be caught), every case through the CPU
    emulator of the kernels (tools/gpu_harness/emulator.cc), and the harness build with nvcc."""
    cases = build_cases(quick=False)
    if not _check_reference(cases) or not _check_through_ort(cases):
        return 1
    cuda_include = find_cuda_include(nvcc)
    if emulate and cuda_include is not None and shutil.which("g++"):
        if not _check_emulated(cases, cuda_include, build_dir):
            return 1
    elif emulate:
        print("self-test: no CUDA headers or g++, the kernels were not emulated")
    if nvcc is None:
        print("self-test: nvcc not found, harness build not checked")
    else:
        started = time.perf_counter()
        out = build_dir or Path(tempfile.mkdtemp(prefix="onnx_norm_harness_"))
        library = build_harness(nvcc, "90", out)
        print(f"self-test: built {library} in {time.perf_counter() - started:.0f} s")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer hidden sizes and layouts (about a minute)")
    parser.add_argument("--no-bench", action="store_true", help="skip the bandwidth table")
    parser.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime even where onnxruntime-gpu is there")
    parser.add_argument("--ort-only", action="store_true", help="only the ONNX Runtime parts (after installing it)")
    parser.add_argument("--nvcc", help="nvcc to build the harness with (default: PATH, CUDA_HOME, /usr/local/cuda)")
    parser.add_argument("--build-dir", type=Path, help="where to build the harness (default: a temporary folder)")
    parser.add_argument("--arch", help="compute capability to build for, e.g. 90 (default: the GPU's)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
        help="folder for gpu_check.md / gpu_check.json (default: $OUT when set, else none)",
    )
    parser.add_argument(
        "--budget", type=float, default=420.0, help="seconds after which the timing tables stop growing (default: 420)"
    )
    parser.add_argument("--self-test", action="store_true", help="check this script without a GPU, then exit")
    parser.add_argument("--no-emulate", action="store_true", help="--self-test without the CPU emulator of the kernels")
    parser.add_argument(
        "--plan", action="store_true", help="print the launch configuration per op x dtype x shape for an H200 (no GPU)"
    )
    return parser.parse_args(argv)


def print_plan(nvcc: str | None) -> int:
    cuda_include = find_cuda_include(nvcc)
    if cuda_include is None or not shutil.which("g++"):
        print("--plan needs the CUDA headers and g++ (it runs the launcher in the CPU emulator)")
        return 2
    library = build_emulator(cuda_include, Path(tempfile.mkdtemp(prefix="onnx_norm_emulator_")))
    print(format_table(PLAN_HEADER, launch_plan(library), markdown=True))
    return 0


def run_ort_parts(results: Results, outcome: Outcome, cases: list[Case], deadline: float) -> None:
    why_not = OrtBackend.available()
    if why_not:
        results.say(f"ONNX Runtime CUDA provider: not run ({why_not})")
        return
    ort_backend = OrtBackend()
    before = len(outcome.failures)
    subset = ort_cases(cases)
    run_cases(ort_backend, subset, "ort-cuda", outcome)
    results.say(
        f"ONNX Runtime CUDA provider: {len(subset)} cases, {len(outcome.failures) - before} failures, "
        f"{ort_backend.profiles_checked} profiles show the node on CUDAExecutionProvider"
    )
    rows = compare_with_ort_kernels("CUDAExecutionProvider", ORT_SHAPES, (F16, F32), 50, deadline)
    results.table("Ours vs ONNX Runtime's CUDA kernels", ORT_HEADER, rows, ORT_NOTE)


def environment_line(torch: Any) -> str:
    versions = [f"torch {torch.__version__} (CUDA {torch.version.cuda})"]
    for name in ("triton", "onnxruntime"):
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except Exception:  # not installed, or broken: just not listed
            versions.append(f"{name} -")
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    smi = subprocess.run(query, check=False, capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    driver = smi.stdout.strip() if smi is not None else "?"
    props = torch.cuda.get_device_properties(0)
    return (
        f"GPU: {props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs), driver {driver}, "
        + ", ".join(versions)
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nvcc = find_nvcc(args.nvcc)
    if args.self_test:
        return self_test(nvcc, args.build_dir, emulate=not args.no_emulate)
    if args.plan:
        return print_plan(nvcc)
    started = time.perf_counter()
    deadline = started + args.budget
    results = Results(args.out)
    try:
        import torch
    except ImportError:
        print("gpu_check needs torch with CUDA")
        return 2
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch: nothing checked")
        return 2
    results.say(environment_line(torch))
    outcome = Outcome()
    cases = build_cases(quick=args.quick)
    if args.ort_only:
        run_ort_parts(results, outcome, cases, deadline)
        return finish(results, outcome, started)
    if nvcc is None:
        print("nvcc not found (PATH, CUDACXX, CUDA_HOME, /usr/local/cuda): cannot build the harness")
        return 2
    major, minor = torch.cuda.get_device_capability(0)
    arch = args.arch or f"{major}{minor}"
    build_dir = args.build_dir or Path(tempfile.mkdtemp(prefix="onnx_norm_harness_"))
    try:
        library = build_harness(nvcc, arch, build_dir)
    except RuntimeError as exc:
        print(f"harness build failed:\n{exc}")
        return 2
    results.say(f"built {library.name} for sm_{arch} with {nvcc} in {time.perf_counter() - started:.0f} s")
    harness = Harness(library)
    backend = TorchHarnessBackend(harness)

    captured, capture_line = check_graph_capture(backend, outcome)
    results.say(capture_line)
    run_cases(backend, cases, "harness", outcome)
    results.say(check_modulated(harness, on_gpu=True, quick=args.quick, outcome=outcome))
    check_other_device(harness, outcome)
    results.say(
        f"kernels: {outcome.checked} checks over {len(cases)} cases (every op x dtype x shape, layouts, in-place), "
        f"{len(outcome.failures)} failures ({time.perf_counter() - started:.0f} s)"
    )
    if not args.no_bench:
        rows, left_out = bench(backend, BENCH_SHAPES, FLOAT_TYPES, captured, deadline)
        note = BENCH_NOTE + (
            f" {left_out} rows left out: the --budget of {args.budget:.0f} s ran out." if left_out else ""
        )
        results.table("Bandwidth", BENCH_HEADER, [r.cells() for r in rows], note)
    if not args.no_ort:
        run_ort_parts(results, outcome, cases, deadline + 120)
    return finish(results, outcome, started)


def finish(results: Results, outcome: Outcome, started: float) -> int:
    if outcome.failures:
        results.table("Failures", ["failure"], [[f] for f in outcome.failures[:200]])
    results.say(
        f"total {time.perf_counter() - started:.0f} s; "
        + (f"{len(outcome.failures)} FAILURES" if outcome.failures else "all checks passed")
    )
    results.write()
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
