"""What counts as a constant inside a norm, and the graphs that need the wider notion: epsilon written as
`CastLike(Constant, mean)` (onnxscript), every `Constant` attribute form, axes computed from the input's rank
(`Range(axis + Size(Shape(X)), Size(Shape(X)))`, ONNX's own RMSNormalization expansion), and the backend test
models of the ONNX package (the function expansions of RMSNormalization-23 and LayerNormalization-17)."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper
from rewrite_support import FLOAT, FLOAT16, assert_fused, assert_not_fused, const, fused_ops, make_model, run

from onnx_norm.rewrite import constants, optimize
from onnx_norm.rewrite.evaluate import EvaluationError, evaluate

D = 16
rng = np.random.default_rng(9)
W = (rng.random(D) + 0.5).astype(np.float32)
SHAPES = {"x": [2, 3, D]}


def backend_expansions(module: str) -> list:
    """The `_expanded` test cases of one op of the ONNX backend suite, as the onnx package builds them (its test
    classes register their cases when the module is imported)."""
    import onnx.backend.test.case.node as cases

    prefix = "test_" + module.replace("normalization", "_normalization")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        importlib.import_module(f"onnx.backend.test.case.node.{module}")
    return [c for c in cases._NodeTestCases if c.name.startswith(prefix) and "_expanded" in c.name]


RMS_CASES = backend_expansions("rmsnormalization")
LAYER_CASES = backend_expansions("layernormalization")


def _backend_check(case, op: str) -> None:
    optimized, report = optimize(case.model)
    onnx.checker.check_model(optimized)
    fused = fused_ops(optimized)
    assert fused == [op], (fused, report.near_misses)
    inputs, outputs = case.data_sets[0]
    feeds = {v.name: a for v, a in zip(case.model.graph.input, inputs, strict=True)}
    (actual, *_rest) = run(optimized, feeds)
    np.testing.assert_allclose(actual, outputs[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(actual, run(case.model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_all_backend_rms_normalization_expansions_are_found():
    assert len(RMS_CASES) == 19


@pytest.mark.parametrize("case", RMS_CASES, ids=lambda c: c.name)
def test_backend_rms_normalization_expansion_fuses(case):
    _backend_check(case, "RMSNorm")


@pytest.mark.parametrize("case", LAYER_CASES[::4], ids=lambda c: c.name)
def test_backend_layer_normalization_expansion_fuses(case):
    _backend_check(case, "LayerNorm")


def rms_with(eps_nodes: list[onnx.NodeProto], eps_inits=(), *, axes_nodes=(), dtype=FLOAT) -> onnx.ModelProto:
    """An RMSNorm whose epsilon is the value `eps` made by `eps_nodes` and whose axes are `axes` (default [-1])."""
    nodes = [
        *axes_nodes,
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        *eps_nodes,
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    np_type = np.float16 if dtype == FLOAT16 else np.float32
    inits = [const("w", W.astype(np_type)), *eps_inits]
    if not axes_nodes:
        inits.append(const("axes", [-1], np.int64))
    return make_model(nodes, [("x", dtype, ["b", "s", D])], [("y", dtype, None)], inits, opset=18)


def _constant(name: str, **attr) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], **attr)


EPSILONS = {
    "castlike_of_constant": [
        _constant("e0", value=helper.make_tensor("e", onnx.TensorProto.DOUBLE, [], [1e-5])),
        helper.make_node("CastLike", ["e0", "ms"], ["eps"]),
    ],
    "castlike_of_value_float": [_constant("e0", value_float=1e-5), helper.make_node("CastLike", ["e0", "ms"], ["eps"])],
    "value_float": [_constant("eps", value_float=1e-5)],
    "value_floats": [_constant("eps", value_floats=[1e-5])],
    "cast_of_value_int_ratio": [
        _constant("one", value_int=1),
        _constant("big", value_int=100000),
        helper.make_node("Cast", ["one"], ["onef"], to=FLOAT),
        helper.make_node("Cast", ["big"], ["bigf"], to=FLOAT),
        helper.make_node("Div", ["onef", "bigf"], ["eps"]),
    ],
    "constant_of_shape": [
        _constant("one_dim", value_ints=[1]),
        helper.make_node("ConstantOfShape", ["one_dim"], ["eps"], value=helper.make_tensor("v", FLOAT, [1], [1e-5])),
    ],
    "identity_expand_reshape": [
        _constant("e0", value_float=1e-5),
        _constant("shape11", value_ints=[1, 1]),
        _constant("shape1", value_ints=[1]),
        helper.make_node("Identity", ["e0"], ["e1"]),
        helper.make_node("Expand", ["e1", "shape11"], ["e2"]),
        helper.make_node("Reshape", ["e2", "shape1"], ["eps"]),
    ],
}


@pytest.mark.parametrize("spelling", sorted(EPSILONS))
def test_epsilon_spellings_fuse(spelling):
    model = rms_with(EPSILONS[spelling])
    _optimized, report = assert_fused(model, SHAPES, ["RMSNorm"])
    assert report.norms[0].epsilon == pytest.approx(1e-5, rel=1e-6)


def test_castlike_epsilon_in_fp16():
    nodes = [_constant("e0", value_float=1e-5), helper.make_node("CastLike", ["e0", "ms"], ["eps"])]
    model = rms_with(nodes, dtype=FLOAT16)
    _optimized, report = assert_fused(model, SHAPES, ["RMSNorm"], rtol=2e-3, atol=2e-3)
    assert report.norms[0].epsilon == pytest.approx(float(np.float16(1e-5)), rel=1e-3)


def test_axes_from_the_rank_of_the_input():
    """`Range(Size(Shape(x)) - 1, Size(Shape(x)))`: known as [2] from the inferred rank alone."""
    axes_nodes = [
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Size", ["xs"], ["rank"]),
        _constant("minus1", value_int=-1),
        _constant("step", value_int=1),
        helper.make_node("Add", ["rank", "minus1"], ["first"]),
        helper.make_node("Range", ["first", "rank", "step"], ["axes"]),
    ]
    model = rms_with([_constant("eps", value_float=1e-6)], axes_nodes=axes_nodes)
    assert_fused(model, SHAPES, ["RMSNorm"])


def test_epsilon_cast_like_a_runtime_value_is_constant_but_a_runtime_epsilon_is_not():
    model = rms_with([_constant("e0", value_float=1e-5), helper.make_node("CastLike", ["e0", "ms"], ["eps"])])
    graph = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model)).graph
    values = {v.name: v for node in graph for v in node.outputs}
    assert constants.is_constant(values["eps"]) and not constants.is_constant(values["ms"])
    assert constants.constant_array(values["eps"]).dtype == np.float32
    # The epsilon taken from the data itself (`CastLike(ms, ms)`) depends on values, not only on a type.
    runtime = rms_with([helper.make_node("CastLike", ["ms", "ms"], ["eps"])])
    assert_not_fused(runtime, SHAPES)


def test_size_of_symbolic_dims_is_not_a_constant():
    """A divisor read from `Size(x)` with symbolic batch dims depends on them: not a mean over the last dim."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["ss"]),
        helper.make_node("Size", ["x"], ["n_int"]),
        helper.make_node("Cast", ["n_int"], ["n"], to=FLOAT),
        helper.make_node("Div", ["ss", "n"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["y"]),
    ]
    inits = [const("axes", [-1], np.int64), const("eps", 1e-5, np.float32)]
    model = make_model(nodes, [("x", FLOAT, ["b", "s", D])], [("y", FLOAT, None)], inits, opset=18)
    assert_not_fused(model, SHAPES)
    graph = ir.serde.deserialize_model(model).graph
    n = next(node for node in graph if node.op_type == "Cast").outputs[0]
    assert not constants.is_constant(n)


def test_shape_arithmetic_that_would_be_huge_is_not_folded():
    """BART's dynamo export builds positions as `Expand(Range(0, seq), [seq, seq])`: folding reads the symbolic
    dims as a million, which would ask for terabytes. The value is not a constant, and asking is quick."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Range", ["zero", "seq", "step"], ["positions"]),
        helper.make_node("Concat", ["seq_1d", "seq_1d"], ["square"], axis=0),
        helper.make_node("Unsqueeze", ["seq", "axes0"], ["seq_1d"]),
        helper.make_node("Expand", ["positions", "square"], ["grid"]),
        helper.make_node("Cast", ["grid"], ["y"], to=FLOAT),
    ]
    inits = [
        const("one", 1, np.int64), const("zero", 0, np.int64), const("step", 1, np.int64),
        const("axes0", [0], np.int64),
    ]  # fmt: skip
    nodes = [nodes[0], nodes[1], nodes[2], nodes[4], nodes[3], nodes[5], nodes[6]]  # topological order
    model = make_model(nodes, [("x", FLOAT, ["b", "s", D])], [("y", FLOAT, ["s", "s"])], inits, opset=18)
    graph = ir.serde.deserialize_model(model).graph
    grid = next(node for node in graph if node.op_type == "Expand").outputs[0]
    assert not constants.is_constant(grid)
    assert constants.constant_array(grid) is None
    with pytest.raises(EvaluationError, match="too many to evaluate"):  # refused before numpy allocates
        evaluate([grid], {}, symbolic_fill=1_000_003)


def test_folding_cache_is_scoped_to_one_pass():
    model = rms_with([_constant("eps", value_float=1e-5)])
    graph = ir.serde.deserialize_model(model).graph
    eps = next(node for node in graph if node.op_type == "Constant").outputs[0]
    with constants.folding():
        first = constants.constant_array(eps)
        assert constants.constant_array(eps) is first  # folded once
    assert constants.constant_array(eps) is not first  # outside a pass nothing is remembered
