"""Norms over symbolic dims: the fused op reads the row size at run time, so a LayerNorm over a last dim named `N`
is fused whatever N is; a run-time scale of shape [N] is that row, a constant one pins N, and the proof picks a
size. The mean may be a `ReduceSum` divided by the row size read from the input's shape at run time (TorchScript's
`x.sum(-1) / x.shape[-1]`, dynamo's `Shape(x, start=-1)`), which must be exactly the reduced dims."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from rewrite_support import FLOAT, FLOAT16, assert_fused, const, layer_nodes, make_model, random_feeds, run

from onnx_norm.rewrite import optimize

D = 16
SHAPES = {"x": [2, 3, D], "w": [D], "b": [D]}
W = np.linspace(0.5, 1.5, D)
B = np.linspace(-1.0, 1.0, D)


def _row_size(spelling: str) -> list[onnx.NodeProto]:
    """`nf`: the size of x's last dim as a float, read at run time."""
    if spelling == "gather":  # TorchScript: Cast(Gather(Shape(x), -1))
        return [
            helper.make_node("Shape", ["x"], ["shp"]),
            helper.make_node("Gather", ["shp", "minus1"], ["nd"], axis=0),
            helper.make_node("Cast", ["nd"], ["nf"], to=FLOAT),
        ]
    if spelling == "slice":  # dynamo: Shape(x, start=-1), one element
        return [helper.make_node("Shape", ["x"], ["nd"], start=-1), helper.make_node("Cast", ["nd"], ["nf"], to=FLOAT)]
    # the wrong dim: x.shape[-2]
    return [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "minus2"], ["nd"], axis=0),
        helper.make_node("Cast", ["nd"], ["nf"], to=FLOAT),
    ]


def _mean(src: str, out: str, divide: str) -> list[onnx.NodeProto]:
    """`out = sum(src, -1) / nf`, as a Div or as a Mul by the reciprocal."""
    if divide == "div":
        return [
            helper.make_node("ReduceSum", [src, "axes"], [f"{out}_sum"], keepdims=1),
            helper.make_node("Div", [f"{out}_sum", "nf"], [out]),
        ]
    return [
        helper.make_node("ReduceSum", [src, "axes"], [f"{out}_sum"], keepdims=1),
        helper.make_node("Reciprocal", ["nf"], [f"{out}_inv"]),
        helper.make_node("Mul", [f"{out}_inv", f"{out}_sum"], [out]),
    ]


def _fp16_layer_norm(*, params: str, spelling: str | None = None, divide: str = "div") -> onnx.ModelProto:
    """An fp16 LayerNorm over the last dim `N`, statistics in fp32, scale and bias in fp16 after the Cast back;
    `params`: "inputs" (graph inputs of shape [N]) or "constants"; `spelling`: the mean as ReduceSum / row size."""
    nodes = [helper.make_node("Cast", ["x"], ["x32"], to=FLOAT)]
    norm = layer_nodes("x32", "n32")
    if spelling is not None:
        nodes += _row_size(spelling)
        norm = [*_mean("x32", "mu", divide), *norm[1:3], *_mean("sq", "var", divide), *norm[4:]]
    nodes += [
        *norm,
        helper.make_node("Cast", ["n32"], ["n"], to=FLOAT16),
        helper.make_node("Mul", ["n", "w"], ["nw"]),
        helper.make_node("Add", ["nw", "b"], ["y"]),
    ]
    inits = [
        const("eps", 1e-5, np.float32),
        const("axes", np.array([-1], np.int64)),
        const("minus1", np.array(-1, np.int64)),
        const("minus2", np.array(-2, np.int64)),
    ]
    inputs = [("x", FLOAT16, ["b", "s", "N"])]
    if params == "inputs":
        inputs += [("w", FLOAT16, ["N"]), ("b", FLOAT16, ["N"])]
    else:
        inits += [const("w", W, np.float16), const("b", B, np.float16)]
    return make_model(nodes, inputs, [("y", FLOAT16, ["b", "s", "N"])], inits, opset=15)


@pytest.mark.parametrize("params", ["inputs", "constants"])
def test_fp16_layer_norm_over_a_named_dim(params: str) -> None:
    model = _fp16_layer_norm(params=params)
    optimized, report = assert_fused(model, SHAPES, ["LayerNorm"], rtol=4e-3, atol=4e-3)
    assert [n.op_type for n in optimized.graph.node] == ["LayerNorm"], report.near_misses
    node = optimized.graph.node[0]
    if params == "inputs":
        assert list(node.input) == ["x", "w", "b"]  # the run-time rows themselves
    # The op reads N at run time: another size runs too, with the same result as the original.
    feeds = random_feeds(model, {"x": [2, 3, 40], "w": [40], "b": [40]}) if params == "inputs" else None
    if feeds is not None:
        np.testing.assert_allclose(
            run(optimized, feeds)[0].astype(np.float64), run(model, feeds)[0].astype(np.float64), atol=4e-3, rtol=4e-3
        )


@pytest.mark.parametrize("divide", ["div", "reciprocal"])
@pytest.mark.parametrize("spelling", ["gather", "slice"])
@pytest.mark.parametrize("params", ["inputs", "constants"])
def test_sum_over_the_row_size_read_at_run_time(params: str, spelling: str, divide: str) -> None:
    model = _fp16_layer_norm(params=params, spelling=spelling, divide=divide)
    optimized, report = assert_fused(model, SHAPES, ["LayerNorm"], rtol=4e-3, atol=4e-3)
    assert [n.op_type for n in optimized.graph.node] == ["LayerNorm"], report.near_misses


def test_sum_over_another_dim_is_not_a_mean() -> None:
    """`x.sum(-1) / x.shape[-2]` is no mean of the last dim: nothing is fused and the model is unchanged."""
    model = _fp16_layer_norm(params="inputs", spelling="wrong dim")
    optimized, _ = optimize(model)
    assert [n.op_type for n in optimized.graph.node] == [n.op_type for n in model.graph.node]


def test_rms_norm_with_a_runtime_row_size_in_float32() -> None:
    """`x * rsqrt(sum(x^2) / x.shape[-1] + eps) * w` over a dim named N, w a graph input."""
    nodes = [
        *_row_size("gather"),
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        *_mean("sq", "ms", "div"),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    inits = [const("eps", 1e-6, np.float32), const("axes", np.array([-1], np.int64)), const("minus1", -1, np.int64)]
    inputs = [("x", FLOAT, ["b", "N"]), ("w", FLOAT, ["N"])]
    model = make_model(nodes, inputs, [("y", FLOAT, ["b", "N"])], inits, opset=15)
    optimized, report = assert_fused(model, {"x": [3, D], "w": [D]}, ["RMSNorm"])
    assert [n.op_type for n in optimized.graph.node] == ["RMSNorm"], report.near_misses


def test_a_runtime_scale_of_another_named_dim_is_not_the_row() -> None:
    """x is [b, N], the scale [M]: nothing says M is N, so the scale is no row of the norm."""
    nodes = layer_nodes(scale="w")
    inputs = [("x", FLOAT, ["b", "N"]), ("w", FLOAT, ["M"])]
    model = make_model(nodes, inputs, [("y", FLOAT, ["b", "N"])], [const("eps", 1e-5, np.float32)])
    optimized, report = optimize(model)
    assert "Mul" in [n.op_type for n in optimized.graph.node]
    assert any("is not one row" in m.reason for m in report.near_misses), report.near_misses


def test_channels_first_rms_norm_over_a_symbolic_channel_dim() -> None:
    """NCHW with C symbolic, the scale `w[:, None, None]` of 8 channels: the scale pins C, the proof runs at 8."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[1]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    inits = [const("eps", 1e-6, np.float32), const("w", np.linspace(0.5, 1.5, 8).reshape(8, 1, 1), np.float32)]
    model = make_model(nodes, [("x", FLOAT, ["n", "C", "h", "w"])], [("y", FLOAT, ["n", "C", "h", "w"])], inits)
    optimized, report = assert_fused(model, {"x": [2, 8, 3, 5]}, ["RMSNorm"])
    assert [n.op_type for n in optimized.graph.node] == ["Transpose", "RMSNorm", "Transpose"], report.near_misses


def test_a_scale_of_ones_over_a_named_dim_is_kept_as_the_row() -> None:
    """Scale 1 and bias 0 of 16 elements over a last dim N: they scale nothing but fix N = 16, so the op keeps them
    (the proof reads the size from them) instead of the norm becoming a near-miss."""
    inits = [const("eps", 1e-5, np.float32), const("w", np.ones(D), np.float32), const("b", np.zeros(D), np.float32)]
    model = make_model(layer_nodes(scale="w", bias="b"), [("x", FLOAT, ["b", "N"])], [("y", FLOAT, ["b", "N"])], inits)
    optimized, report = assert_fused(model, {"x": [3, D]}, ["LayerNorm"])
    assert [list(n.input) for n in optimized.graph.node] == [["x", "w", "b"]], report.near_misses


def test_an_activation_multiplied_onto_the_norm_is_no_runtime_scale() -> None:
    """A graph input [b, s, H] (a gate) times the norm is an activation, not the norm's weights: the norm is fused
    and the Mul stays (a named dim makes a run-time weight only in a 1-D row)."""
    nodes = [*layer_nodes(y="n"), helper.make_node("Mul", ["n", "gate"], ["y"])]
    inputs = [("x", FLOAT, ["b", "s", D]), ("gate", FLOAT, ["b", "s", D])]
    model = make_model(nodes, inputs, [("y", FLOAT, ["b", "s", D])], [const("eps", 1e-5, np.float32)])
    optimized, report = assert_fused(model, {"x": [2, 3, D], "gate": [2, 3, D]}, ["LayerNorm"])
    assert [n.op_type for n in optimized.graph.node] == ["LayerNorm", "Mul"], report.near_misses


def test_fp16_sum_over_the_row_size_cast_to_fp16() -> None:
    """TorchScript's export of `x.sum(-1, keepdim=True) / x.shape[-1]` in an fp16 module: the size is cast to fp16.
    Folding it with symbolic dims read as two huge sizes overflowed both to inf, which looked like a constant."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "minus1"], ["nd"], axis=0),
        helper.make_node("Cast", ["nd"], ["nf"], to=FLOAT16),
        *_mean("x", "mu", "div"),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        *_mean("sq", "var", "div"),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["nw"]),
        helper.make_node("Add", ["nw", "b"], ["y"]),
    ]
    inits = [const("eps", 1e-5, np.float16), const("axes", np.array([-1], np.int64)), const("minus1", -1, np.int64)]
    inputs = [("x", FLOAT16, ["B", "S", "N"]), ("w", FLOAT16, ["N"]), ("b", FLOAT16, ["N"])]
    model = make_model(nodes, inputs, [("y", FLOAT16, ["B", "S", "N"])], inits, opset=14)
    optimized, report = assert_fused(model, SHAPES, ["LayerNorm"], rtol=4e-3, atol=4e-3)
    assert [n.op_type for n in optimized.graph.node] == ["LayerNorm"], report.near_misses
