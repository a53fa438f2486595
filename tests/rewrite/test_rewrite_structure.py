"""Where norms hide: LayerNormalization's ONNX function expansion (statistics outputs), If branches, model-local
functions; and the ONNX and ORT targets on the same graphs."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import helper
from rewrite_support import FLOAT, assert_fused, const, fused_ops, make_model, random_feeds, run

from onnx_norm.rewrite import optimize

D = 16
rng = np.random.default_rng(4)
W = (rng.random(D) + 0.5).astype(np.float32)
B = rng.standard_normal(D).astype(np.float32)


def expanded_layer_normalization() -> onnx.ModelProto:
    """A model made of the ONNX function body of LayerNormalization-17, with its Mean and InvStdDev outputs."""
    schema = onnx.defs.get_schema("LayerNormalization", 17)
    node = helper.make_node(
        "LayerNormalization", ["X", "Scale", "B"], ["Y", "Mean", "InvStdDev"], axis=-1, epsilon=1e-5
    )
    types = [helper.make_tensor_type_proto(FLOAT, s).SerializeToString() for s in (["b", "s", D], [D], [D])]
    function = onnx.FunctionProto()
    function.ParseFromString(schema.get_context_dependent_function(node.SerializeToString(), types))
    return make_model(
        list(function.node),
        [("X", FLOAT, ["b", "s", D])],
        [("Y", FLOAT, ["b", "s", D]), ("Mean", FLOAT, ["b", "s", 1]), ("InvStdDev", FLOAT, ["b", "s", 1])],
        [const("Scale", W), const("B", B)],
        opset=17,
    )


def test_function_expansion_of_layer_normalization_keeps_statistics():
    model = expanded_layer_normalization()
    _optimized, report = assert_fused(model, {"X": [2, 3, D]}, ["LayerNorm"], rtol=1e-4, atol=1e-4)
    assert report.norms[0].statistics == ["mean", "inv_std"]
    assert report.norms[0].variant == "E[x^2] - E[x]^2"


def rms_nodes(x: str, y: str, prefix: str = "") -> list[onnx.NodeProto]:
    p = prefix
    return [
        helper.make_node("Constant", [], [f"{p}eps"], value=helper.make_tensor("e", FLOAT, [], [1e-6])),
        helper.make_node("Constant", [], [f"{p}w"], value=helper.make_tensor("w", FLOAT, [D], W.tolist())),
        helper.make_node("Mul", [x, x], [f"{p}sq"]),
        helper.make_node("ReduceMean", [f"{p}sq"], [f"{p}ms"], axes=[-1]),
        helper.make_node("Add", [f"{p}ms", f"{p}eps"], [f"{p}ve"]),
        helper.make_node("Sqrt", [f"{p}ve"], [f"{p}s"]),
        helper.make_node("Div", [x, f"{p}s"], [f"{p}n"]),
        helper.make_node("Mul", [f"{p}w", f"{p}n"], [y]),
    ]


def test_norm_inside_if_branch():
    then_graph = helper.make_graph(
        rms_nodes("x", "t_y", "t_"), "then", [], [helper.make_tensor_value_info("t_y", FLOAT, ["b", D])]
    )
    else_graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e_y"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_y", FLOAT, ["b", D])],
    )
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)]
    model = make_model(nodes, [("x", FLOAT, ["b", D]), ("c", onnx.TensorProto.BOOL, [])], [("y", FLOAT, ["b", D])])
    optimized, _report = optimize(model)
    onnx.checker.check_model(optimized)
    then_branch = next(a.g for a in optimized.graph.node[0].attribute if a.name == "then_branch")
    then_ops = [n.op_type for n in then_branch.node]
    assert "RMSNorm" in then_ops and "ReduceMean" not in then_ops, then_ops
    for cond in (True, False):
        feeds = {"x": rng.standard_normal((3, D)).astype(np.float32), "c": np.array(cond)}
        np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_norm_inside_model_local_function():
    function = helper.make_function(
        "custom", "MyNorm", ["X"], ["Y"], rms_nodes("X", "Y"), [helper.make_opsetid("", 17)]
    )
    nodes = [helper.make_node("MyNorm", ["x"], ["y"], domain="custom")]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", FLOAT, ["b", D])],
        [helper.make_tensor_value_info("y", FLOAT, ["b", D])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)], functions=[function]
    )
    model.ir_version = 10
    optimized, _report = optimize(model)
    onnx.checker.check_model(optimized)
    body = next(f for f in optimized.functions if f.name == "MyNorm")
    assert [n.op_type for n in body.node if n.op_type == "RMSNorm"], [n.op_type for n in body.node]
    feeds = {"x": rng.standard_normal((3, D)).astype(np.float32)}
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_standard_targets(target):
    model = expanded_layer_normalization()
    optimized, report = optimize(model, target=target)
    onnx.checker.check_model(optimized)
    assert fused_ops(optimized) == []
    assert report.fused == 1 and report.norms[0].target == target
    feeds = random_feeds(model, {"X": [2, 3, D]})
    for before, after in zip(run(model, feeds), run(optimized, feeds), strict=False):
        np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)


def test_onnx_target_below_opset_23_reports_rms_near_miss():
    model = make_model(rms_nodes("x", "y"), [("x", FLOAT, ["b", D])], [("y", FLOAT, ["b", D])], opset=17)
    optimized, report = optimize(model, target="onnx")
    assert report.fused == 0
    assert any("target onnx" in m.reason for m in report.near_misses), report.near_misses
    feeds = {"x": rng.standard_normal((3, D)).astype(np.float32)}
    np.testing.assert_array_equal(run(optimized, feeds)[0], run(model, feeds)[0])
