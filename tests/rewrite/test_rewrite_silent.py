"""No silent miss: a reduction of a square (or of a centred value) that feeds a square root or a division is
either fused or named in the near-misses with a reason (`inspect --explain`)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from rewrite_support import FLOAT, assert_not_fused, const, make_model, rms_nodes

from onnx_norm.rewrite import inspect, optimize

D = 16


def statistic_model(*, reduce: str = "ReduceMean", axes_input: bool = False, dims=("b", "s", D), eps=True):
    """`x / sqrt(reduce(x * x) + eps)` with the reduction spelled as asked."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"])]
    inputs = [("x", FLOAT, list(dims))]
    inits = [const("eps", 1e-5, np.float32)]
    if axes_input:
        nodes.append(helper.make_node(reduce, ["sq", "axes"], ["ms"]))
        inputs.append(("axes", TensorProto.INT64, [1]))
    else:
        nodes.append(helper.make_node(reduce, ["sq", "axes_c"], ["ms"]))
        inits.append(const("axes_c", [-1], np.int64))
    nodes += [
        helper.make_node("Add", ["ms", "eps"] if eps else ["ms", "zero"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["y"]),
    ]
    inits.append(const("zero", 0.0, np.float32))
    return make_model(nodes, inputs, [("y", FLOAT, None)], inits, opset=18)


def _reasons(model) -> list[str]:
    return [m.reason for m in inspect(model).near_misses]


def test_l2_normalisation_is_reported_not_silent():
    """`x / sqrt(sum(x^2) + eps)`: a sum, not a mean; with a static row the L2 family fuses it as the RMSNorm it is
    (epsilon eps / N), over a symbolic row it says why not."""
    optimized, _ = optimize(statistic_model(reduce="ReduceSum", dims=("b", "s", D)))
    assert [n.op_type for n in optimized.graph.node] == ["RMSNorm"]
    reasons = _reasons(statistic_model(reduce="ReduceSum", dims=("b", "s", "d")))
    assert any("epsilon added over symbolic dims" in r for r in reasons), reasons


def test_axes_computed_at_run_time_are_named():
    model = statistic_model(axes_input=True)
    report = assert_not_fused(model, {"x": [2, 3, D], "axes": [1]})
    reasons = [m.reason for m in report.near_misses]
    assert any("axes are computed at run time" in r for r in reasons), reasons


def test_a_near_miss_below_the_reduction_is_enough():
    """The matcher explains this one itself (epsilon read from a graph input): no second record."""
    nodes = rms_nodes()
    inputs = [("x", FLOAT, ["b", "s", D]), ("eps", FLOAT, [])]
    model = make_model(nodes, inputs, [("y", FLOAT, ["b", "s", D])])
    reasons = _reasons(model)
    assert len(reasons) == 1 and "is not a constant" in reasons[0], reasons


def test_epsilon_added_in_two_steps_is_reported():
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Add", ["ve", "eps"], ["ve2"]),
        helper.make_node("Sqrt", ["ve2"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["y"]),
    ]
    model = make_model(nodes, [("x", FLOAT, ["b", "s", D])], [("y", FLOAT, None)], [const("eps", 1e-5, np.float32)])
    reasons = _reasons(model)
    assert len(reasons) == 1 and reasons[0].startswith("ReduceMean of a square"), reasons


@pytest.mark.parametrize("reduce", ["ReduceMean", "ReduceSum"])
def test_every_statistic_left_is_explained(reduce):
    """Whatever stops the fusion, a reduction of a square that feeds a square root never goes unreported."""
    for model in (
        statistic_model(reduce=reduce),
        statistic_model(reduce=reduce, dims=("b", "s", "d")),
        statistic_model(reduce=reduce, axes_input=True),
    ):
        optimized, report = optimize(model)
        left = [n for n in optimized.graph.node if n.op_type == reduce]
        assert not left or report.near_misses, (reduce, [n.name for n in left])
