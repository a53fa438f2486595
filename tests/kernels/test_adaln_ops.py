"""The modulated (adaLN) ops, ModulatedLayerNorm and ModulatedRMSNorm (docs/ops.md): the CPU kernels of the library
and the model-local function bodies (the model run without the library), each through ONNX Runtime against the
numpy reference, for the three element types, several shapes, both modulation shapes, the norm's own affine and
the rounding attributes; and the errors the kernels give for bad input."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnx_norm import library
from onnx_norm.ops import functions, reference
from onnx_norm.ops.modulated import MODULATED_OPS, modulation_shape
from onnx_norm.ops.schema import DOMAIN, OPSET_VERSION

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
FLOAT_TYPES = (F32, F16, BF16)
TYPE_NAMES = {F32: "fp32", F16: "fp16", BF16: "bf16"}
# About one unit in the last place of Y's type (two where a rounding attribute adds a step that can tie the
# other way): the reference accumulates in float64, the kernels and the function bodies in float32.
Y_TOLERANCE = {F32: (3e-5, 3e-5), F16: (4e-3, 4e-3), BF16: (3.2e-2, 3.2e-2)}
LAYER, RMS = "ModulatedLayerNorm", "ModulatedRMSNorm"
OrtError = (
    ort.capi.onnxruntime_pybind11_state.Fail,
    ort.capi.onnxruntime_pybind11_state.InvalidArgument,
    ort.capi.onnxruntime_pybind11_state.RuntimeException,
)

needs_library = pytest.mark.skipif(not library.library_available(), reason="the onnx_norm library is not built")


def _model(
    op: str, types: Sequence[int | None], ranks: Sequence[int], attrs: dict[str, float | int]
) -> onnx.ModelProto:
    """One `op` node; types[i] None leaves input i out. Inputs have their rank and symbolic dims only, so one session
    serves every shape of a rank (and the op's shape inference, which output_type needs, runs)."""
    sig = MODULATED_OPS[op]
    names = [n if t is not None else "" for n, t in zip(sig.inputs, types, strict=True)]
    node = helper.make_node(op, names, ["Y"], domain=DOMAIN, name="adaln", **attrs)
    inputs = [
        helper.make_tensor_value_info(n, t, [f"{n}{i}" for i in range(r)])
        for n, t, r in zip(sig.inputs, types, ranks, strict=True)
        if t
    ]
    graph = helper.make_graph([node], op, inputs, [onnx.ValueInfoProto(name="Y")])  # typed by ONNX Runtime
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


@functools.cache
def _session(
    op: str,
    types: tuple[int | None, ...],
    ranks: tuple[int, ...],
    attrs: tuple[tuple[str, float | int], ...],
    backend: str,
):
    proto = _model(op, types, ranks, dict(attrs))
    if backend == "function":
        # No library: ONNX Runtime inlines the model-local function that attach_functions adds.
        model = ir.serde.deserialize_model(proto)
        functions.attach_functions(model)
        proto, options = ir.serde.serialize_model(model), ort.SessionOptions()
    else:
        options = library.session_options()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _to_ort(array: np.ndarray) -> ort.OrtValue:
    array = np.ascontiguousarray(array)
    if array.dtype == ml_dtypes.bfloat16:  # ORT's numpy bridge does not know bfloat16: pass the bits
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), BF16)
    return ort.OrtValue.ortvalue_from_numpy(array)


def _from_ort(value: ort.OrtValue) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    size = value.tensor_size_in_bytes()
    raw = ctypes.string_at(value.data_ptr(), size) if size else b""
    return np.frombuffer(raw, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(tuple(value.shape())).copy()


def run(op: str, arrays: Sequence[np.ndarray | None], backend: str, **attrs: float | int) -> np.ndarray:
    types = tuple(None if a is None else reference.elem_type(a.dtype) for a in arrays)
    ranks = tuple(0 if a is None else a.ndim for a in arrays)
    session = _session(op, types, ranks, tuple(sorted(attrs.items())), backend)
    sig = MODULATED_OPS[op]
    feeds = {n: _to_ort(a) for n, a in zip(sig.inputs, arrays, strict=True) if a is not None}
    (y,) = session.run_with_ort_values(["Y"], feeds)
    return _from_ort(y)


def random(shape: Sequence[int], elem_type: int, rng: np.random.Generator, scale: float = 1.0, loc: float = 0.0):
    return (rng.standard_normal(tuple(shape)) * scale + loc).astype(np.float32).astype(reference.np_dtype(elem_type))


def inputs(
    op: str,
    x_shape: Sequence[int],
    x_type: int,
    rng: np.random.Generator,
    *,
    mod_shape: Sequence[int] | None = None,
    param_type: int | None = None,
    affine: bool = False,
    axis: int = -1,
) -> list[np.ndarray | None]:
    """X (with an offset, so that LayerNorm's mean matters), the norm's Scale/Bias if `affine`, and ModScale/ModShift of
    `mod_shape` (default [B, *normalised dims]), all but X in `param_type` (default X's)."""
    param_type = param_type or x_type
    normalized = tuple(x_shape[axis % len(x_shape) :])
    mod_shape = tuple(mod_shape) if mod_shape is not None else (x_shape[0], *normalized)
    x = random(x_shape, x_type, rng, 2.0, 3.0)
    scale = random(normalized, param_type, rng, 0.5, 1.0) if affine else None
    bias = random(normalized, param_type, rng, 0.5) if affine and op == LAYER else None
    mod_scale = random(mod_shape, param_type, rng, 0.5)
    mod_shift = random(mod_shape, param_type, rng, 0.5)
    if op == LAYER:
        return [x, scale, bias, mod_scale, mod_shift]
    return [x, scale, mod_scale, mod_shift]


def check(op: str, arrays: Sequence[np.ndarray | None], backend: str, **attrs: float | int) -> np.ndarray:
    got = run(op, arrays, backend, **attrs)
    (want,) = reference.REFERENCES[op](*arrays, **attrs)
    assert got.dtype == want.dtype and got.shape == want.shape
    rtol, atol = Y_TOLERANCE[reference.elem_type(want.dtype)]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    return got


BACKENDS = ["function", pytest.param("kernel", marks=needs_library)]
SHAPES = [(1, 1, 1), (2, 3, 7), (2, 5, 64), (3, 17, 768), (1, 4, 4097)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x_type", FLOAT_TYPES, ids=TYPE_NAMES.get)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", [LAYER, RMS])
def test_matches_reference(op: str, shape: tuple[int, ...], x_type: int, backend: str) -> None:
    rng = np.random.default_rng(len(shape) * 31 + shape[-1])
    check(op, inputs(op, shape, x_type, rng), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", [LAYER, RMS])
def test_modulation_shapes(op: str, backend: str) -> None:
    """[B, H], [B, 1, H] (the model's scale[:, None, :]), [1, H] for the whole batch, and a 4-D X with the
    normalised dims [S2, H] (axis -2) and modulation [B, 1, S2, H]."""
    rng = np.random.default_rng(1)
    for x_shape, mod_shape, axis in (
        ((3, 5, 48), (3, 48), -1),
        ((3, 5, 48), (3, 1, 48), -1),
        ((3, 5, 48), (1, 48), -1),
        ((2, 3, 4, 40), (2, 1, 1, 40), -1),
        ((2, 3, 4, 40), (2, 4, 40), -2),
        ((2, 3, 4, 40), (2, 1, 4, 40), 2),
    ):
        check(op, inputs(op, x_shape, F16, rng, mod_shape=mod_shape, axis=axis), backend, axis=axis)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x_type", FLOAT_TYPES, ids=TYPE_NAMES.get)
@pytest.mark.parametrize("op", [LAYER, RMS])
def test_with_the_norms_own_affine(op: str, x_type: int, backend: str) -> None:
    rng = np.random.default_rng(2)
    for shape in ((2, 9, 32), (2, 3, 1000)):
        check(op, inputs(op, shape, x_type, rng, affine=True), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("x_type", "rounding"), [(F16, F16), (BF16, BF16), (F32, F16), (F32, BF16)])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("op", [LAYER, RMS])
def test_rounding_attributes(op: str, affine: bool, x_type: int, rounding: int, backend: str) -> None:
    rng = np.random.default_rng(3)
    arrays = inputs(op, (2, 6, 96), x_type, rng, affine=affine)
    check(op, arrays, backend, normalized_type=rounding, multiply_type=rounding)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rounding_points_are_the_documented_ones(backend: str) -> None:
    """An fp16 graph that normalises, then computes `1 + s`, the Mul and the Add in fp16 rounds at each step: with
    the rounding attributes the op reproduces that graph bit for bit, without them it differs from it."""
    rng = np.random.default_rng(4)
    x, _, _, s, t = inputs(LAYER, (4, 16, 256), F16, rng)
    n = reference.layer_norm(x)[0]  # normalised in float, rounded to fp16 once
    fp16 = np.float16
    graph = ((n * (fp16(1) + s)[:, None, :]).astype(fp16) + t[:, None, :]).astype(fp16)
    got = run(LAYER, [x, None, None, s, t], backend, normalized_type=F16, multiply_type=F16)
    np.testing.assert_array_equal(got, graph)
    plain = run(LAYER, [x, None, None, s, t], backend)
    assert np.count_nonzero(plain != graph) > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", [LAYER, RMS])
def test_output_type(op: str, backend: str) -> None:
    rng = np.random.default_rng(5)
    got = check(op, inputs(op, (2, 3, 64), F32, rng), backend, output_type=F16)
    assert got.dtype == np.float16


@needs_library
@pytest.mark.parametrize("op", [LAYER, RMS])
def test_many_rows_over_threads_and_samples(op: str) -> None:
    """Enough rows for several parallel blocks, whose boundaries fall inside samples."""
    rng = np.random.default_rng(6)
    for x_type in (F32, F16):
        check(op, inputs(op, (5, 333, 200), x_type, rng), "kernel")


@needs_library
@pytest.mark.parametrize("op", [LAYER, RMS])
def test_empty_batch_and_sequence(op: str) -> None:
    rng = np.random.default_rng(7)
    for x_shape, mod_shape in (((0, 4, 8), (0, 8)), ((2, 0, 8), (2, 8))):
        got = run(op, inputs(op, x_shape, F32, rng, mod_shape=mod_shape), "kernel")
        assert got.shape == x_shape


@needs_library
@pytest.mark.parametrize("op", [LAYER, RMS])
def test_nan_stays_in_its_row(op: str) -> None:
    rng = np.random.default_rng(8)
    arrays = inputs(op, (2, 3, 16), F32, rng)
    arrays[0][1, 2, 5] = np.nan
    got = run(op, arrays, "kernel")
    assert np.isnan(got[1, 2]).all() and not np.isnan(np.delete(got.reshape(6, 16), 5, axis=0)).any()


def _expect_error(op: str, arrays: Sequence[np.ndarray | None], match: str, **attrs: float | int) -> None:
    with pytest.raises(OrtError, match=match):
        run(op, arrays, "kernel", **attrs)


@needs_library
@pytest.mark.parametrize("op", [LAYER, RMS])
def test_bad_modulation_shapes_are_clear_errors(op: str) -> None:
    rng = np.random.default_rng(9)
    for mod_shape in ((2, 3, 16), (2, 15), (3, 16), (2, 16, 1), (16,)):
        arrays = inputs(op, (2, 3, 16), F32, rng)
        arrays[-2] = random(mod_shape, F32, rng)
        _expect_error(op, arrays, r"ModScale has shape .* must be \[2 or 1, 16\]")
    arrays = inputs(op, (2, 3, 16), F32, rng)
    arrays[-1] = random((2, 8), F32, rng)
    _expect_error(op, arrays, r"ModShift has shape \[2, 8\]")


@needs_library
def test_mixed_modulation_types_and_no_batch_dim_are_clear_errors() -> None:
    """The library declares one type for Scale/Bias/ModScale/ModShift (docs/ops.md): ONNX Runtime itself refuses a
    node that mixes them, before the kernel runs."""
    rng = np.random.default_rng(10)
    arrays = inputs(LAYER, (2, 3, 16), F32, rng)
    arrays[-1] = arrays[-1].astype(np.float16)
    _expect_error(LAYER, arrays, r"no kernel def matches node inputs for Op: ModulatedLayerNorm")
    _expect_error(LAYER, inputs(LAYER, (3, 16), F32, rng, axis=0), r"needs a batch dim", axis=0)


def test_reference_rejects_bad_modulation_shapes() -> None:
    with pytest.raises(ValueError, match="does not fit X"):
        modulation_shape((2, 3, 16), (2, 3, 16), -1)
    with pytest.raises(ValueError, match="batch dim"):
        modulation_shape((16,), (3, 16), 0)
    assert modulation_shape((2, 1, 16), (2, 3, 16), -1) == (2, 1, 16)
    assert modulation_shape((1, 4, 16), (2, 3, 4, 16), -2) == (1, 1, 4, 16)


def test_function_signatures_name_the_modulated_ops() -> None:
    sig = functions.FunctionSignature(LAYER, (True, False, False, True, True), (True,), F16)
    assert sig.overload.startswith("X_ModScale_ModShift__Y__xfp16")
    with pytest.raises(ValueError, match="required inputs"):
        functions.FunctionSignature(RMS, (True, True, False, True), (True,), F16)
    proto = functions.function_proto(functions.FunctionSignature(RMS, (True, True, True, True), (True,), BF16))
    assert {n.op_type for n in proto.node} >= {"ReduceMean", "Reshape", "Mul", "Add"}
