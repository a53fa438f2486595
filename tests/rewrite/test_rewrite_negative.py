"""Graphs that look like norms and are not: nothing fused, outputs bit-identical, a near-miss says why."""

from __future__ import annotations

import numpy as np
from onnx import helper
from rewrite_support import (
    FLOAT,
    assert_fused,
    assert_not_fused,
    const,
    layer_nodes,
    make_model,
    rms_divided_by_dim,
)
from test_rewrite_variants import distributed_layer_norm

D = 16
X = [("x", FLOAT, ["b", "s", D])]
SHAPES = {"x": [2, 3, D]}
W = (np.random.default_rng(2).random(D) + 0.5).astype(np.float32)


def rms(
    *,
    divisor=None,
    eps_after_sqrt=False,
    axes=(-1,),
    numerator="x",
    eps_input=False,
    extra_output=None,
    scale_shape=None,
):
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"])]
    if divisor is None:
        nodes.append(helper.make_node("ReduceMean", ["sq"], ["ms"], axes=list(axes)))
    else:
        nodes += [
            helper.make_node("ReduceSum", ["sq", "axes"], ["ss"]),
            helper.make_node("Div", ["ss", "n"], ["ms"]),
        ]
    if eps_after_sqrt:
        nodes += [helper.make_node("Sqrt", ["ms"], ["s0"]), helper.make_node("Add", ["s0", "eps"], ["s"])]
    else:
        nodes += [helper.make_node("Add", ["ms", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"])]
    nodes += [helper.make_node("Div", [numerator, "s"], ["n0"]), helper.make_node("Mul", ["n0", "w"], ["y"])]
    inits = [const("axes", [-1], np.int64), const("n", float(divisor or D), np.float32)]
    if not eps_input:
        inits.append(const("eps", 1e-6, np.float32))
    w = W if scale_shape is None else np.random.default_rng(3).random(scale_shape).astype(np.float32) + 0.5
    inits.append(const("w", w))
    inputs = list(X)
    if numerator != "x":
        inputs.append((numerator, FLOAT, ["b", "s", D]))
    if eps_input:
        inputs.append(("eps", FLOAT, []))
    outputs = [("y", FLOAT, None)]
    if extra_output:
        outputs.append((extra_output, FLOAT, ["b", "s", 1]))
    return make_model(nodes, inputs, outputs, inits), {**SHAPES, **{n: [2, 3, D] for n, *_ in inputs[1:] if n != "eps"}}


def _shapes(shapes):
    return {k: ([] if k == "eps" else v) for k, v in shapes.items()}


def test_divisor_is_not_the_row_size():
    model, shapes = rms(divisor=D - 1)
    assert_not_fused(model, shapes)


def test_epsilon_added_after_the_square_root_on_a_runtime_epsilon_is_not_fused():
    """Epsilon after the square root is the fused ops' epsilon_outside (tests/rewrite/test_rewrite_epsilon_outside.py),
    but
    only a constant one: the op's attribute cannot take a graph input."""
    model, shapes = rms(eps_after_sqrt=True, eps_input=True)
    shapes["eps"] = []
    assert_not_fused(model, _shapes(shapes), reason="not a constant")


def test_reduction_over_other_axes():
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[1]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["n0"]),
        helper.make_node("Mul", ["n0", "w"], ["y"]),  # w varies along the last axis, not the reduced one
    ]
    model = make_model(
        nodes, [("x", FLOAT, ["b", 3, D])], [("y", FLOAT, None)], [const("eps", 1e-6, np.float32), const("w", W)]
    )
    assert_not_fused(model, SHAPES, reason="varies across rows")


def test_numerator_is_another_tensor():
    model, shapes = rms(numerator="other")
    assert_not_fused(model, shapes)


def test_runtime_epsilon():
    model, shapes = rms(eps_input=True)
    shapes["eps"] = []
    feeds_shapes = _shapes(shapes)
    assert_not_fused(model, feeds_shapes, reason="not a constant")


def test_intermediate_is_a_graph_output():
    model, shapes = rms(extra_output="ms")
    assert_not_fused(model, shapes, reason="graph output")


def test_per_sample_scale():
    """A scale per sample [2, 1, 1] over [2, 3, D]: it varies along the batch but is broadcast over the sequence, so
    it is not one row per row group (a per-row [3, 1] is: tests/rewrite/test_rewrite_per_head.py)."""
    model, shapes = rms(scale_shape=(2, 1, 1))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 3
    assert_not_fused(model, shapes, reason="varies across rows")


def test_centring_with_another_tensors_mean_is_not_a_layer_norm():
    nodes = layer_nodes(mean_of="other")
    model = make_model(
        nodes, [*X, ("other", FLOAT, ["b", "s", D])], [("y", FLOAT, None)], [const("eps", 1e-6, np.float32)]
    )
    # Not a LayerNorm of x; it is exactly an RMSNorm of d = x - mean(other), and only that may be fused.
    optimized, report = assert_fused(model, {"x": [2, 3, D], "other": [2, 3, D]}, ["RMSNorm"])
    assert report.norms[0].kind == "rms"
    assert {"Sub", "ReduceMean"} <= {n.op_type for n in optimized.graph.node}


def test_intermediate_used_elsewhere():
    nodes = [
        *layer_nodes(y="n"),
        helper.make_node("Add", ["n", "sq"], ["y"]),  # the square is read again
    ]
    model = make_model(nodes, X, [("y", FLOAT, None)], [const("eps", 1e-6, np.float32)])
    assert_not_fused(model, SHAPES)


def test_square_root_without_reciprocal_power():
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["y"]),  # multiplies by the RMS instead of dividing
    ]
    model = make_model(nodes, X, [("y", FLOAT, None)], [const("eps", 1e-6, np.float32)])
    assert_not_fused(model, SHAPES, reason="not input * (statistic + eps)^-1/2")


def test_statistic_restored_to_another_layout():
    """The mean square of each row of a [batch, seq, D] input, reshaped to [seq, batch, 1]: it broadcasts against
    other rows than its own (the graph only runs where one of the two dims is 1)."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=0),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s0"]),
        helper.make_node("Shape", ["x"], ["b"], start=0, end=1),
        helper.make_node("Shape", ["x"], ["t"], start=1, end=2),
        helper.make_node("Concat", ["t", "b", "one_i"], ["swapped"], axis=0),
        helper.make_node("Reshape", ["s0", "swapped"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["y"]),
    ]
    inits = [const("axes", [-1], np.int64), const("one_i", [1], np.int64), const("eps", 1e-6, np.float32)]
    model = make_model(nodes, X, [("y", FLOAT, ["b", "b", D])], inits, opset=18)
    report = assert_not_fused(model, {"x": [3, 1, D]})
    assert any("matched subgraph" in m.reason or "proof failed" in m.reason for m in report.near_misses), [
        m.reason for m in report.near_misses
    ]


def test_divisor_read_from_a_symbolic_dim_is_not_a_constant():
    """`sum(x*x, -1) / x.shape[1]`: the sequence length, which is the row size only by accident."""
    nodes, inits = rms_divided_by_dim(1)
    model = make_model(nodes, X, [("y", FLOAT, None)], inits, opset=17)
    assert_not_fused(model, {"x": [2, D, D]})  # seq == D: the original computes an RMSNorm on these inputs


def test_distributed_layer_norm_with_another_scale_for_the_mean():
    """x * (gamma * inv) - mean * (gamma2 * inv) + beta is not a LayerNorm unless gamma2 == gamma."""
    other = (np.random.default_rng(4).random(D) + 0.5).astype(np.float32)
    assert_not_fused(distributed_layer_norm("tf2onnx", mean_scale=other), SHAPES, reason="different constants")


def test_variance_clamped_from_below_at_a_positive_value_is_not_a_clamp_to_zero():
    """max(var, 1e-3) + eps is another epsilon placement, not LayerNorm's var + eps: the proof rejects it."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["dd"]),
        helper.make_node("ReduceMean", ["dd"], ["var0"], axes=[-1]),
        helper.make_node("Max", ["var0", "floor"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["y"]),
    ]
    inits = [const("eps", 1e-6, np.float32), const("floor", 1e-3, np.float32)]
    model = make_model(nodes, X, [("y", FLOAT, None)], inits, opset=13)
    assert_not_fused(model, SHAPES)


def test_reduce_sum_square_is_not_taken_for_a_mean():
    """d = x - ReduceSumSquare(x)/N is not x centred: no LayerNorm of x, only the RMSNorm of d that it spells."""
    nodes = [
        helper.make_node("ReduceSumSquare", ["x"], ["ss"], axes=[-1]),
        helper.make_node("Div", ["ss", "n"], ["m"]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["dd"]),
        helper.make_node("ReduceMean", ["dd"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["y"]),
    ]
    inits = [const("n", float(D), np.float32), const("eps", 1e-6, np.float32)]
    _, report = assert_fused(make_model(nodes, X, [("y", FLOAT, None)], inits, opset=13), SHAPES, ["RMSNorm"])
    assert report.norms[0].kind == "rms"
