"""Benchmark of the fused CPU ops against ONNX Runtime's own norm kernels and the decomposed graphs.

A benchmark, not a test: it prints one markdown table of median times, ratios and effective bandwidth.
Every variant runs in the same process on the same inputs, with the same thread count; runs are
interleaved round by round (variant A, B, C, A, B, C, ...) so that drift in the machine's load hits
all variants alike. Outputs are preallocated and bound (IO binding), so output allocation is not timed.

Variants per (shape, dtype, threads):
  LayerNorm: ours `onnx_norm.LayerNorm`; ONNX `LayerNormalization` (opset 17, ORT's MLAS kernel);
             the decomposed graph (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add) with
             graph optimizations off (ORT_ENABLE_ALL would fuse it into LayerNormalization).
  RMSNorm:   ours `onnx_norm.RMSNorm`; ORT's `SimplifiedLayerNormalization` (contrib op, ONNX domain);
             ONNX `RMSNormalization` (opset 23) where this ORT has it; the torch-style decomposed graph
             (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul) with ORT_ENABLE_ALL, which ORT does not fuse.

  SkipLayerNorm / SkipRMSNorm (residual add fused, Sum = X + S also written): ours; ORT's contrib
             `SkipLayerNormalization` / `SkipSimplifiedLayerNormalization`; Add followed by the
             decomposed graph as above.
  per-head LayerNorm (Cohere's QK-norm) where cols is a multiple of HEAD_DIM: X viewed as [rows, H, HEAD_DIM],
             normalised over HEAD_DIM: ours with a Scale and Bias per head [H, HEAD_DIM]; ours with one row
             [HEAD_DIM] at the same size (per-head should not be slower); `LayerNormalization` with ones and zeros
             then the per-head Mul and Add (what `--target onnx` writes; ORT_ENABLE_ALL).
  GatedRMSNorm (Mamba2's order, the whole row one group, Z the gate): ours; the SiLU gate (Sigmoid, Mul,
             Mul) then SimplifiedLayerNormalization; the graph torch exports (the gate, then the rsqrt-style RMSNorm),
             with ORT_ENABLE_ALL.
  GroupNorm(32) + SiLU on [N, C, H, W] (GROUP_SHAPES): ours; the graph torch's exporters write (Reshape,
             InstanceNormalization, Reshape, Mul, Add, Sigmoid, Mul); ONNX `GroupNormalization` (opset 21) then
             Sigmoid and Mul; the decomposed graph (Reshape, ReduceMean, Sub, Pow, ..., Div, Reshape, affine, SiLU);
             all with ORT_ENABLE_ALL (ORT's best for each).
  L2Norm:    ours `onnx_norm.L2Norm` (x-transformers' `normalize(x) * sqrt(d) * g`, the constants as one Scale); the
             graph both torch exporters write for F.normalize times the scale (ReduceL2, Clip, Expand, Div, Mul); the
             norm spelled out (Mul, ReduceSum, Sqrt, Max, Div, Mul); ONNX `LpNormalization` then Mul (no epsilon);
             all with ORT_ENABLE_ALL, which fuses none of them.

Ratios are "ours / theirs" in time: below 1.0 means ours is faster. GB/s counts X (and S) read, Y (and
Sum) written and Scale/Bias read once.

    python tools/bench_ops.py            # the full table (a few minutes)
    python tools/bench_ops.py --quick    # small shapes, few rounds
    python tools/bench_ops.py --shapes 128x64 --threads 1 --rounds 200   # a bundled model's tiny rows
    python tools/bench_ops.py --shapes 2x320x32x32 --rounds 31            # GroupNorm(32) + SiLU only
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from onnx_norm.dtypes import type_name
from onnx_norm.library import session_options
from onnx_norm.ops.gated_norm import GATED_RMS_NORM
from onnx_norm.ops.l2_norm import L2_NORM
from onnx_norm.ops.reference import np_dtype as numpy_dtype
from onnx_norm.ops.schema import (
    DOMAIN,
    LAYER_NORM,
    OPS,
    OPSET_VERSION,
    RMS_NORM,
    SKIP_LAYER_NORM,
    SKIP_RMS_NORM,
    OpSignature,
)

FULL_SHAPES = ((8192, 768), (8192, 4096), (32768, 1024))
QUICK_SHAPES = ((2048, 768), (1024, 4096))
DTYPES = {type_name(t): (t, numpy_dtype(t).type) for t in (TensorProto.FLOAT, TensorProto.FLOAT16)}
EPS = 1e-5


@dataclasses.dataclass
class Variant:
    family: str  # the name of our op it is compared with (a key of OPS)
    name: str
    model: onnx.ModelProto
    ours: bool = False
    opt_level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    table: str = ""  # the rows compared with each other ("ours / this"); default: the family's
    library: bool = False  # runs with the custom-op library although not the row the others are compared with

    @property
    def key(self) -> str:
        return self.table or self.family


def _model(
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
    elem: int,
    opset: int,
    skip: bool = False,
    dims: list[str | int] | None = None,
    gate: bool = False,
) -> onnx.ModelProto:
    """X (and S, the residual, for Skip variants, or Z, the gate, for the gated norm) in; Y (and Sum = X + S) out;
    of `dims` (default [rows, cols])."""
    names = ["X", "S"] if skip else ["X", "Z"] if gate else ["X"]
    outputs = ["Y", "Sum"] if skip else ["Y"]
    dims = dims or ["rows", "cols"]
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info(n, elem, dims) for n in names],
        [helper.make_tensor_value_info(n, elem, dims) for n in outputs],
        initializer=inits,
    )
    opsets = [
        helper.make_opsetid("", opset),
        helper.make_opsetid(DOMAIN, OPSET_VERSION),
        helper.make_opsetid("com.microsoft", 1),
    ]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(value, name)


_BENCH_NAMES = {"X": "X", "Skip": "S", "Z": "Z", "Scale": "scale", "Bias": "bias"}
_MS = "com.microsoft"
_DISABLE_ALL = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
_ENABLE_ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def _decomposed_ln(x: str) -> list[onnx.NodeProto]:
    mk = helper.make_node
    return [
        mk("ReduceMean", [x, "axes"], ["mean"]),
        mk("Sub", [x, "mean"], ["d"]),
        mk("Pow", ["d", "two"], ["d2"]),
        mk("ReduceMean", ["d2", "axes"], ["var"]),
        mk("Add", ["var", "eps"], ["ve"]),
        mk("Sqrt", ["ve"], ["std"]),
        mk("Div", ["d", "std"], ["n"]),
        mk("Mul", ["n", "scale"], ["ns"]),
        mk("Add", ["ns", "bias"], ["Y"]),
    ]


def _decomposed_rms(x: str) -> list[onnx.NodeProto]:
    mk = helper.make_node
    return [
        mk("Pow", [x, "two"], ["x2"]),
        mk("ReduceMean", ["x2", "axes"], ["ms"]),
        mk("Add", ["ms", "eps"], ["mse"]),
        mk("Sqrt", ["mse"], ["rms"]),
        mk("Reciprocal", ["rms"], ["inv"]),
        mk("Mul", [x, "inv"], ["n"]),
        mk("Mul", ["n", "scale"], ["Y"]),
    ]


def _l2_exported() -> list[onnx.NodeProto]:
    """F.normalize(X, dim=-1) * scale as torch's exporters write it (the expand_as form)."""
    mk = helper.make_node
    return [
        mk("ReduceL2", ["X", "axes"], ["norm"], keepdims=1),
        mk("Clip", ["norm", "eps", ""], ["clamped"]),
        mk("Shape", ["X"], ["xshape"]),
        mk("Expand", ["clamped", "xshape"], ["denominator"]),
        mk("Div", ["X", "denominator"], ["n"]),
        mk("Mul", ["n", "scale"], ["Y"]),
    ]


def _l2_spelled_out() -> list[onnx.NodeProto]:
    mk = helper.make_node
    return [
        mk("Mul", ["X", "X"], ["x2"]),
        mk("ReduceSum", ["x2", "axes"], ["sum"], keepdims=1),
        mk("Sqrt", ["sum"], ["norm"]),
        mk("Max", ["norm", "eps"], ["clamped"]),
        mk("Div", ["X", "clamped"], ["n"]),
        mk("Mul", ["n", "scale"], ["Y"]),
    ]


def _gated_rms(x: str, z: str) -> list[onnx.NodeProto]:
    """Mamba2's gated RMSNorm as torch exports it in float32: the SiLU gate on X, then the rsqrt-style RMSNorm."""
    mk = helper.make_node
    return [mk("Sigmoid", [z], ["zs"]), mk("Mul", [z, "zs"], ["silu"]), mk("Mul", [x, "silu"], ["v"])]


def _ours(op: OpSignature) -> list[onnx.NodeProto]:
    """Our op on the bench's tensors, its inputs and outputs in the order of its signature (Y, and Sum)."""
    outputs = [name if name in ("Y", "Sum") else "" for name in op.outputs]
    while outputs and not outputs[-1]:
        outputs.pop()
    inputs = [_BENCH_NAMES[name] for name in op.inputs]
    return [helper.make_node(op.name, inputs, outputs, domain=DOMAIN, epsilon=EPS)]


def _native(op_type: str, inputs: list[str], domain: str | None = None) -> list[onnx.NodeProto]:
    """One native norm node; ORT's Skip ops return Sum as their fourth output."""
    outputs = ["Y", "", "", "Sum"] if op_type.startswith("Skip") else ["Y"]
    return [helper.make_node(op_type, inputs, outputs, domain=domain, epsilon=EPS)]


#: (the op a row stands for, its label, its nodes, the initializers they read, opset, ORT optimization level or
#: ORT optimization level). The rows of one op run against each other; ours comes first.
_RESIDUAL = helper.make_node("Add", ["X", "S"], ["Sum"])
_ROWS = (
    (LAYER_NORM, None, _ours(LAYER_NORM), ("scale", "bias"), 17, _ENABLE_ALL),
    (LAYER_NORM, "LayerNormalization (opset 17)", _native("LayerNormalization", ["X", "scale", "bias"]),
     ("scale", "bias"), 17, _ENABLE_ALL),
    (LAYER_NORM, "decomposed, ORT_DISABLE_ALL", _decomposed_ln("X"), ("scale", "bias", "axes", "eps", "two"), 18,
     _DISABLE_ALL),
    (RMS_NORM, None, _ours(RMS_NORM), ("scale",), 17, _ENABLE_ALL),
    (RMS_NORM, "SimplifiedLayerNormalization (ORT contrib)", _native("SimplifiedLayerNormalization", ["X", "scale"]),
     ("scale",), 17, _ENABLE_ALL),
    (RMS_NORM, "RMSNormalization (opset 23)", _native("RMSNormalization", ["X", "scale"]), ("scale",), 23, _ENABLE_ALL),
    (RMS_NORM, "decomposed rsqrt-style, ORT_ENABLE_ALL", _decomposed_rms("X"), ("scale", "axes", "eps", "two", "one"),
     18, _ENABLE_ALL),
    (SKIP_LAYER_NORM, None, _ours(SKIP_LAYER_NORM), ("scale", "bias"), 17, _ENABLE_ALL),
    (SKIP_LAYER_NORM, "SkipLayerNormalization (ORT contrib)",
     _native("SkipLayerNormalization", ["X", "S", "scale", "bias"], _MS), ("scale", "bias"), 17, _ENABLE_ALL),
    (SKIP_LAYER_NORM, "Add + decomposed, ORT_DISABLE_ALL", [_RESIDUAL, *_decomposed_ln("Sum")],
     ("scale", "bias", "axes", "eps", "two"), 18, _DISABLE_ALL),
    (SKIP_RMS_NORM, None, _ours(SKIP_RMS_NORM), ("scale",), 17, _ENABLE_ALL),
    (SKIP_RMS_NORM, "SkipSimplifiedLayerNormalization (ORT contrib)",
     _native("SkipSimplifiedLayerNormalization", ["X", "S", "scale"], _MS), ("scale",), 17, _ENABLE_ALL),
    (SKIP_RMS_NORM, "Add + decomposed rsqrt-style, ORT_ENABLE_ALL", [_RESIDUAL, *_decomposed_rms("Sum")],
     ("scale", "axes", "eps", "two"), 18, _ENABLE_ALL),
    (L2_NORM, None, _ours(L2_NORM), ("scale",), 17, _ENABLE_ALL),
    (L2_NORM, "F.normalize * g as exported (ReduceL2, Clip, Expand, Div, Mul)", _l2_exported(),
     ("scale", "axes", "eps"), 18, _ENABLE_ALL),
    (L2_NORM, "spelled out (Mul, ReduceSum, Sqrt, Max, Div, Mul)", _l2_spelled_out(), ("scale", "axes", "eps"), 18,
     _ENABLE_ALL),
    (L2_NORM, "LpNormalization + Mul (no epsilon)",
     [helper.make_node("LpNormalization", ["X"], ["n"], axis=-1, p=2), helper.make_node("Mul", ["n", "scale"], ["Y"])],
     ("scale",), 17, _ENABLE_ALL),
    (GATED_RMS_NORM, None, _ours(GATED_RMS_NORM), ("scale",), 17, _ENABLE_ALL),
    (GATED_RMS_NORM, "Sigmoid/Mul gate + SimplifiedLayerNormalization",
     [*_gated_rms("X", "Z"), *_native("SimplifiedLayerNormalization", ["v", "scale"])], ("scale",), 17, _ENABLE_ALL),
    (GATED_RMS_NORM, "the exported graph (gate + rsqrt-style), ORT_ENABLE_ALL",
     [*_gated_rms("X", "Z"), *_decomposed_rms("v")], ("scale", "axes", "eps", "two"), 18, _ENABLE_ALL),
)  # fmt: skip


GROUP_SHAPES = ((2, 320, 32, 32), (1, 128, 128, 128))  # an SD UNet block's GroupNorm(32), a VAE decoder's
QUICK_GROUP_SHAPES = ((1, 64, 32, 32),)
GROUPS = 32


def _group_norm_tail(n: str) -> list[onnx.NodeProto]:
    """The grouped norm `n` back in X's shape, the per-channel affine and SiLU, as torch exports them."""
    mk = helper.make_node
    return [
        mk("Shape", ["X"], ["xshape"]),
        mk("Reshape", [n, "xshape"], ["back"]),
        mk("Mul", ["back", "gamma"], ["ns"]),
        mk("Add", ["ns", "beta"], ["af"]),
        mk("Sigmoid", ["af"], ["sg"]),
        mk("Mul", ["af", "sg"], ["Y"]),
    ]


def _group_rows() -> list[tuple[str | None, list[onnx.NodeProto], tuple[str, ...], int]]:
    """(label or None for ours, nodes, initializers, opset) of GroupNorm(32) + SiLU; ORT_ENABLE_ALL for all."""
    mk = helper.make_node
    split = mk("Reshape", ["X", "split"], ["g"])
    decomposed = [split, *_decomposed_ln("g")[:7], *_group_norm_tail("n")]
    instance = [split, mk("InstanceNormalization", ["g", "ones", "zeros"], ["n"], epsilon=EPS), *_group_norm_tail("n")]
    native = [
        mk("GroupNormalization", ["X", "scale", "bias"], ["gn"], epsilon=EPS, num_groups=GROUPS),
        mk("Sigmoid", ["gn"], ["sg"]),
        mk("Mul", ["gn", "sg"], ["Y"]),
    ]
    ours = mk("GroupNorm", ["X", "scale", "bias"], ["Y"], domain=DOMAIN, epsilon=EPS, num_groups=GROUPS, activation=1)
    return [
        (None, [ours], ("scale", "bias"), 21),
        ("InstanceNormalization route (TorchScript/dynamo export)", instance, ("split", "ones", "zeros", "gamma",
         "beta"), 18),
        ("GroupNormalization-21 + Sigmoid/Mul", native, ("scale", "bias"), 21),
        ("decomposed (ReduceMean, Pow, Sqrt, Div)", decomposed, ("split", "axes", "eps", "two", "gamma", "beta"), 18),
    ]  # fmt: skip


def build_group_variants(channels: int, elem: int, np_dtype: type) -> list[Variant]:
    rng = np.random.default_rng(0)
    scale = (1 + 0.1 * rng.standard_normal(channels)).astype(np_dtype)
    bias = (0.1 * rng.standard_normal(channels)).astype(np_dtype)
    consts = {
        "scale": _const("scale", scale),
        "bias": _const("bias", bias),
        "gamma": _const("gamma", scale.reshape(channels, 1, 1)),
        "beta": _const("beta", bias.reshape(channels, 1, 1)),
        "split": _const("split", np.array([0, GROUPS, -1], np.int64)),
        "axes": _const("axes", np.array([-1], np.int64)),
        "eps": _const("eps", np.array(EPS, np_dtype)),
        "two": _const("two", np.array(2.0, np_dtype)),
        "ones": _const("ones", np.ones(GROUPS, np_dtype)),
        "zeros": _const("zeros", np.zeros(GROUPS, np_dtype)),
    }
    variants = []
    for label, nodes, inits, opset in _group_rows():
        dims: list[str | int] = ["n", channels, "h", "w"]
        model = _model(nodes, [consts[name] for name in inits], elem, opset, dims=dims)
        variants.append(Variant("GroupNorm", label or "onnx_norm.GroupNorm (SiLU)", model, ours=label is None))
    return variants


#: Per-head LayerNorm (Cohere's QK-norm): X [rows, cols] viewed as [rows, H, D] (Reshapes, which ONNX Runtime runs
#: without a copy), normalised over D = head_dim, with a Scale and Bias per head [H, D]; against our LayerNorm with
#: one [D] row at the same size, and what `--target onnx` writes (the scale-free native op, then Mul and Add).
HEAD_DIM = 128
_PER_HEAD = "per-head LayerNorm"


def _viewed(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` (X_heads -> Y_heads) between the Reshapes that view X as heads and Y back as rows."""
    mk = helper.make_node
    return [mk("Reshape", ["X", "heads_shape"], ["X_heads"]), *nodes, mk("Reshape", ["Y_heads", "flat_shape"], ["Y"])]


def _per_head_rows() -> list[tuple[str, list[onnx.NodeProto], tuple[str, ...], bool, bool]]:
    """(label, nodes, initializers, ours, with the library) of the per-head table."""
    mk = helper.make_node
    ln = functools.partial(mk, "LayerNorm", domain=DOMAIN, epsilon=EPS)
    native = [
        mk("LayerNormalization", ["X_heads", "ones_row", "zeros_row"], ["n"], epsilon=EPS),
        mk("Mul", ["n", "scale_heads"], ["ns"]),
        mk("Add", ["ns", "bias_heads"], ["Y_heads"]),
    ]
    shapes = ("heads_shape", "flat_shape")
    return [
        (f"onnx_norm.LayerNorm, Scale/Bias [H, {HEAD_DIM}]", _viewed([ln(["X_heads", "scale_heads", "bias_heads"],
         ["Y_heads"])]), ("scale_heads", "bias_heads", *shapes), True, True),
        (f"onnx_norm.LayerNorm, one row [{HEAD_DIM}]", _viewed([ln(["X_heads", "scale_row", "bias_row"], ["Y_heads"])]),
         ("scale_row", "bias_row", *shapes), False, True),
        ("LayerNormalization + Mul + Add (--target onnx)", _viewed(native),
         ("ones_row", "zeros_row", "scale_heads", "bias_heads", *shapes), False, False),
    ]  # fmt: skip


def build_per_head_variants(cols: int, elem: int, np_dtype: type) -> list[Variant]:
    """The per-head table for rows of `cols` = H * HEAD_DIM values (none when cols is not a multiple of it)."""
    if cols % HEAD_DIM:
        return []
    heads = cols // HEAD_DIM
    rng = np.random.default_rng(2)
    consts = {
        "scale_heads": (1 + 0.1 * rng.standard_normal((heads, HEAD_DIM))).astype(np_dtype),
        "bias_heads": (0.1 * rng.standard_normal((heads, HEAD_DIM))).astype(np_dtype),
        "scale_row": (1 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np_dtype),
        "bias_row": (0.1 * rng.standard_normal(HEAD_DIM)).astype(np_dtype),
        "ones_row": np.ones(HEAD_DIM, np_dtype),
        "zeros_row": np.zeros(HEAD_DIM, np_dtype),
        "heads_shape": np.array([0, heads, HEAD_DIM], np.int64),
        "flat_shape": np.array([0, cols], np.int64),
    }
    variants = []
    for label, nodes, inits, ours, library in _per_head_rows():
        model = _model(nodes, [_const(name, consts[name]) for name in inits], elem, 17)
        variants.append(Variant(LAYER_NORM.name, label, model, ours=ours, table=_PER_HEAD, library=library))
    return variants


def build_variants(cols: int, elem: int, np_dtype: type) -> list[Variant]:
    rng = np.random.default_rng(0)
    consts = {
        "scale": _const("scale", (1 + 0.1 * rng.standard_normal(cols)).astype(np_dtype)),
        "bias": _const("bias", (0.1 * rng.standard_normal(cols)).astype(np_dtype)),
        "axes": _const("axes", np.array([-1], np.int64)),
        "eps": _const("eps", np.array(EPS, np_dtype)),
        "two": _const("two", np.array(2.0, np_dtype)),
        "one": _const("one", np.array(1.0, np_dtype)),
    }
    variants = []
    for op, label, nodes, inits, opset, level in _ROWS:
        model = _model(nodes, [consts[name] for name in inits], elem, opset, skip=op.skip, gate="Z" in op.inputs)
        ours = label is None
        name = f"onnx_norm.{op.name}" if ours else label
        variants.append(Variant(op.name, name, model, ours=ours, opt_level=level))
    return variants + build_per_head_variants(cols, elem, np_dtype)


def make_session(variant: Variant, threads: int) -> ort.InferenceSession:
    options = session_options() if variant.ours or variant.library else ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = variant.opt_level
    # No spin-waiting: idle pool threads of one session must not steal the CPU from the next variant.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(variant.model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def make_runner(session: ort.InferenceSession, x: np.ndarray, residual: np.ndarray) -> Callable[[], None]:
    binding = session.io_binding()
    input_names = {i.name for i in session.get_inputs()}
    binding.bind_cpu_input("X", x)
    for name in ("S", "Z"):  # the residual or the gate
        if name in input_names:
            binding.bind_cpu_input(name, residual)
    outputs = {o.name: np.empty_like(x) for o in session.get_outputs()}
    for name, buffer in outputs.items():
        binding.bind_output(name, "cpu", 0, buffer.dtype, list(buffer.shape), buffer.ctypes.data)
    run_options = ort.RunOptions()

    def run() -> None:
        # `outputs` is referenced here so that the bound buffers live as long as the runner.
        session.run_with_iobinding(binding, run_options)
        assert all(buffer.shape == x.shape for buffer in outputs.values())

    return run


def bench_case(
    shape: tuple[int, ...], dtype: str, threads: int, rounds: int, warmup: int
) -> list[tuple[Variant, float | None, str]]:
    """Every variant of `shape`'s table (the norms' for [rows, cols], GroupNorm's for [N, C, H, W]), timed."""
    elem, np_dtype = DTYPES[dtype]
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np_dtype)
    residual = rng.standard_normal(shape).astype(np_dtype)
    variants = (
        build_variants(shape[1], elem, np_dtype)
        if len(shape) == 2
        else build_group_variants(*shape[1:2], elem, np_dtype)
    )
    runners: list[tuple[Variant, Callable[[], None] | None, str]] = []
    for variant in variants:
        try:
            runner = make_runner(make_session(variant, threads), x, residual)
            runner()
        except Exception as err:  # an ORT build without this op/type: report, keep benchmarking the rest
            runners.append((variant, None, str(err).splitlines()[0][:80]))
            continue
        runners.append((variant, runner, ""))
    times: dict[str, list[float]] = {v.name: [] for v, r, _ in runners if r}
    for round_index in range(warmup + rounds):
        for variant, runner, _ in runners:
            if runner is None:
                continue
            start = time.perf_counter()
            runner()
            elapsed = time.perf_counter() - start
            if round_index >= warmup:
                times[variant.name].append(elapsed)
    return [(v, statistics.median(times[v.name]) if r else None, note) for v, r, note in runners]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes and few rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per variant (default 15, quick 5)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="intra-op thread counts")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument(
        "--shapes",
        nargs="+",
        metavar="SHAPE",
        help="shapes to run instead of the defaults: ROWSxCOLS for the norms (128x64), NxCxHxW for GroupNorm",
    )
    parser.add_argument("--no-group-norm", action="store_true", help="leave out the default GroupNorm cases")
    args = parser.parse_args(argv)
    shapes: tuple[tuple[int, ...], ...] = QUICK_SHAPES if args.quick else FULL_SHAPES
    if not args.no_group_norm:
        shapes += QUICK_GROUP_SHAPES if args.quick else GROUP_SHAPES
    if args.shapes:
        try:
            shapes = tuple(tuple(int(n) for n in text.lower().split("x")) for text in args.shapes)
        except ValueError:
            parser.error(f"--shapes takes ROWSxCOLS or NxCxHxW, e.g. 128x64; got {' '.join(args.shapes)}")
        if any(len(shape) not in (2, 4) or min(shape) < 1 for shape in shapes):
            parser.error(f"--shapes takes ROWSxCOLS or NxCxHxW with positive sizes; got {' '.join(args.shapes)}")
        if any(len(shape) == 4 and shape[1] % GROUPS for shape in shapes):
            parser.error(f"a GroupNorm shape NxCxHxW needs C divisible by {GROUPS}")
    rounds = args.rounds or (5 if args.quick else 15)
    warmup = 2

    print(f"onnxruntime {ort.__version__}, CPU, median of {rounds} interleaved rounds after {warmup} warm-up rounds\n")
    print("| shape | dtype | threads | variant | median ms | GB/s | ours / this |")
    print("|---|---|---|---|---|---|---|")
    for shape in shapes:
        for dtype in args.dtypes:
            for threads in args.threads:
                _print_rows(shape, dtype, threads, bench_case(shape, dtype, threads, rounds, warmup))
                sys.stdout.flush()
    return 0


def _print_rows(shape: tuple[int, ...], dtype: str, threads: int, results) -> None:
    """One case's table rows; GB/s counts X read and Y written (and S, Sum), and the parameters once."""
    elem_size = np.dtype(DTYPES[dtype][1]).itemsize
    ours = {v.key: t for v, t, _ in results if v.ours and t}
    elements, channels = int(np.prod(shape)), shape[1]
    for variant, seconds, note in results:
        label = f"| {list(shape)} | {dtype} | {threads} | {variant.name} |"
        if seconds is None:
            print(f"{label} n/a | | {note} |")
            continue
        op = OPS[variant.family]
        params = len(op.optional_inputs)  # Scale (and Bias)
        tensors = 4 if op.skip else 3 if "Z" in op.inputs else 2  # X (+ S or Z) read, Y (+ Sum) written
        traffic = (tensors * elements + params * channels) * elem_size
        ratio = "" if variant.ours else f"{ours[variant.key] / seconds:.2f}" if variant.key in ours else ""
        print(f"{label} {seconds * 1e3:.2f} | {traffic / seconds / 1e9:.1f} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
