"""Scale and bias the model takes at run time (graph inputs: an export with `export_params=False`, or initializers
kept as overridable inputs): the fused op reads them as they are, so the affine is fused too, and the proof feeds
them random rows. A graph input that is the norm's own input is never mistaken for one."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from rewrite_support import FLOAT, FLOAT16, assert_fused, const, layer_nodes, make_model, rms_nodes

from onnx_norm.rewrite import optimize

D = 16
SHAPES = {"x": [2, 3, D], "w": [D], "b": [D]}


def _fused_node(model: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.domain == "onnx_norm"]
    return node


@pytest.mark.parametrize("bias", ["runtime", "constant", "none"])
def test_layer_norm_reads_a_runtime_scale_and_bias(bias: str) -> None:
    inputs = [("x", FLOAT, ["b", "s", D]), ("w", FLOAT, [D])] + ([("b", FLOAT, [D])] if bias == "runtime" else [])
    initializers = [const("eps", [1e-5], np.float32)]
    if bias == "constant":
        initializers.append(const("b", np.linspace(-1, 1, D), np.float32))
    nodes = layer_nodes(scale="w", bias=None if bias == "none" else "b")
    model = make_model(nodes, inputs, [("y", FLOAT, None)], initializers)
    optimized, _ = assert_fused(model, SHAPES, ["LayerNorm"])
    node = _fused_node(optimized)
    assert node.input[1] == "w"  # the graph input itself, not a copy
    assert [n.op_type for n in optimized.graph.node] == ["LayerNorm"]  # no Mul or Add left after it
    if bias == "runtime":
        assert node.input[2] == "b"


def test_rms_norm_with_a_runtime_scale_in_float16() -> None:
    nodes = [*rms_nodes(y="n"), helper.make_node("Mul", ["w", "n"], ["y"])]
    inputs = [("x", FLOAT16, ["b", "s", D]), ("w", FLOAT16, [D])]
    model = make_model(nodes, inputs, [("y", FLOAT16, None)], [const("eps", [1e-6], np.float16)])
    optimized, _ = assert_fused(model, SHAPES, ["RMSNorm"], rtol=2e-3, atol=2e-3)
    assert _fused_node(optimized).input[1] == "w"


def test_a_runtime_scale_that_is_not_one_row_is_a_near_miss() -> None:
    """A per-position scale [s, D] over a norm of the last axis varies across rows: no Scale can hold it."""
    nodes = layer_nodes(scale="w")
    inputs = [("x", FLOAT, ["b", 3, D]), ("w", FLOAT, [3, D])]
    model = make_model(nodes, inputs, [("y", FLOAT, None)], [const("eps", [1e-5], np.float32)])
    _, report = optimize(model)
    assert any("is not one row" in m.reason for m in report.near_misses), report.near_misses


def test_the_norms_own_graph_input_is_not_taken_for_a_scale() -> None:
    """x is a graph input of static shape used by a Mul (x * rsqrt): it also feeds the statistic, so it is data."""
    model = make_model(rms_nodes(), [("x", FLOAT, [2, 3, D])], [("y", FLOAT, None)], [const("eps", [1e-6], np.float32)])
    optimized, _ = assert_fused(model, {"x": [2, 3, D]}, ["RMSNorm"])
    assert list(_fused_node(optimized).input[:1]) == ["x"]


def test_a_scale_computed_from_a_runtime_weight_is_read_as_it_is() -> None:
    """Gemma's `x_norm * (1 + w)` with `w` a graph input: `1 + w` is a row computed from a weight at run time, and
    the fused op reads it as its Scale (the Add stays in front of the op, the Mul is gone)."""
    nodes = [
        *rms_nodes(y="n"),
        helper.make_node("Add", ["one", "w"], ["w1"]),
        helper.make_node("Mul", ["n", "w1"], ["y"]),
    ]
    inputs = [("x", FLOAT, ["b", "s", D]), ("w", FLOAT, [D])]
    inits = [const("eps", [1e-6], np.float32), const("one", 1.0, np.float32)]
    model = make_model(nodes, inputs, [("y", FLOAT, None)], inits)
    optimized, _ = assert_fused(model, SHAPES, ["RMSNorm"])
    assert _fused_node(optimized).input[1] == "w1"
    assert [n.op_type for n in optimized.graph.node] == ["Add", "RMSNorm"]


def test_a_gate_of_one_position_is_no_scale() -> None:
    """A static [1, 1, D] input gated by its own sigmoid (one position, batch 1): the gate is computed from the
    norm's input and is 3-D, not a row of weights; the norm is fused and the gate's Mul stays after it."""
    nodes = [
        *rms_nodes(y="n"),
        helper.make_node("Sigmoid", ["x"], ["gate"]),
        helper.make_node("Mul", ["n", "gate"], ["y"]),
    ]
    model = make_model(nodes, [("x", FLOAT, [1, 1, D])], [("y", FLOAT, None)], [const("eps", [1e-6], np.float32)])
    optimized, _ = assert_fused(model, {"x": [1, 1, D]}, ["RMSNorm"])
    assert sorted(n.op_type for n in optimized.graph.node) == ["Mul", "RMSNorm", "Sigmoid"]
    (mul,) = [n for n in optimized.graph.node if n.op_type == "Mul"]
    assert _fused_node(optimized).output[0] in mul.input and len(_fused_node(optimized).input) == 1


def test_a_scale_from_a_constant_node_stays_a_constant() -> None:
    """A Constant node's row is no run-time weight: it pins the symbolic row size it is the only size of (the proof
    runs at that size, with its values)."""
    weights = helper.make_tensor("w", FLOAT, [D], (np.arange(D, dtype=np.float32) / D + 0.5).tolist())
    nodes = [helper.make_node("Constant", [], ["w"], value=weights), *layer_nodes(scale="w")]
    model = make_model(
        nodes, [("x", FLOAT, ["b", "s", "d"])], [("y", FLOAT, ["b", "s", "d"])], [const("eps", 1e-5, np.float32)]
    )
    assert_fused(model, {"x": [2, 3, D]}, ["LayerNorm"])
