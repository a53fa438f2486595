"""Each spelling of a decomposed norm, written out as an ONNX graph: fused into the right op, same outputs.

Covers ReduceMean axes as attribute and input, keepdims=0 + Unsqueeze, ReduceSum / N, the duplicated mean, Pow
and Mul squares, E[x^2] - E[x]^2, every reciprocal-square-root spelling, operand orders, scale before the division,
epsilon as a scalar or one-element tensor of any float type from an initializer or a Constant node, folded Gemma
`1 + w`, no scale, no bias, several trailing axes, fp16 with and without Casts, the residual Add, channels first.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from rewrite_support import (
    DOUBLE,
    FLOAT,
    FLOAT16,
    assert_fused,
    assert_not_less_accurate,
    const,
    layer_nodes,
    make_model,
    random_feeds,
    rms_divided_by_dim,
    rms_nodes,
    run,
)

D = 16
X = [("x", FLOAT, ["b", "s", D])]
Y = [("y", FLOAT, None)]
SHAPES = {"x": [2, 3, D]}
rng = np.random.default_rng(1)
W = (rng.random(D) + 0.5).astype(np.float32)
B = rng.standard_normal(D).astype(np.float32)


def mean(name, src, out, opset=17, keepdims=1, axes=(-1,)):
    if opset >= 18:
        return [helper.make_node("ReduceMean", [src, f"{name}_axes"], [out], keepdims=keepdims, name=name)]
    return [helper.make_node("ReduceMean", [src], [out], axes=list(axes), keepdims=keepdims, name=name)]


def layer_norm_graph(*, opset=17, square="pow", rsqrt="div", scale="after", eps_kind="initializer", dup=False):
    nodes = mean("m", "x", "mu", opset)
    nodes += [helper.make_node("Sub", ["x", "mu"], ["d"])]
    if dup:
        nodes += [*mean("m2", "x", "mu2", opset), helper.make_node("Sub", ["x", "mu2"], ["d2"])]
    dv = "d2" if dup else "d"
    if square == "pow":
        nodes.append(helper.make_node("Pow", [dv, "two"], ["sq"]))
    else:
        nodes.append(helper.make_node("Mul", [dv, dv], ["sq"]))
    nodes += mean("v", "sq", "var", opset)
    if eps_kind == "constant":
        nodes.append(helper.make_node("Constant", [], ["eps"], value=helper.make_tensor("e", FLOAT, [1], [1e-5])))
    nodes.append(helper.make_node("Add", ["eps", "var"], ["ve"]))
    num = "d"
    if scale == "before":
        nodes.append(helper.make_node("Mul", ["w", "d"], ["dw"]))
        num = "dw"
    if rsqrt == "div":
        nodes += [helper.make_node("Sqrt", ["ve"], ["s"]), helper.make_node("Div", [num, "s"], ["n"])]
    elif rsqrt == "reciprocal":
        nodes += [
            helper.make_node("Sqrt", ["ve"], ["s"]),
            helper.make_node("Reciprocal", ["s"], ["r"]),
            helper.make_node("Mul", ["r", num], ["n"]),
        ]
    elif rsqrt == "one_over":
        nodes += [
            helper.make_node("Sqrt", ["ve"], ["s"]),
            helper.make_node("Div", ["one", "s"], ["r"]),
            helper.make_node("Mul", [num, "r"], ["n"]),
        ]
    else:  # pow -0.5
        nodes += [helper.make_node("Pow", ["ve", "mhalf"], ["r"]), helper.make_node("Mul", [num, "r"], ["n"])]
    if scale == "after":
        nodes.append(helper.make_node("Mul", ["n", "w"], ["nw"]))
    else:
        nodes.append(helper.make_node("Identity", ["n"], ["nw"]))
    nodes.append(helper.make_node("Add", ["b", "nw"], ["y"]))
    inits = [const("two", 2.0, np.float32), const("one", 1.0, np.float32), const("mhalf", -0.5, np.float32)]
    inits += [const("w", W), const("b", B), const("m_axes", [-1], np.int64), const("m2_axes", [-1], np.int64)]
    inits += [const("v_axes", [-1], np.int64)]
    if eps_kind == "initializer":
        inits.append(const("eps", 1e-5, np.float32))
    return make_model(nodes, X, Y, inits, opset=opset)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("rsqrt", ["div", "reciprocal", "one_over", "pow"])
def test_layer_norm_spellings(opset, square, rsqrt):
    optimized, report = assert_fused(layer_norm_graph(opset=opset, square=square, rsqrt=rsqrt), SHAPES, ["LayerNorm"])
    assert report.norms[0].epsilon == pytest.approx(1e-5, rel=1e-6)
    assert len(optimized.graph.node) == 1


@pytest.mark.parametrize("scale", ["after", "before"])
@pytest.mark.parametrize("eps_kind", ["initializer", "constant"])
@pytest.mark.parametrize("dup", [False, True])
def test_layer_norm_scale_placement_epsilon_source_duplicated_mean(scale, eps_kind, dup):
    assert_fused(layer_norm_graph(scale=scale, eps_kind=eps_kind, dup=dup), SHAPES, ["LayerNorm"], rtol=1e-4, atol=1e-4)


def test_keepdims_zero_unsqueeze_and_reduce_sum_over_n():
    nodes = [
        helper.make_node("ReduceSum", ["x", "axes"], ["sum"], keepdims=0),
        helper.make_node("Div", ["sum", "n"], ["mu0"]),
        helper.make_node("Unsqueeze", ["mu0", "axes"], ["mu"]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[2], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["y"]),
    ]
    inits = [const("axes", [-1], np.int64), const("n", float(D), np.float32), const("eps", [1e-6], np.float32)]
    _, report = assert_fused(make_model(nodes, X, Y, inits, opset=17), SHAPES, ["LayerNorm"])
    assert report.norms[0].epsilon == pytest.approx(1e-6, rel=1e-6)


def test_variance_as_mean_square_minus_square_mean():
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Mul", ["x", "x"], ["xx"]),
        helper.make_node("ReduceMean", ["xx"], ["ms"], axes=[-1]),
        helper.make_node("Mul", ["mu", "mu"], ["mu2"]),
        helper.make_node("Sub", ["ms", "mu2"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    inits = [const("eps", 1e-5, np.float32), const("w", W)]
    assert_fused(make_model(nodes, X, Y, inits, opset=13), SHAPES, ["LayerNorm"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("restore_after", ["add", "sqrt", "reciprocal"])
def test_statistic_with_dropped_dims_restored_later(restore_after):
    """`x / sqrt(sum(x*x, -1) / D + eps).unsqueeze(-1)`: the dims come back after the epsilon or the square root."""
    steps = {"add": ["ve", "s", "r"], "sqrt": ["s", "r"], "reciprocal": ["r"]}[restore_after]
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["ss"], keepdims=0),
        helper.make_node("Div", ["ss", "n"], ["ms"]),
    ]
    chain = [("Add", ["ms", "eps"], "ve"), ("Sqrt", ["ve"], "s"), ("Reciprocal", ["s"], "r")]
    for op, inputs, out in chain:
        operands = list(inputs)
        if out == steps[0]:
            nodes.append(helper.make_node("Unsqueeze", [inputs[0], "axes"], [inputs[0] + "_u"]))
            operands[0] = inputs[0] + "_u"
        nodes.append(helper.make_node(op, operands, [out]))
    nodes += [helper.make_node("Mul", ["x", "r"], ["n0"]), helper.make_node("Mul", ["n0", "w"], ["y"])]
    inits = [const("axes", [-1], np.int64), const("n", float(D), np.float32), const("eps", 1e-6, np.float32)]
    inits.append(const("w", W))
    _, report = assert_fused(make_model(nodes, X, Y, inits, opset=17), SHAPES, ["RMSNorm"])
    assert report.norms[0].epsilon == pytest.approx(1e-6, rel=1e-6)


def test_variance_restored_by_shape_arithmetic_like_dynamo_broadcast_in_dim():
    """dynamo's `x.var(-1, keepdim=True)`: ReduceMean(keepdims=0), then Reshape and Expand to shapes computed from
    `Shape(x)`; the `Shape(x)` is also read by the rest of the graph, so it stays."""
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mu"], keepdims=1),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var0"], keepdims=0),
        helper.make_node("Shape", ["var0"], ["vs"]),
        helper.make_node("Concat", ["vs", "one_i"], ["vs1"], axis=0),
        helper.make_node("Reshape", ["var0", "vs1"], ["var1"]),
        helper.make_node("Shape", ["x"], ["xs"], start=0, end=2),
        helper.make_node("Concat", ["xs", "one_i"], ["xs1"], axis=0),
        helper.make_node("Expand", ["var1", "xs1"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", ["d", "r"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["nw"]),
        helper.make_node("Add", ["nw", "b"], ["y"]),
        helper.make_node("Cast", ["xs"], ["y_batch_seq"], to=FLOAT),
    ]
    inits = [const("axes", [-1], np.int64), const("one_i", [1], np.int64), const("eps", 1e-5, np.float32)]
    inits += [const("w", W), const("b", B)]
    model = make_model(nodes, X, [*Y, ("y_batch_seq", FLOAT, [2])], inits, opset=18)
    optimized, _ = assert_fused(model, SHAPES, ["LayerNorm"], rtol=1e-4, atol=1e-4)
    assert "Shape" in {n.op_type for n in optimized.graph.node}


def test_divisor_read_from_the_static_last_dim():
    """TorchScript's `sum(x*x, -1) / x.shape[-1]`: Cast(Gather(Shape(x), -1)), a constant since the dim is static."""
    nodes, inits = rms_divided_by_dim(-1)
    optimized, _ = assert_fused(make_model(nodes, X, Y, inits, opset=17), SHAPES, ["RMSNorm"])
    assert [n.op_type for n in optimized.graph.node] == ["RMSNorm"]


def distributed_layer_norm(form: str, *, mean_scale=None):
    """`tf.nn.batch_normalization`'s formula, as tf2onnx exports TF/Keras LayerNormalization: x * s + (beta - mean
    * s) with s = gamma * rsqrt(var + eps); Keras 3 adds (-mean) * s + beta; without beta: x * s - mean * s."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),  # tf2onnx's SquaredDifference
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Reciprocal", ["sd"], ["inv"]),
        helper.make_node("Mul", ["inv", "w"], ["s"]),
        helper.make_node("Mul", ["x", "s"], ["xs"]),
    ]
    s_mean = "s"
    if mean_scale is not None:
        nodes.append(helper.make_node("Mul", ["inv", "w2"], ["s2"]))
        s_mean = "s2"
    if form == "tf2onnx":
        nodes += [
            helper.make_node("Mul", ["mu", s_mean], ["ms"]),
            helper.make_node("Sub", ["b", "ms"], ["off"]),
            helper.make_node("Add", ["xs", "off"], ["y"]),
        ]
    elif form == "keras3":
        nodes += [
            helper.make_node("Neg", ["mu"], ["nmu"]),
            helper.make_node("Mul", ["nmu", s_mean], ["res0"]),
            helper.make_node("Add", ["res0", "b"], ["res"]),
            helper.make_node("Add", ["xs", "res"], ["y"]),
        ]
    else:  # no beta
        nodes += [helper.make_node("Mul", [s_mean, "mu"], ["ms"]), helper.make_node("Sub", ["xs", "ms"], ["y"])]
    inits = [const("eps", 1e-3, np.float32), const("w", W), const("b", B)]
    if mean_scale is not None:
        inits.append(const("w2", mean_scale))
    return make_model(nodes, X, Y, inits, opset=13)


@pytest.mark.parametrize("form", ["tf2onnx", "keras3", "no_beta"])
def test_layer_norm_distributed_over_the_sum(form):
    _, report = assert_fused(distributed_layer_norm(form), SHAPES, ["LayerNorm"], rtol=1e-4, atol=1e-4)
    assert report.norms[0].epsilon == pytest.approx(1e-3, rel=1e-6)


@pytest.mark.parametrize("clamp", ["Max", "Relu", "Clip"])
def test_variance_clamped_at_zero(clamp):
    """Flax's fast variance: max(E[x^2] - E[x]^2, 0), a clamp that changes nothing in exact arithmetic."""
    clamp_node = {
        "Max": helper.make_node("Max", ["zero", "var0"], ["var"]),
        "Relu": helper.make_node("Relu", ["var0"], ["var"]),
        "Clip": helper.make_node("Clip", ["var0", "zero"], ["var"]),
    }[clamp]
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Mul", ["x", "x"], ["xx"]),
        helper.make_node("ReduceMean", ["xx"], ["ms"], axes=[-1]),
        helper.make_node("Mul", ["mu", "mu"], ["mu2"]),
        helper.make_node("Sub", ["ms", "mu2"], ["var0"]),
        clamp_node,
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["nw"]),
        helper.make_node("Add", ["nw", "b"], ["y"]),
    ]
    inits = [const("eps", 1e-6, np.float32), const("zero", 0.0, np.float32), const("w", W), const("b", B)]
    assert_fused(make_model(nodes, X, Y, inits, opset=13), SHAPES, ["LayerNorm"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_reduce_sum_square_over_n(kind):
    """ReduceSumSquare(t) / N as the mean square (RMSNorm, t = x) or the variance (LayerNorm, t = x - mean)."""
    source = "x" if kind == "rms" else "d"
    nodes = (
        []
        if kind == "rms"
        else [
            helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
            helper.make_node("Sub", ["x", "mu"], ["d"]),
        ]
    )
    nodes += [
        helper.make_node("ReduceSumSquare", [source], ["ss"], axes=[-1]),
        helper.make_node("Div", ["ss", "n"], ["stat"]),
        helper.make_node("Add", ["stat", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", [source, "s"], ["n0"]),
        helper.make_node("Mul", ["n0", "w"], ["y"]),
    ]
    inits = [const("n", float(D), np.float32), const("eps", 1e-6, np.float32), const("w", W)]
    expected = ["RMSNorm" if kind == "rms" else "LayerNorm"]
    assert_fused(make_model(nodes, X, Y, inits, opset=13), SHAPES, expected, rtol=1e-4, atol=1e-4)


def rms_graph(*, dtype=FLOAT, eps_dtype=np.float32, gemma=False, cast=False, eps_shape=()):
    xt = dtype
    nodes = []
    src = "x"
    if cast:
        nodes.append(helper.make_node("Cast", ["x"], ["x32"], to=FLOAT))
        src = "x32"
    nodes += [
        helper.make_node("Pow", [src, "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", [src, "r"], ["n"]),
    ]
    compute = FLOAT if cast else dtype
    np_compute = np.float32 if compute == FLOAT else np.float16
    if gemma:
        nodes += [
            helper.make_node("Add", ["one", "w"], ["w1"]),
            helper.make_node("Mul", ["n", "w1"], ["nw"]),
            helper.make_node("Cast", ["nw"], ["y"], to=xt),
        ]
        inits = [const("one", 1.0, np.float32), const("w", (W - 1).astype(np.float32))]
    elif cast:
        nodes += [helper.make_node("Cast", ["n"], ["n16"], to=xt), helper.make_node("Mul", ["w", "n16"], ["y"])]
        inits = [const("w", W.astype(np.float16 if xt == FLOAT16 else np.float32))]
    else:
        nodes.append(helper.make_node("Mul", ["n", "w"], ["y"]))
        inits = [const("w", W.astype(np_compute))]
    inits += [const("two", 2.0, np_compute), const("eps", np.full(eps_shape, 1e-6, dtype=eps_dtype))]
    if eps_dtype != np_compute:
        nodes.insert(2 if not cast else 3, helper.make_node("Cast", ["eps"], ["eps_c"], to=compute))
        for node in nodes:
            if node.op_type == "Add" and "eps" in node.input:
                node.input[1] = "eps_c"
    return make_model(nodes, [("x", xt, ["b", "s", D])], [("y", xt, None)], inits, opset=17)


def test_rms_norm_fp32():
    assert_fused(rms_graph(), SHAPES, ["RMSNorm"])


def test_rms_norm_epsilon_one_element_fp16_constant_cast():
    _, report = assert_fused(rms_graph(eps_dtype=np.float16, eps_shape=(1,)), SHAPES, ["RMSNorm"])
    assert report.norms[0].epsilon == float(np.float16(1e-6))


def test_rms_norm_fp16_llama_casts():
    """LLaMA rounds the normalised value to fp16 and multiplies in fp16; the fused op rounds once, at its output:
    never farther from the float64 result than the graph (casts.op_rounding)."""
    model = rms_graph(dtype=FLOAT16, cast=True)
    optimized, report = assert_fused(model, SHAPES, ["RMSNorm"], rtol=2e-3, atol=2e-3)
    attrs = report.norms[0].attributes
    assert attrs["normalized_type"] == 0 and attrs["multiply_type"] == 0
    assert "fp16 before scale" in report.norms[0].cast_placement  # where the graph rounds, as reported
    assert_not_less_accurate(model, optimized, random_feeds(model, SHAPES))


def test_rms_norm_fp16_gemma_folds_one_plus_w():
    optimized, report = assert_fused(
        rms_graph(dtype=FLOAT16, cast=True, gemma=True), SHAPES, ["RMSNorm"], rtol=2e-3, atol=2e-3
    )
    attrs = report.norms[0].attributes
    assert attrs["normalized_type"] == 0 and attrs["multiply_type"] == 0
    scale = [i for i in optimized.graph.initializer if i.name.startswith("onnx_norm_scale")]
    assert len(scale) == 1 and scale[0].data_type == FLOAT


def test_rms_norm_fp16_without_casts():
    model = rms_graph(dtype=FLOAT16)
    optimized, report = assert_fused(model, SHAPES, ["RMSNorm"], rtol=5e-3, atol=5e-3)
    assert report.norms[0].attributes["normalized_type"] == 0  # statistics and steps in fp32, one rounding
    assert_not_less_accurate(model, optimized, random_feeds(model, SHAPES))


def test_rms_norm_fp64_epsilon_in_fp32_graph():
    assert_fused(rms_graph(eps_dtype=np.float64), SHAPES, ["RMSNorm"])


def test_layer_norm_no_scale_no_bias_two_axes():
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-2, -1]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[1, 2]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["y"]),
    ]
    inits = [const("two", 2.0, np.float32), const("eps", 1e-5, np.float32)]
    model = make_model(nodes, [("x", FLOAT, ["b", 3, D])], Y, inits)
    _, report = assert_fused(model, SHAPES, ["LayerNorm"])
    assert report.norms[0].attributes["axis"] == -2


def test_residual_add_becomes_skip_and_sum_is_kept():
    nodes = [
        helper.make_node("Add", ["a", "x"], ["h"]),
        helper.make_node("Pow", ["h", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["h", "s"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
        helper.make_node("Add", ["h", "y"], ["z"]),
    ]
    inits = [const("two", 2.0, np.float32), const("eps", 1e-6, np.float32), const("w", W)]
    model = make_model(nodes, [*X, ("a", FLOAT, ["b", "s", D])], [("z", FLOAT, None)], inits)
    _, report = assert_fused(model, {"x": [2, 3, D], "a": [2, 3, D]}, ["SkipRMSNorm"])
    assert report.norms[0].residual_sum_kept
    _, report = assert_fused(model, {"x": [2, 3, D], "a": [2, 3, D]}, ["RMSNorm"], disable=["skip_rms_norm"])


def test_channels_first_layer_norm():
    c = 8
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[1]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
        helper.make_node("Mul", ["w", "n"], ["nw"]),
        helper.make_node("Add", ["nw", "b"], ["y"]),
    ]
    inits = [
        const("two", 2.0, np.float32),
        const("eps", 1e-6, np.float32),
        const("w", (rng.random((c, 1, 1)) + 0.5).astype(np.float32)),
        const("b", rng.standard_normal((c, 1, 1)).astype(np.float32)),
    ]
    model = make_model(nodes, [("x", FLOAT, ["n", c, "h", "w"])], [("y", FLOAT, ["n", c, "h", "w"])], inits)
    optimized, report = assert_fused(model, {"x": [2, c, 3, 5]}, ["LayerNorm"])
    assert report.norms[0].rule == "layer_norm_channels_first"
    assert [n.op_type for n in optimized.graph.node].count("Transpose") == 2


def _channels_first_rms_nodes(spelling: str, affine: str) -> list[onnx.NodeProto]:
    """`x * rsqrt(x.pow(2).mean(1, keepdim=True) + eps) * w[:, None, None]` (ConvNeXt-V2, diffusion code) as the
    TorchScript exporter writes it (Pow, ReduceMean, Div(1, Sqrt)) or dynamo (Mul(x, x), Reciprocal(Sqrt)), the
    scale after the normalisation, before it (`w * x * rsqrt(..)`) or absent."""
    square = (
        helper.make_node("Pow", ["x", "two"], ["sq"])
        if spelling == "ts"
        else helper.make_node("Mul", ["x"] * 2, ["sq"])
    )
    rsqrt = (
        helper.make_node("Div", ["one", "s"], ["r"])
        if spelling == "ts"
        else helper.make_node("Reciprocal", ["s"], ["r"])
    )
    nodes = [
        square,
        helper.make_node("ReduceMean", ["sq", "axes1"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        rsqrt,
    ]
    if affine == "after":
        return [*nodes, helper.make_node("Mul", ["x", "r"], ["n"]), helper.make_node("Mul", ["n", "w"], ["y"])]
    if affine == "before":
        return [helper.make_node("Mul", ["w", "x"], ["wx"]), *nodes, helper.make_node("Mul", ["wx", "r"], ["y"])]
    return [*nodes, helper.make_node("Mul", ["x", "r"], ["y"])]


def _channels_first_rms_model(spelling: str, affine: str, w_shape: tuple[int, ...], opset: int = 18):
    inits = [
        const("two", 2.0, np.float32),
        const("one", 1.0, np.float32),
        const("eps", 1e-6, np.float32),
        const("axes1", np.array([1], np.int64)),
        const("w", (rng.random(w_shape) + 0.5).astype(np.float32)),
    ]
    nodes = _channels_first_rms_nodes(spelling, affine)
    return make_model(nodes, [("x", FLOAT, ["n", 8, "h", "w"])], [("y", FLOAT, ["n", 8, "h", "w"])], inits, opset)


@pytest.mark.parametrize("w_shape", [(8, 1, 1), (1, 8, 1, 1)])
@pytest.mark.parametrize("affine", ["after", "before", "none"])
@pytest.mark.parametrize("spelling", ["ts", "dynamo"])
def test_channels_first_rms_norm(spelling, affine, w_shape):
    model = _channels_first_rms_model(spelling, affine, w_shape)
    optimized, report = assert_fused(model, {"x": [2, 8, 3, 5]}, ["RMSNorm"])
    assert [n.rule for n in report.norms] == ["rms_norm_channels_first"]
    ops = [n.op_type for n in optimized.graph.node]
    assert ops.count("Transpose") == 2 and "ReduceMean" not in ops and "Sqrt" not in ops


@pytest.mark.parametrize(
    ("target", "op", "opset"), [("ort", "SimplifiedLayerNormalization", 18), ("onnx", "RMSNormalization", 23)]
)
def test_channels_first_rms_norm_other_targets(target, op, opset):
    from onnx_norm.rewrite import optimize

    model = _channels_first_rms_model("dynamo", "after", (8, 1, 1), opset)
    optimized, report = optimize(model, target=target)
    assert [n.op_type for n in optimized.graph.node] == ["Transpose", op, "Transpose"], report.near_misses
    feeds = {"x": rng.standard_normal((2, 8, 3, 5)).astype(np.float32)}
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_double_precision_input_is_a_near_miss():
    nodes = rms_nodes()
    model = make_model(nodes, [("x", DOUBLE, ["b", D])], [("y", DOUBLE, None)], [const("eps", 1e-6, np.float64)])
    from rewrite_support import assert_not_fused

    assert_not_fused(model, {"x": [3, D]}, reason="not supported by the fused ops")


def test_bf16_llama_casts_are_proven_and_fused():
    """bf16 norms are proven with the numpy interpreter (ONNX Runtime has few bf16 CPU kernels to compare on)."""
    from onnx import TensorProto

    from onnx_norm.rewrite import optimize

    bf16 = TensorProto.BFLOAT16
    nodes = [
        helper.make_node("Cast", ["x"], ["x32"], to=FLOAT),
        helper.make_node("Mul", ["x32", "x32"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x32", "s"], ["n"]),
        helper.make_node("Cast", ["n"], ["nb"], to=bf16),
        helper.make_node("Mul", ["nb", "w"], ["y"]),
    ]
    w = helper.make_tensor("w", bf16, [D], W.tolist())
    model = make_model(nodes, [("x", bf16, ["b", D])], [("y", bf16, ["b", D])], [const("eps", 1e-6, np.float32), w])
    optimized, report = optimize(model)
    assert [n.op_type for n in optimized.graph.node if n.domain == "onnx_norm"] == ["RMSNorm"]
    attrs = report.norms[0].attributes
    assert attrs["normalized_type"] == 0 and attrs["multiply_type"] == 0 and attrs["output_type"] == 0


def test_bf16_norm_without_casts_is_fused_like_the_fp16_one():
    """A bf16 model computing the norm in bf16 (dynamo export of a bf16 module): the formula is proven in float64,
    so the bf16 input must be widened like every other float (ml_dtypes' bfloat16 is not numpy kind "f")."""
    from onnx import TensorProto

    from onnx_norm.ops import reference
    from onnx_norm.rewrite import optimize

    bf16 = TensorProto.BFLOAT16
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", ["x", "r"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    w = helper.make_tensor("w", bf16, [D], W.tolist())
    initializers = [
        helper.make_tensor("two", bf16, [], [2.0]),
        helper.make_tensor("eps", bf16, [], [1e-6]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [-1]),
        w,
    ]
    model = make_model(nodes, [("x", bf16, ["b", D])], [("y", bf16, ["b", D])], initializers, opset=18)
    optimized, report = optimize(model)
    assert [n.op_type for n in optimized.graph.node if n.domain == "onnx_norm"] == ["RMSNorm"]
    attrs = report.norms[0].attributes
    assert attrs["normalized_type"] == 0 and attrs["multiply_type"] == 0  # rounded once, at the output
    # epsilon keeps its bf16 value, as the graph adds it.
    assert attrs["epsilon"] == pytest.approx(float(np.asarray(1e-6).astype(reference.np_dtype(bf16))), rel=1e-6)


def test_input_without_shape_uses_axes_from_the_end_and_the_scale():
    """Shape inference often stops after attention's computed Reshapes; a trailing-axes norm needs no rank."""
    from onnx import TensorProto

    from onnx_norm.rewrite import optimize

    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["h"]),  # a runtime shape: inference loses the rank
        *layer_nodes("h", scale="w", bias="b"),
    ]
    inits = [const("eps", 1e-5, np.float32), const("w", W), const("b", B)]
    model = make_model(nodes, [*X, ("shape", TensorProto.INT64, ["r"])], [("y", FLOAT, ["rows", D])], inits)
    optimized, report = optimize(model)
    assert [n.op_type for n in optimized.graph.node if n.domain == "onnx_norm"] == ["LayerNorm"]
    assert report.norms[0].axes == [-1]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, D)).astype(np.float32)}
    feeds["shape"] = np.array([6, D], dtype=np.int64)
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opset", [9, 10])
def test_old_opsets_fuse_and_run_from_the_functions(opset):
    """paddle.onnx.export still writes opset 9 by default: the fused ops' model-local functions are written at the
    model's opset (Slice with attribute bounds before 10), so the model runs without the library too."""
    nodes = layer_nodes(scale="w", bias="b")
    inits = [const("eps", [1e-5], np.float32), const("w", W), const("b", B)]
    model = make_model(nodes, X, Y, inits, opset=opset)
    optimized, _ = assert_fused(model, SHAPES, ["LayerNorm"])
    assert {f.opset_import[0].version for f in optimized.functions} == {opset}
    onnx.checker.check_model(optimized, full_check=True)
