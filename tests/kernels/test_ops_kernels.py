"""The CPU kernels of the custom-op library, through ONNX Runtime, against the numpy reference.

Semantics: docs/ops.md. Each model holds one fused node with untyped-shape inputs, so one session per
(op, types, attributes) serves every shape; sessions are cached to keep the run fast.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnx_norm.library import session_options
from onnx_norm.ops import norms, reference
from onnx_norm.ops.schema import DOMAIN, OPS, OPSET_VERSION

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
FLOAT_TYPES = (F32, F16, BF16)
# What a failing node raises from InferenceSession.run (ONNX Runtime's Python exception classes).
# Errors at kernel creation (attributes) come as RuntimeException, from a running node as InvalidArgument.
OrtError = (
    ort.capi.onnxruntime_pybind11_state.Fail,
    ort.capi.onnxruntime_pybind11_state.InvalidArgument,
    ort.capi.onnxruntime_pybind11_state.RuntimeException,
)
HIDDEN_SIZES = (1, 7, 127, 768, 4097, 16384)
# The statistics/Skip ops; the modulated (adaLN) ops have their own tests (tests/kernels/test_adaln_ops.py).
NORM_OPS = sorted(op.name for op in norms.NORM_OPS)
TYPE_NAMES = {F32: "fp32", F16: "fp16", BF16: "bf16", TensorProto.DOUBLE: "fp64", TensorProto.INT32: "i32"}

# Relative and absolute tolerance on Y per output type: the kernels hold float32 statistics, the
# reference float64, so Y may differ by about one unit in the last place of the output type (two where
# a rounding attribute adds an intermediate rounding that can land on the other side of a tie).
Y_TOLERANCE = {F32: (2e-5, 2e-5), F16: (2e-3, 2e-3), BF16: (1.6e-2, 1.6e-2)}
STATS_TOLERANCE = (2e-5, 1e-6)


def np_type(elem_type: int) -> np.dtype:
    return reference.np_dtype(elem_type)


def build_model(
    op: str,
    input_types: Sequence[int | None],
    outputs: Sequence[bool],
    attrs: dict[str, float | int],
    input_shapes: Sequence[Sequence[int | str] | None] | None = None,
) -> onnx.ModelProto:
    """One `op` node; input_types[i] None leaves input i out (empty name), outputs[i] False omits output i.

    Inputs have no shape unless input_shapes says so: one session then serves every shape of a test.
    """
    sig = OPS[op]
    shapes = list(input_shapes) if input_shapes is not None else [None] * len(sig.inputs)
    in_names = [name if t is not None else "" for name, t in zip(sig.inputs, input_types, strict=True)]
    while in_names and not in_names[-1]:
        in_names.pop()
    out_names = [name if wanted else "" for name, wanted in zip(sig.outputs, outputs, strict=False)]
    while out_names and not out_names[-1]:
        out_names.pop()
    node = helper.make_node(op, in_names, out_names, domain=DOMAIN, **attrs)
    graph = helper.make_graph(
        [node],
        op,
        [
            helper.make_tensor_value_info(n, t, shape)
            for n, t, shape in zip(sig.inputs, input_types, shapes, strict=True)
            if t is not None
        ],
        # Untyped graph outputs: ORT's own type inference for the node decides, and the test checks it.
        [onnx.ValueInfoProto(name=n) for n in out_names if n],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


@functools.cache
def make_session(
    op: str,
    input_types: tuple[int | None, ...],
    outputs: tuple[bool, ...],
    attrs: tuple[tuple[str, float | int], ...],
    input_shapes: tuple[tuple[int | str, ...] | None, ...] | None = None,
) -> ort.InferenceSession:
    model = build_model(op, input_types, outputs, dict(attrs), input_shapes)
    options = session_options()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_op(
    op: str,
    arrays: Sequence[np.ndarray | None],
    outputs: Sequence[bool] | None = None,
    shaped: bool = False,
    **attrs: float | int,
) -> list[np.ndarray | None]:
    """Runs `op` on arrays (None = input left out); returns one entry per declared output (None if omitted).

    shaped: declare the inputs' ranks in the model (leading dims symbolic), so that the op's shape
    inference runs.
    """
    sig = OPS[op]
    arrays = list(arrays) + [None] * (len(sig.inputs) - len(arrays))
    if outputs is None:
        outputs = [True] * len(sig.outputs)
    input_types = tuple(None if a is None else reference.elem_type(a.dtype) for a in arrays)
    input_shapes = None
    if shaped:
        input_shapes = tuple(
            None if a is None else (*(f"d{i}" for i in range(a.ndim - 1)), a.shape[-1]) for a in arrays
        )
    session = make_session(op, input_types, tuple(outputs), tuple(sorted(attrs.items())), input_shapes)
    feeds = {name: to_ort_value(a) for name, a in zip(sig.inputs, arrays, strict=True) if a is not None}
    names = [o.name for o in session.get_outputs()]
    results = iter(from_ort_value(v) for v in session.run_with_ort_values(names, feeds))
    return [next(results) if wanted else None for wanted in outputs]


def to_ort_value(array: np.ndarray) -> ort.OrtValue:
    # ORT's numpy conversion does not know ml_dtypes.bfloat16: pass the bits with the ONNX type.
    array = np.ascontiguousarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), BF16)
    return ort.OrtValue.ortvalue_from_numpy(array)


def from_ort_value(value: ort.OrtValue) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    shape = tuple(value.shape())
    size = value.tensor_size_in_bytes()
    raw = ctypes.string_at(value.data_ptr(), size) if size else b""
    return np.frombuffer(raw, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(shape).copy()


def reference_outputs(op: str, arrays: Sequence[np.ndarray | None], **attrs: float | int) -> tuple[np.ndarray, ...]:
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf rows are part of the tests
        return reference.REFERENCES[op](*arrays, **attrs)


def random_array(shape: Sequence[int], elem_type: int, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    # A non-zero mean, so that LayerNorm's centring matters.
    values = rng.standard_normal(shape) * scale + 0.5 * scale
    return values.astype(np.float32).astype(np_type(elem_type))


def assert_close(actual: np.ndarray, expected: np.ndarray, elem_type: int, what: str) -> None:
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, expected {expected.shape}"
    rtol, atol = Y_TOLERANCE[elem_type]
    np.testing.assert_allclose(
        actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True, err_msg=what
    )


def make_inputs(
    op: str,
    shape: Sequence[int],
    axis: int,
    x_type: int,
    scale_type: int | None,
    rng: np.random.Generator,
    *,
    scale_shape: Sequence[int] | None = None,
    with_bias: bool = True,
) -> list[np.ndarray | None]:
    sig = OPS[op]
    x = random_array(shape, x_type, rng)
    norm_shape = tuple(shape[axis:]) if scale_shape is None else tuple(scale_shape)
    arrays: list[np.ndarray | None] = [x]
    if sig.skip:
        arrays.append(random_array(shape, x_type, rng))
    scale = None if scale_type is None else random_array(norm_shape, scale_type, rng)
    arrays.append(scale)
    if not sig.rms:
        bias = random_array(norm_shape, scale_type or F32, rng) if with_bias else None
        arrays.append(bias)
    return arrays


def check_op(op: str, arrays: Sequence[np.ndarray | None], shaped: bool = False, **attrs: float | int) -> None:
    sig = OPS[op]
    actual = run_op(op, arrays, shaped=shaped, **attrs)
    expected = reference_outputs(op, arrays, **attrs)
    y_type = attrs.get("output_type") or reference.elem_type(arrays[0].dtype)
    # Y is only as precise as the narrowest type it was rounded to on the way.
    precision = [y_type, attrs.get("normalized_type", 0), attrs.get("multiply_type", 0)]
    tolerance_type = max((t for t in precision if t), key=lambda t: Y_TOLERANCE[t][0])
    # The reference returns the outputs in the op's output order.
    assert len(expected) == len(sig.outputs)
    for name, got, want in zip(sig.outputs, actual, expected, strict=True):
        if name == "Y":
            assert_close(got, want, tolerance_type, f"{op} {name}")
        elif name == "Sum":
            # The float32 X + Skip rounded to X's type: exactly the reference.
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32), err_msg=f"{op} Sum")
        else:
            assert got.dtype == np.float32
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=STATS_TOLERANCE[0], atol=STATS_TOLERANCE[1], err_msg=name)


# --- every op x X type x Scale type x hidden size --------------------------------------------------


@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
@pytest.mark.parametrize(
    ("x_type", "scale_type"),
    list(itertools.product(FLOAT_TYPES, FLOAT_TYPES)),
    ids=lambda t: TYPE_NAMES[t],
)
@pytest.mark.parametrize("op", NORM_OPS)
def test_matches_reference(op: str, x_type: int, scale_type: int, hidden: int) -> None:
    rng = np.random.default_rng(hidden * 31 + x_type * 7 + scale_type)
    arrays = make_inputs(op, (3, hidden), -1, x_type, scale_type, rng)
    check_op(op, arrays, epsilon=1e-5)


@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize("x_type", [F32, BF16], ids=lambda t: TYPE_NAMES[t])
def test_many_rows_split_over_threads(op: str, x_type: int) -> None:
    # Enough rows for several blocks of work on ORT's intra-op pool (the sessions have 2 threads);
    # every row distinct so that a block written to the wrong place shows.
    rng = np.random.default_rng(20)
    arrays = make_inputs(op, (301, 1000), -1, x_type, F16, rng)
    arrays[0] = (arrays[0].astype(np.float32) * np.arange(1, 302, dtype=np.float32)[:, None]).astype(arrays[0].dtype)
    check_op(op, arrays)


@pytest.mark.parametrize("op", NORM_OPS)
def test_outputs_larger_than_the_caches(op: str) -> None:
    # 2049 x 4097 float32 is over the 32 MB above which Y and Sum are written with non-temporal stores;
    # the odd row length puts every row at a different 16-byte alignment.
    rng = np.random.default_rng(41)
    arrays = make_inputs(op, (2049, 4097), -1, F32, F32, rng)
    check_op(op, arrays, epsilon=1e-5)


@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize(
    ("shape", "axis", "scale_shape"),
    [
        ((2, 3, 4, 8), -2, None),  # normalise [4, 8]
        ((2, 3, 4, 8), 1, None),  # normalise [3, 4, 8]
        ((2, 3, 4, 8), 0, None),  # the whole tensor is one row
        ((2, 3, 4, 8), -3, (8,)),  # Scale broadcast over the leading normalised dims
        ((2, 3, 4, 8), 2, (1, 1, 4, 8)),  # leading 1s in Scale
        ((5, 6), 1, (1,)),  # one Scale value for the whole row
        ((2, 3, 4, 8), -1, (4, 8)),  # one Scale row per head (Cohere's QK-norm)
        ((2, 3, 4, 8), -1, (1, 4, 8)),  # per head, with a leading 1
        ((2, 3, 4, 8), -1, (3, 4, 8)),  # two row-group dims
        ((2, 3, 4, 8), -2, (3, 4, 8)),  # per row group over two normalised dims
        ((2, 3, 2, 7), -1, (2, 7)),  # odd rows: the scalar paths
    ],
)
@pytest.mark.parametrize("x_type", [F32, F16], ids=lambda t: TYPE_NAMES[t])
def test_axes_and_broadcast(
    op: str, shape: tuple[int, ...], axis: int, scale_shape: tuple[int, ...] | None, x_type: int
) -> None:
    rng = np.random.default_rng(len(shape) * 100 + axis)
    arrays = make_inputs(op, shape, axis, x_type, F32, rng, scale_shape=scale_shape)
    check_op(op, arrays, axis=axis, epsilon=1e-6)


# --- rounding attributes -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize(
    ("x_type", "scale_type", "normalized_type", "multiply_type"),
    [
        (F16, F16, F16, F16),  # LLaMA-style: round before and after the weight multiply
        (BF16, BF16, BF16, BF16),
        (F16, F32, F16, 0),  # round the normalised value only
        (F32, F16, 0, F16),  # T5-style multiply in the weight's type
        (F32, F32, BF16, F16),
    ],
    ids=lambda t: TYPE_NAMES.get(t, "none"),
)
@pytest.mark.parametrize("hidden", [7, 768, 4097])
def test_rounding_attributes(
    op: str, x_type: int, scale_type: int, normalized_type: int, multiply_type: int, hidden: int
) -> None:
    rng = np.random.default_rng(hidden + normalized_type + 3 * multiply_type)
    arrays = make_inputs(op, (4, hidden), -1, x_type, scale_type, rng)
    check_op(op, arrays, normalized_type=normalized_type, multiply_type=multiply_type)


def test_rounding_points_are_applied() -> None:
    """normalized_type/multiply_type change the result in the way the reference says, not only nearby."""
    rng = np.random.default_rng(7)
    x = random_array((64, 768), F32, rng)
    scale = random_array((768,), F32, rng, scale=3.0)
    plain = run_op("RMSNorm", [x, scale])[0]
    rounded = run_op("RMSNorm", [x, scale], normalized_type=F16, multiply_type=F16)[0]
    expected = reference.rms_norm(x, scale, normalized_type=F16, multiply_type=F16)[0]
    assert not np.array_equal(plain, rounded)
    # Rounding to fp16 twice: every value must be an fp16 value.
    np.testing.assert_array_equal(rounded, rounded.astype(np.float16).astype(np.float32))
    mismatched = np.count_nonzero(rounded != expected)
    assert mismatched <= x.size // 1000, f"{mismatched} of {x.size} values differ from the reference"


@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize(
    ("x_type", "output_type"),
    [(F16, F32), (BF16, F32), (F32, F16), (F32, BF16), (F16, BF16), (BF16, BF16)],
    ids=lambda t: TYPE_NAMES[t],
)
def test_output_type(op: str, x_type: int, output_type: int) -> None:
    # With X's rank in the model, the op's shape inference gives ORT Y's type from output_type. An output_type equal
    # to X's is checked with bfloat16: a float16 X runs in float32 between ONNX Runtime's Casts on the CPU, which
    # then types Y float32 against an explicit output_type=FLOAT16 (docs/ops.md; the rewrite writes 0 there).
    rng = np.random.default_rng(3)
    arrays = make_inputs(op, (4, 768), -1, x_type, F32, rng)
    check_op(op, arrays, shaped=True, output_type=output_type)


def test_float16_nodes_run_in_float32_between_the_cpu_providers_casts() -> None:
    """The library registers no float16 X on the CPU (register.cc): ONNX Runtime runs a float16 node in float32
    between Casts of its own and removes those between float32-running neighbours, so two norms in a row pass the
    first one's Y unrounded, as the original graph's ops run on the CPU. With float16 CPU kernels that Y was
    rounded to float16 (docs/accuracy.md, 2.) and 36% of the outputs differed from the once-rounded result."""
    rng = np.random.default_rng(21)
    a, b, c = (rng.standard_normal((64, 256)).astype(np.float16) for _ in range(3))
    scales = [(rng.random(256) + 0.5).astype(np.float16) for _ in range(2)]
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("RMSNorm", ["s", "scale0"], ["y0"], domain=DOMAIN, epsilon=1e-6),
        helper.make_node("RMSNorm", ["y0", "scale1"], ["y1"], domain=DOMAIN, epsilon=1e-6),
        helper.make_node("Add", ["y1", "c"], ["z"]),
    ]
    inputs = [helper.make_tensor_value_info(n, F16, [64, 256]) for n in ("a", "b", "c")]
    inits = [onnx.numpy_helper.from_array(w, f"scale{i}") for i, w in enumerate(scales)]
    output = helper.make_tensor_value_info("z", F16, [64, 256])
    graph = helper.make_graph(nodes, "fp16_chain", inputs, [output], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    (z,) = session.run(None, {"a": a, "b": b, "c": c})
    y = a.astype(np.float64) + b
    for scale in scales:
        y = y / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + 1e-6) * scale
    once = (y + c).astype(np.float16)
    mismatched = np.count_nonzero(z != once)
    assert mismatched <= z.size // 100, f"{mismatched} of {z.size} values are not the once-rounded result"


def test_output_type_with_unknown_rank_is_a_clear_error() -> None:
    # Without X's rank, ORT types Y like X and the kernel must not silently write another type. bfloat16: the CPU
    # kernel runs in X's type for it (a float16 X runs in float32 between ONNX Runtime's Casts, Y cast back).
    rng = np.random.default_rng(4)
    x = random_array((4, 16), BF16, rng)
    with pytest.raises(OrtError, match="output_type=FLOAT but ONNX Runtime typed Y as BFLOAT16"):
        run_op("RMSNorm", [x, None], output_type=F32)
    assert run_op("RMSNorm", [x, None], output_type=BF16)[0].dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize(
    ("op", "x_shape", "axis", "inputs", "outputs", "expected"),
    [
        (
            "LayerNorm",
            ["batch", 5, 8],
            1,
            (F16, None, F32),  # Bias without Scale
            (True, True, True),
            [
                ("tensor(float16)", ["batch", 5, 8]),
                ("tensor(float)", ["batch", 1, 1]),
                ("tensor(float)", ["batch", 1, 1]),
            ],
        ),
        (
            "LayerNorm",
            ["batch", 5, 8],
            -1,
            (F32, F32, None),
            (True, False, True),
            [("tensor(float)", ["batch", 5, 8]), ("tensor(float)", ["batch", 5, 1])],
        ),
        (
            "RMSNorm",
            [2, "seq", 8],
            -1,
            (BF16, F16),
            (True, True),
            [("tensor(bfloat16)", [2, "seq", 8]), ("tensor(float)", [2, "seq", 1])],
        ),
        (
            "SkipRMSNorm",
            ["b", "s", 8],
            -1,
            (F16, F16, F32),
            (True, True),
            [("tensor(float16)", ["b", "s", 8]), ("tensor(float16)", ["b", "s", 8])],
        ),
    ],
)
def test_shape_inference(
    op: str,
    x_shape: list[int | str],
    axis: int,
    inputs: tuple[int | None, ...],
    outputs: tuple[bool, ...],
    expected: list[tuple[str, list[int | str]]],
) -> None:
    sig = OPS[op]
    norm_shape = tuple(x_shape[axis:])
    shapes = [x_shape if name in {"X", "Skip"} else norm_shape for name in sig.inputs]
    session = make_session(op, inputs, outputs, (("axis", axis),), tuple(map(tuple, shapes)))
    assert [(o.type, o.shape) for o in session.get_outputs()] == expected


@pytest.mark.parametrize(
    "level", [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]
)
def test_unnamed_dims_stay_unknown(level: ort.GraphOptimizationLevel) -> None:
    # X's dims are unknown to shape inference (a Reshape to a runtime shape). Had the op's inference declared
    # them as -1, ONNX Runtime would fold Shape(Y) into the constant [-1, -1, -1] and the Reshape below would
    # fail ("multiple -1"), or its memory planner would share buffers between tensors of different sizes.
    nodes = [
        helper.make_node("Reshape", ["x", "target"], ["xr"]),
        helper.make_node("LayerNorm", ["xr", "scale"], ["y"], domain=DOMAIN, axis=-1),
        helper.make_node("Shape", ["y"], ["y_shape"]),
        helper.make_node("Reshape", ["y", "y_shape"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "unnamed_dims",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("target", TensorProto.INT64, [3]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [helper.make_tensor("scale", TensorProto.FLOAT, [4], np.linspace(0.5, 2.0, 4, dtype=np.float32))],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, OPSET_VERSION)], ir_version=10
    )
    options = session_options()
    options.graph_optimization_level = level
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).standard_normal(24).astype(np.float32)
    (z,) = session.run(None, {"x": x, "target": np.array([2, 3, 4], np.int64)})
    expected, _, _ = reference.layer_norm(x.reshape(2, 3, 4), np.linspace(0.5, 2.0, 4, dtype=np.float32))
    np.testing.assert_allclose(z, expected, rtol=1e-5, atol=1e-6)


# --- special values ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize("x_type", FLOAT_TYPES, ids=lambda t: TYPE_NAMES[t])
def test_zero_variance_rows(op: str, x_type: int) -> None:
    rng = np.random.default_rng(5)
    arrays = make_inputs(op, (3, 768), -1, x_type, F32, rng)
    x = arrays[0]
    x[0, :] = 0
    x[1, :] = 2.5
    if OPS[op].skip:
        arrays[1][:2, :] = 0
    check_op(op, arrays, epsilon=1e-5)
    y = run_op(op, arrays, epsilon=1e-5)[0].astype(np.float32)
    assert np.isfinite(y).all()
    if not OPS[op].rms:
        # A constant row normalises to 0, leaving Bias.
        np.testing.assert_allclose(y[1], arrays[-1].astype(np.float32), rtol=0, atol=Y_TOLERANCE[x_type][1])


@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize("x_type", [F16, BF16], ids=lambda t: TYPE_NAMES[t])
def test_values_that_overflow_fp16_squares(op: str, x_type: int) -> None:
    """x^2 of |x| ~ 1e3..6e4 overflows fp16 in a decomposed fp16 graph; the kernel accumulates in fp32."""
    rng = np.random.default_rng(6)
    shape = (4, 4097)
    magnitude = np.exp(rng.uniform(np.log(1e3), np.log(6e4), size=shape))
    x = (magnitude * rng.choice([-1.0, 1.0], size=shape)).astype(np_type(x_type))
    arrays: list[np.ndarray | None] = [x]
    if OPS[op].skip:
        arrays.append((x.astype(np.float32) * -0.25).astype(np_type(x_type)))
    arrays.append(random_array((4097,), F32, rng))
    if not OPS[op].rms:
        arrays.append(random_array((4097,), F32, rng))
    # fp16 x*x overflows: the decomposed graph would give inf (LayerNorm variance) or 0 (RMS) here.
    with np.errstate(over="ignore"):
        assert not np.isfinite(x.astype(np.float16) * x.astype(np.float16)).all()
    check_op(op, arrays, epsilon=1e-5)
    assert np.isfinite(run_op(op, arrays)[0].astype(np.float32)).all()


@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize("x_type", FLOAT_TYPES, ids=lambda t: TYPE_NAMES[t])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_propagate_to_their_row_only(op: str, x_type: int, bad: float) -> None:
    rng = np.random.default_rng(8)
    arrays = make_inputs(op, (4, 127), -1, x_type, F32, rng)
    arrays[0][1, 5] = bad
    check_op(op, arrays)  # equal_nan: NaN exactly where the reference has NaN
    y = run_op(op, arrays)[0].astype(np.float32)
    assert not np.isfinite(y[1]).all()
    assert np.isfinite(y[[0, 2, 3]]).all()


@pytest.mark.parametrize("op", NORM_OPS)
def test_empty_batch(op: str) -> None:
    rng = np.random.default_rng(9)
    arrays = make_inputs(op, (0, 768), -1, F16, F32, rng)
    outputs = run_op(op, arrays)
    assert outputs[0].shape == (0, 768)
    assert outputs[0].dtype == np.float16
    for out in outputs[1:]:
        assert out.shape in {(0, 1), (0, 768)}


# --- optional inputs and outputs ------------------------------------------------------------------------


@pytest.mark.parametrize("op", NORM_OPS)
def test_optional_outputs_can_be_left_out(op: str) -> None:
    rng = np.random.default_rng(10)
    arrays = make_inputs(op, (5, 96), -1, F32, F32, rng)
    expected = reference_outputs(op, arrays)
    n_outputs = len(OPS[op].outputs)
    for wanted in itertools.product([True, False], repeat=n_outputs - 1):
        outputs = (True, *wanted)
        got = run_op(op, arrays, outputs=outputs)
        for i, flag in enumerate(outputs):
            if flag:
                np.testing.assert_allclose(got[i], expected[i], rtol=2e-5, atol=2e-5)
            else:
                assert got[i] is None


@pytest.mark.parametrize("op", ["LayerNorm", "SkipLayerNorm"])
def test_bias_without_scale(op: str) -> None:
    rng = np.random.default_rng(11)
    arrays = make_inputs(op, (3, 40), -1, F16, None, rng)
    assert arrays[-2] is None
    assert arrays[-1] is not None
    check_op(op, arrays)


@pytest.mark.parametrize("op", NORM_OPS)
def test_without_scale_or_bias(op: str) -> None:
    rng = np.random.default_rng(12)
    arrays = make_inputs(op, (3, 40), -1, BF16, None, rng, with_bias=False)
    check_op(op, arrays)


def test_statistics_shape_and_values() -> None:
    rng = np.random.default_rng(13)
    x = random_array((2, 3, 4, 5), F16, rng)
    _, mean, inv = run_op("LayerNorm", [x, None, None], axis=2)
    assert mean.shape == inv.shape == (2, 3, 1, 1)
    xf = x.astype(np.float64).reshape(6, 20)
    np.testing.assert_allclose(mean.reshape(-1), xf.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inv.reshape(-1), 1 / np.sqrt(xf.var(axis=1) + 1e-5), rtol=1e-5)


def test_ort_types_outputs_like_x_and_stats_as_float() -> None:
    rng = np.random.default_rng(14)
    arrays = make_inputs("LayerNorm", (2, 8), -1, BF16, F16, rng)
    session = make_session("LayerNorm", (BF16, F16, F16), (True, True, True), ())
    assert [o.type for o in session.get_outputs()] == ["tensor(bfloat16)", "tensor(float)", "tensor(float)"]
    y = run_op("LayerNorm", arrays)[0]
    assert y.dtype == ml_dtypes.bfloat16


# --- bad input -------------------------------------------------------------------------------------------


def _run_expecting_error(op: str, arrays: Sequence[np.ndarray | None], match: str, **attrs: float | int) -> None:
    with pytest.raises(OrtError, match=match):
        run_op(op, arrays, **attrs)


@pytest.mark.parametrize("op", NORM_OPS)
def test_scale_of_the_wrong_size(op: str) -> None:
    rng = np.random.default_rng(15)
    arrays = make_inputs(op, (2, 16), -1, F32, F32, rng, scale_shape=(15,))
    _run_expecting_error(op, arrays, r"onnx_norm .*Scale has shape \[15\] but must match the normalised dims \[16\]")


def test_scale_broadcast_inside_the_row_is_rejected() -> None:
    rng = np.random.default_rng(16)
    x = random_array((2, 4, 8), F32, rng)
    scale = random_array((4, 1), F32, rng)
    _run_expecting_error("RMSNorm", [x, scale], r"Scale has shape \[4, 1\]", axis=1)


@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize("x_type", [F32, BF16], ids=lambda t: TYPE_NAMES[t])
def test_per_head_scale_over_many_rows_split_over_threads(op: str, x_type: int) -> None:
    """A [H, D] Scale over [B, S, H, D]: row r reads Scale row r mod H, across the blocks the rows are split into."""
    rng = np.random.default_rng(21)
    arrays = make_inputs(op, (7, 43, 4, 128), -1, x_type, x_type, rng, scale_shape=(4, 128))
    check_op(op, arrays)


@pytest.mark.parametrize(
    ("scale_shape", "message"),
    [
        ((2, 8), r"Scale has shape \[2, 8\] but must match the normalised dims \[8\].*one row per row group"),
        ((3, 1, 8), r"Scale has shape \[3, 1, 8\]"),  # broadcast over the heads, varying along the sequence
        ((5, 3, 4, 8), r"Scale has shape \[5, 3, 4, 8\]"),  # more dims than X
    ],
)
def test_per_row_group_scale_that_is_not_x_s_dims_is_rejected(scale_shape: tuple[int, ...], message: str) -> None:
    rng = np.random.default_rng(22)
    x = random_array((2, 3, 4, 8), F32, rng)
    _run_expecting_error("RMSNorm", [x, random_array(scale_shape, F32, rng)], message)


def test_bias_of_another_row_group_count_than_scale() -> None:
    rng = np.random.default_rng(23)
    x = random_array((2, 3, 4, 8), F32, rng)
    scale, bias = random_array((4, 8), F32, rng), random_array((8,), F32, rng)
    _run_expecting_error("LayerNorm", [x, scale, bias], "Bias has 8 elements but Scale has 32")


def test_bias_of_another_size_than_scale() -> None:
    rng = np.random.default_rng(17)
    x = random_array((2, 4, 8), F32, rng)
    _run_expecting_error(
        "LayerNorm",
        [x, random_array((4, 8), F32, rng), random_array((8,), F32, rng)],
        "Bias has 8 elements but Scale has 32",
        axis=1,
    )


@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize("axis", [2, -3, 5])
def test_axis_out_of_range(op: str, axis: int) -> None:
    rng = np.random.default_rng(18)
    arrays = make_inputs(op, (2, 16), -1, F32, None, rng, with_bias=False)
    _run_expecting_error(op, arrays, rf"axis {axis} is out of range for X of rank 2", axis=axis)


@pytest.mark.parametrize("x_dtype", [np.float64, np.int32])
def test_unsupported_x_type(x_dtype: type) -> None:
    x = np.ones((2, 16), dtype=x_dtype)
    _run_expecting_error("RMSNorm", [x, None], r"X has element type (DOUBLE|INT32); supported types are FLOAT")


def test_unsupported_scale_type() -> None:
    # Scale types are declared per op instance, so ORT itself finds no kernel for a double Scale.
    x = np.ones((2, 16), dtype=np.float32)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidGraph, match=r"'tensor\(double\)' of input .*Scale"):
        run_op("RMSNorm", [x, np.ones(16, np.float64)])


@pytest.mark.parametrize("op", ["SkipLayerNorm", "SkipRMSNorm"])
def test_skip_of_another_shape_or_type(op: str) -> None:
    rng = np.random.default_rng(19)
    # bfloat16: on the CPU a float16 X and Skip reach the kernel as float32 (ONNX Runtime's Casts)
    arrays = make_inputs(op, (2, 16), -1, BF16, F32, rng)
    shape_mismatch = [arrays[0], arrays[1][:, :8].copy(), *arrays[2:]]
    _run_expecting_error(op, shape_mismatch, r"Skip must have the type and shape of X: Skip is BFLOAT16\[2, 8\]")
    type_mismatch = [arrays[0], arrays[1].astype(np.float32), *arrays[2:]]
    _run_expecting_error(op, type_mismatch, r"Skip must have the type and shape of X: Skip is FLOAT\[2, 16\]")


def test_row_without_elements() -> None:
    x = np.ones((3, 0), dtype=np.float32)
    _run_expecting_error("RMSNorm", [x, None], "have no elements")


def test_bad_attributes() -> None:
    x = np.ones((2, 16), dtype=np.float32)
    _run_expecting_error("RMSNorm", [x, None], "attribute normalized_type=7 is not supported", normalized_type=7)
    _run_expecting_error("LayerNorm", [x, None, None], "epsilon must be a finite number >= 0", epsilon=-1.0)


def test_missing_required_input_is_rejected() -> None:
    model = build_model("SkipRMSNorm", (F32, F32, None), (True, False), {})
    # Drop Skip from the node: ORT refuses the model at load (the kernels would also check).
    model.graph.node[0].input[1] = ""
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidGraph, match=r"input 1 is marked single"):
        ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])


# --- the portable conversions -----------------------------------------------------------------------------


def test_portable_conversions_match_reference() -> None:
    """With ONNX_NORM_CPU_SIMD=0 the kernels use the portable fp16/bf16 conversions instead of F16C/AVX2."""
    env = dict(os.environ, ONNX_NORM_CPU_SIMD="0")
    selection = (
        "test_matches_reference and 4097 and (fp16 or bf16) or test_rounding_attributes and 4097 "
        "or test_nan_and_inf and RMSNorm or test_many_rows"
    )
    # One process: the selection takes seconds, and the root conftest would otherwise start pytest-xdist workers.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", __file__, "-k", selection],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def _simd_agreement_outputs() -> dict[str, np.ndarray]:
    """Outputs of every op for fp16/bf16/fp32 rows (sizes with and without vector tails), without and with the
    rounding attributes (the Cast-wrapped fp16/bf16 norms take their own vector path), bf16 as bits."""
    results = {}
    roundings = ((0, 0), (F16, F16), (BF16, BF16), (BF16, F16))
    for op, x_type, hidden, (nt, mt) in itertools.product(NORM_OPS, FLOAT_TYPES, (7, 768, 1000), roundings):
        rng = np.random.default_rng(hidden + x_type)
        arrays = make_inputs(op, (5, hidden), -1, x_type, F32, rng)
        for i, out in enumerate(run_op(op, arrays, normalized_type=nt, multiply_type=mt)):
            key = f"{op}-{x_type}-{hidden}-{nt}-{mt}-{i}"
            results[key] = out.view(np.uint16) if out.dtype == ml_dtypes.bfloat16 else out
    return results


def test_simd_and_portable_paths_agree_bit_for_bit(tmp_path: Path) -> None:
    # The fused F16C/AVX2 row kernels sum in the same lane order and round the same way as the
    # portable code, so the two must produce identical bits, statistics included.
    out = tmp_path / "portable.npz"
    script = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[2]); import test_ops_kernels as t; "
        "np.savez(sys.argv[1], **t._simd_agreement_outputs())"
    )
    env = dict(os.environ, ONNX_NORM_CPU_SIMD="0")
    subprocess.run([sys.executable, "-c", script, str(out), str(Path(__file__).parent)], env=env, check=True)
    portable = np.load(out)
    simd = _simd_agreement_outputs()
    assert set(portable.files) == set(simd)
    for name, values in simd.items():
        np.testing.assert_array_equal(values, portable[name], err_msg=name)


# --- in-place reuse -------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["SkipLayerNorm", "SkipRMSNorm"])
@pytest.mark.parametrize("x_type", FLOAT_TYPES, ids=lambda t: TYPE_NAMES[t])
@pytest.mark.parametrize("hidden", [7, 768])
def test_skip_ops_over_buffers_ort_may_reuse(op: str, x_type: int, hidden: int) -> None:
    """X and Skip computed in the graph and read by nothing else, so ORT may write Sum over X and Y over Skip
    (the CPU Skip ops declare both); two ops chained like a residual stream, against the reference."""
    sig = OPS[op]
    rng = np.random.default_rng(hidden + x_type)
    x, skip, *params = make_inputs(op, (6, hidden), -1, x_type, x_type, rng)
    names = ["scale", "bias"][: len(params)]
    inits = [
        helper.make_tensor(n, x_type, a.shape, a.view(np.uint16).tobytes() if x_type == BF16 else a.tobytes(), raw=True)
        for n, a in zip(names, params, strict=True)
    ]
    # X and Skip made by an exact op ORT will not remove: Neg, or for bf16 (no CPU Neg) a widening-back Cast.
    in_type = F32 if x_type == BF16 else x_type
    make = [helper.make_node("Cast", [f"{n}_in"], [n], to=BF16) for n in ("x", "s")]
    if x_type != BF16:
        make = [helper.make_node("Neg", [f"{n}_in"], [n]) for n in ("x", "s")]
    nodes = [
        *make,
        helper.make_node(op, ["x", "s", *names], ["y1", "sum1"], domain=DOMAIN, epsilon=1e-5),
        helper.make_node(op, ["sum1", "y1", *names], ["y2", "sum2"], domain=DOMAIN, epsilon=1e-5),
    ]
    inputs = [helper.make_tensor_value_info(n, in_type, [6, hidden]) for n in ("x_in", "s_in")]
    outputs = [helper.make_tensor_value_info(n, x_type, [6, hidden]) for n in ("y2", "sum2")]
    graph = helper.make_graph(nodes, "chain", inputs, outputs, inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, OPSET_VERSION)], ir_version=9
    )
    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    if x_type == BF16:
        feeds = {"x_in": to_ort_value(x.astype(np.float32)), "s_in": to_ort_value(skip.astype(np.float32))}
    else:
        feeds = {"x_in": to_ort_value(-x), "s_in": to_ort_value(-skip)}
    y2, sum2 = (from_ort_value(v) for v in session.run_with_ort_values(["y2", "sum2"], feeds))
    assert len(sig.outputs) == 2
    y1_ref, sum1_ref = reference_outputs(op, [x, skip, *params], epsilon=1e-5)
    y2_ref, sum2_ref = reference_outputs(op, [sum1_ref, y1_ref, *params], epsilon=1e-5)
    assert_close(sum2, sum2_ref, x_type, f"{op} Sum of the second op")
    assert_close(y2, y2_ref, x_type, f"{op} Y of the second op")


def _ort_skip_layer_norm(x: np.ndarray, skip: np.ndarray) -> np.ndarray:
    """ONNX Runtime's own CPU SkipLayerNormalization (contrib) on fp16 X and Skip, unit gamma, zero beta."""
    node = helper.make_node("SkipLayerNormalization", ["x", "s", "g", "b"], ["y"], domain="com.microsoft", epsilon=1e-5)
    shape = list(x.shape)
    inputs = [helper.make_tensor_value_info(n, F16, shape) for n in ("x", "s")]
    inputs += [helper.make_tensor_value_info(n, F16, shape[-1:]) for n in ("g", "b")]
    graph = helper.make_graph([node], "ort_skip", inputs, [helper.make_tensor_value_info("y", F16, shape)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    params = {"g": np.ones(shape[-1:], np.float16), "b": np.zeros(shape[-1:], np.float16)}
    return session.run(None, {"x": x, "s": skip, **params})[0]


@pytest.mark.parametrize("x_type", [F16, BF16])
@pytest.mark.parametrize("hidden", [4, 40])  # the scalar tail only, and the 8-wide loop with a tail
@pytest.mark.parametrize("op", ["SkipLayerNorm", "SkipRMSNorm"])
def test_skip_ops_normalise_the_float32_sum_and_round_only_sum(op: str, x_type: int, hidden: int) -> None:
    """X = 1024 with Skip 0.5 in one column: X + Skip rounds back to 1024 in fp16 (and bf16), so a kernel that
    normalised the rounded Sum would give a LayerNorm of zeros. Sum is rounded; Y is the norm of the float32 sum,
    as ONNX Runtime's CPU provider computes the original's fp16 residual Add and its own SkipLayerNormalization."""
    dtype = reference.np_dtype(x_type)
    x = np.full((3, hidden), 1024.0, np.float32).astype(dtype)
    skip = np.zeros((3, hidden), np.float32)
    skip[:, 1] = 0.5
    skip = skip.astype(dtype)
    y, total = run_op(op, [x, skip])
    np.testing.assert_array_equal(total.astype(np.float32), x.astype(np.float32))
    want = reference_outputs(op, [x, skip])[0]
    assert_close(y, want, x_type, f"{op} Y")
    if op == "SkipLayerNorm":
        assert np.abs(y.astype(np.float32)).max() > 1.0  # not the zeros of the rounded sum
        if x_type == F16:
            assert_close(y, _ort_skip_layer_norm(x, skip), x_type, "ONNX Runtime's SkipLayerNormalization")
