"""Misses found on other exporters' graphs (the zoo's exporter fixtures), distilled to the spelling that was
missed: tf2onnx's `GlobalAveragePool` as the row mean below opset 18, jax2onnx's `CastLike(Constant, x)` epsilon."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from rewrite_support import FLOAT, FLOAT16, assert_fused, const, layer_nodes, make_model, rms_nodes

D = 16
rng = np.random.default_rng(21)
GAMMA = (rng.random((1, 1, D)) + 0.5).astype(np.float32)
BETA = rng.standard_normal((1, 1, D)).astype(np.float32)
SHAPES = {"x": [2, 5, D]}


def tf2onnx_layer_norm(*, opset: int = 13) -> object:
    """Keras LayerNormalization through tf2onnx: GlobalAveragePool moments, the distributed form
    `x * (rsqrt * gamma) + (beta + -mean * (rsqrt * gamma))`."""
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["mean"]),
        helper.make_node("Neg", ["mean"], ["neg"]),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("GlobalAveragePool", ["sq"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", ["r", "gamma"], ["rg"]),
        helper.make_node("Mul", ["x", "rg"], ["xs"]),
        helper.make_node("Mul", ["neg", "rg"], ["ms"]),
        helper.make_node("Add", ["ms", "beta"], ["shift"]),
        helper.make_node("Add", ["xs", "shift"], ["y"]),
    ]
    inits = [const("eps", 1e-5, np.float32), const("gamma", GAMMA), const("beta", BETA)]
    return make_model(nodes, [("x", FLOAT, ["unk__1", "unk__2", D])], [("y", FLOAT, None)], inits, opset=opset)


def tf2onnx_rms_norm(x_shape=("unk__1", "unk__2", D)) -> object:
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("GlobalAveragePool", ["sq"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", ["r", "w"], ["rw"]),
        helper.make_node("Mul", ["x", "rw"], ["y"]),
    ]
    inits = [const("eps", 1e-6, np.float32), const("w", GAMMA.reshape(-1))]
    return make_model(nodes, [("x", FLOAT, list(x_shape))], [("y", FLOAT, None)], inits, opset=13)


@pytest.mark.parametrize("opset", [13, 17])
def test_tf2onnx_global_average_pool_layer_norm(opset):
    _optimized, report = assert_fused(tf2onnx_layer_norm(opset=opset), SHAPES, ["LayerNorm"])
    assert report.norms[0].axes == [2]


def test_tf2onnx_global_average_pool_rms_norm():
    assert_fused(tf2onnx_rms_norm(), SHAPES, ["RMSNorm"])


def test_global_average_pool_of_rank_4_averages_two_axes():
    """On NCHW it is the mean over H and W: a norm over the last two axes, not the last one."""
    _optimized, report = assert_fused(_rms_rank4(), {"x": [2, 3, 4, D]}, ["RMSNorm"])
    assert report.norms[0].axes == [2, 3]


def _rms_rank4():
    nodes = rms_nodes(reduce="GlobalAveragePool")
    return make_model(
        nodes, [("x", FLOAT, ["n", 3, 4, D])], [("y", FLOAT, None)], [const("eps", 1e-6, np.float32)], opset=13
    )


def test_global_average_pool_after_unsqueeze():
    """A rank-2 row unsqueezed to rank 3 for GlobalAveragePool: the mean over its last axis."""
    nodes = [
        helper.make_node("Unsqueeze", ["x", "ax"], ["x3"]),
        helper.make_node("Mul", ["x3", "x3"], ["sq"]),
        helper.make_node("GlobalAveragePool", ["sq"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x3", "s"], ["y3"]),
        helper.make_node("Squeeze", ["y3", "ax"], ["y"]),
    ]
    inits = [const("eps", 1e-6, np.float32), const("ax", [0], np.int64)]
    model = make_model(nodes, [("x", FLOAT, [5, D])], [("y", FLOAT, [5, D])], inits, opset=13)
    assert_fused(model, {"x": [5, D]}, ["RMSNorm"])


def test_jax2onnx_castlike_epsilon_like_the_input():
    """nnx.RMSNorm: `mean(x^2) + CastLike(Constant(eps), x)`, the type taken from the norm's input."""
    nodes = [
        helper.make_node("Constant", [], ["e0"], value=helper.make_tensor("e", FLOAT, [], [1e-6])),
        helper.make_node("CastLike", ["e0", "x"], ["eps"]),
        *rms_nodes(y="n"),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    inits = [const("w", GAMMA.reshape(-1))]
    model = make_model(nodes, [("x", FLOAT, ["b", 5, D])], [("y", FLOAT, None)], inits, opset=17)
    assert_fused(model, SHAPES, ["RMSNorm"])


def test_centred_over_another_axis_is_an_rms_norm_of_the_centred_value():
    """Centred over axis 1, normalised over the last axis: no LayerNorm, but exactly an RMSNorm of `x - mean`."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1]),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("GlobalAveragePool", ["sq"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["y"]),
    ]
    model = make_model(
        nodes, [("x", FLOAT, ["b", 5, D])], [("y", FLOAT, None)], [const("eps", 1e-5, np.float32)], opset=13
    )
    optimized, _report = assert_fused(model, SHAPES, ["RMSNorm"])
    assert [n.op_type for n in optimized.graph.node if n.domain == ""] == ["ReduceMean", "Sub"]


def test_float16_keep_io_types_casts_the_input_once_per_reader():
    """onnxconverter-common's float16 conversion with `keep_io_types=True` writes one `Cast(input -> fp16)` per
    reader, so the mean and the centring read two identical Casts: one input, under two names."""
    nodes = [
        helper.make_node("Cast", ["x"], ["x_to_mean"], to=FLOAT16),
        helper.make_node("Cast", ["x"], ["x_to_sub"], to=FLOAT16),
        *layer_nodes("x_to_sub", "y16", mean_of="x_to_mean", scale="w", bias="b"),
        helper.make_node("Cast", ["y16"], ["y"], to=FLOAT),
    ]
    inits = [
        const("eps", 1e-5, np.float16),
        const("w", GAMMA.reshape(-1).astype(np.float16)),
        const("b", BETA.reshape(-1).astype(np.float16)),
    ]
    model = make_model(nodes, [("x", FLOAT, ["b", 5, D])], [("y", FLOAT, None)], inits, opset=17)
    optimized, _report = assert_fused(model, SHAPES, ["LayerNorm"], rtol=1e-2, atol=1e-2)
    assert [n.op_type for n in optimized.graph.node].count("Cast") == 2  # one input Cast left, and the output's
