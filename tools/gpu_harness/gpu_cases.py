"""The cases of tools/gpu_check.py (op x type x shape x layout), their inputs, the reference outputs and the
comparison with tolerances."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    # Runs from a checkout without `pip install`: the reference and schema are plain Python. The other gpu_*
    # modules import this one first, so the path is set for them too.
    sys.path.insert(0, str(REPO))

from onnx import TensorProto  # noqa: E402

from onnx_norm.dtypes import type_name  # noqa: E402
from onnx_norm.ops import reference  # noqa: E402
from onnx_norm.ops.norms import NORM_OPS  # noqa: E402
from onnx_norm.ops.reference import np_dtype  # noqa: E402
from onnx_norm.ops.schema import OPS as SIGNATURES  # noqa: E402
from onnx_norm.ops.schema import NormOpAttributes  # noqa: E402

T = TypeVar("T")
F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
TYPE_NAMES = {t: type_name(t) for t in (0, F32, F16, BF16)}  # the spellings of onnx_norm.dtypes
FLOAT_TYPES = (F32, F16, BF16)
# The LayerNorm/RMSNorm ops and their Skip forms. The row ops go through the same launcher and harness entry; their
# cases are their own check modules' (`row_op_checks.CHECKS`), run through row_op_checks.py's runners, from
# gpu_check.py too (check_row_ops).
OPS = tuple(op.name for op in NORM_OPS)
HIDDEN_SIZES = (1, 7, 127, 768, 4097, 16384)
# The GPU-run issue's goals: >= 95% of copy bandwidth at [8192, 4096] and [32768, 1024] (Skip ops), >= 85% from 16K
# to 64K hidden, [1, 4096] RMSNorm in <= 2 us.
BENCH_SHAPES = (
    (1, 4096), (64, 4096), (8192, 768), (8192, 4096), (32768, 1024), (4096, 16384), (2048, 32768), (1024, 65536),
    (256, 262144),
)  # fmt: skip
# The shapes the goals name, in the order they are timed when the GPU run's minutes are short (`by_priority`):
# bandwidth at [8192, 4096] and [32768, 1024] (with the Skip ops), [1, 4096] decode, then hidden 16K-64K.
GOAL_SHAPES = ((8192, 4096), (32768, 1024), (1, 4096), (4096, 16384), (2048, 32768), (1024, 65536))
_TYPE_RANK = {F16: 0, BF16: 1, F32: 2}  # the goals are about 16-bit models; float32 last
GUARD = 64  # elements of sentinel before and after every output
SOURCES = REPO / "custom_ops" / "src" / "cuda"
HARNESS = REPO / "tools" / "gpu_harness" / "harness.cu"


def by_priority(plan: Iterable[tuple[str, int, tuple[int, int]]]) -> list[tuple[str, int, tuple[int, int]]]:
    """`plan`'s (op, X type, shape) rows in the order a timing table measures them under a deadline: the goal
    shapes in 16-bit types, then the other shapes in 16-bit types, then float32 (goal shapes first again); shape
    by shape, each with every op, so that a cut leaves out shapes, never a whole op."""
    items = list(plan)
    shapes = list(dict.fromkeys([*GOAL_SHAPES, *(shape for _, _, shape in items)]))

    def rank(index: int) -> tuple[bool, bool, int, int, int]:
        _, dtype, shape = items[index]
        type_rank = _TYPE_RANK.get(dtype, len(_TYPE_RANK))
        return (type_rank >= _TYPE_RANK[F32], shape not in GOAL_SHAPES, shapes.index(shape), type_rank, index)

    return [items[i] for i in sorted(range(len(items)), key=rank)]


def measure_by_priority(
    plan: list[tuple[str, int, tuple[int, int]]], deadline: float, measure: Callable[..., T | None]
) -> list[T]:
    """`measure(op, dtype, shape)` for `plan`'s rows in `by_priority` order until `deadline` (time.perf_counter()),
    returned in `plan`'s order; a row it answers None for (it could not be measured) is left out."""
    measured = {}
    for item in by_priority(plan):
        if time.perf_counter() > deadline:
            break
        measured[item] = measure(*item)
    return [row for item in plan if (row := measured.get(item)) is not None]


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
    epsilon_outside: bool = False  # 1 / (sqrt(var) + epsilon): the norms' own attribute
    outputs: bool = True  # Mean/InvStdDev (LayerNorm), InvRMS (RMSNorm) or Sum (Skip ops)
    data: str = "normal"  # normal | offset | constant | nonfinite | overflow16
    # contiguous | shifted (one common element offset) | misaligned (mixed offsets) | sum-on-x / sum-on-skip
    # (Skip ops: the Sum output bound onto the X or Skip buffer, in-place)
    layout: str = "contiguous"
    clusters: bool = True  # False: LaunchNorm may not split a row over a thread-block cluster

    @property
    def rms(self) -> bool:
        return SIGNATURES[self.op].rms

    @property
    def skip(self) -> bool:
        return SIGNATURES[self.op].skip

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

    @property
    def scale_groups(self) -> int:
        """Rows of a per-row-group Scale (its dims before the normalised ones, docs/ops.md); 1 for one row."""
        shape = list(self.param_shape())
        k = len(self.shape) - self.axis % len(self.shape)
        while len(shape) > k and shape[0] == 1:
            shape.pop(0)
        return math.prod(shape[: max(len(shape) - k, 0)])

    def attrs(self) -> dict[str, Any]:
        return {
            "axis": self.axis,
            "epsilon": self.epsilon,
            "normalized_type": self.normalized_type,
            "multiply_type": self.multiply_type,
            "output_type": self.output_type,
            **({"epsilon_outside": 1} if self.epsilon_outside else {}),
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
        if self.epsilon_outside:
            parts.append("eps-outside")
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
            # Per-head / per-group Scale and Bias [H, D] over [B, S, H, D] (Cohere's QK-norm, Falcon-H1's grouped
            # RMSNorm): vector and scalar rows.
            cases.append(_default_case(op, x_type, (2, 3, 4, 64), scale_shape=(4, 64)))
            cases.append(_default_case(op, x_type, (2, 3, 2, 5, 7), axis=-2, scale_shape=(2, 5, 7)))
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
        # epsilon added to the std (the Annotated Transformer's LayerNorm) on the register, shared and cluster paths.
        for x_type, shape in ((F32, (37, 768)), (F16, (9, 4097)), (BF16, (2, 20000)), (F32, (1, 50000))):
            cases.append(_default_case(op, x_type, shape, epsilon=0.1, epsilon_outside=True))
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
            usable = layout if layout not in IN_PLACE or SIGNATURES[op].skip else "contiguous"
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


def reference_outputs(case: Case, inputs: Inputs, *, rounded_sum: bool = True) -> dict[str, np.ndarray]:
    """Outputs of the op record's numpy reference, keyed like the backends' results; statistics flattened to [rows].
    `rounded_sum`: the Skip ops normalise Sum rounded to X's type (the CUDA kernels, as ONNX Runtime's CUDA Add
    rounds), else the float32 sum (the CPU kernels, as ONNX Runtime's CPU provider runs the Add in float32)."""
    record = SIGNATURES[case.op]
    given = {"X": inputs.x, "Skip": inputs.skip, "Scale": inputs.scale, "Bias": inputs.bias}
    options = {"rounded_sum": rounded_sum} if record.skip else {}
    results = record.reference(*(given[name] for name in record.inputs), **options, **case.attrs())
    flat = ("Y", "Sum")  # X's shape; the others are per row
    return {n: v if n in flat else v.reshape(-1) for n, v in zip(record.outputs, results, strict=True)}


def requested_outputs(case: Case) -> tuple[str, ...]:
    return SIGNATURES[case.op].outputs if case.outputs else ("Y",)


# --------------------------------------------------------------------------------------------- comparison

_EPS = {F32: 2.0**-23, F16: 2.0**-10, BF16: 2.0**-7}


def _spread(x: np.ndarray) -> float:
    finite = x[np.isfinite(x.astype(np.float32))].astype(np.float64)
    return float(np.max(np.abs(finite))) if finite.size else 1.0


def _row_inverse(case: Case, inputs: Inputs, want: dict[str, np.ndarray]) -> np.ndarray:
    """The reference's 1/std (1/rms) per row, keepdims (broadcasts over X's shape)."""
    effective = want["Sum"] if case.skip else inputs.x
    _, inv, _ = reference.normalize(effective, None, None, NormOpAttributes(**case.attrs()), rms=case.rms)
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


def check_case(case: Case, inputs: Inputs, got: dict[str, np.ndarray], *, rounded_sum: bool = True) -> list[str]:
    """Mismatch messages for one case's outputs (empty when all match); `rounded_sum` as in reference_outputs."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        want = reference_outputs(case, inputs, rounded_sum=rounded_sum)
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
