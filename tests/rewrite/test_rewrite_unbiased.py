"""LayerNorm with an unbiased variance (`x.var(-1, unbiased=True)`): fused as a LayerNorm with epsilon
`eps * (N-1)/N` and the scale times `sqrt((N-1)/N)`; other divisors are left alone."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper
from rewrite_support import FLOAT, assert_fused, assert_not_fused, const, make_model, run

D = 16
rng = np.random.default_rng(12)
W = (rng.random(D) + 0.5).astype(np.float32)
B = rng.standard_normal(D).astype(np.float32)


def hand_written(divisor: float, *, scale: bool = True, square: str = "mul") -> onnx.ModelProto:
    """`(x - mean) / sqrt(sum((x - mean)^2) / divisor + eps) * w + b` with ReduceSum (or ReduceSumSquare)."""
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mu"]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
    ]
    if square == "mul":
        nodes += [helper.make_node("Mul", ["d", "d"], ["sq"]), helper.make_node("ReduceSum", ["sq", "axes"], ["ss"])]
    else:
        nodes.append(helper.make_node("ReduceSumSquare", ["d", "axes"], ["ss"]))
    nodes += [
        helper.make_node("Div", ["ss", "n"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["nrm"]),
    ]
    inits = [const("axes", [-1], np.int64), const("n", divisor, np.float32), const("eps", 1e-3, np.float32)]
    if scale:
        nodes += [helper.make_node("Mul", ["nrm", "w"], ["nw"]), helper.make_node("Add", ["nw", "b"], ["y"])]
        inits += [const("w", W), const("b", B)]
    else:
        nodes.append(helper.make_node("Identity", ["nrm"], ["y"]))
    return make_model(nodes, [("x", FLOAT, ["b", "s", D])], [("y", FLOAT, None)], inits, opset=18)


@pytest.mark.parametrize("square", ["mul", "sum_square"])
@pytest.mark.parametrize("scale", [True, False])
def test_unbiased_variance_is_a_layer_norm(square, scale):
    # A large epsilon makes a wrong correction of epsilon visible at the tolerance of the comparison.
    _optimized, report = assert_fused(hand_written(D - 1, scale=scale, square=square), {"x": [2, 3, D]}, ["LayerNorm"])
    (norm,) = report.norms
    assert norm.variant == "unbiased variance"
    assert norm.epsilon == pytest.approx(1e-3 * (D - 1) / D, rel=1e-6)


@pytest.mark.parametrize("divisor", [D - 2, D + 1, 1.0])
def test_other_divisors_are_not_a_variance(divisor):
    assert_not_fused(hand_written(divisor), {"x": [2, 3, D]})


def test_unbiased_mean_square_is_not_an_rms_norm():
    """Bessel's correction belongs to a variance: `sum(x^2) / (N-1)` is no RMSNorm's statistic."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["ss"]),
        helper.make_node("Div", ["ss", "n"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["y"]),
    ]
    inits = [const("axes", [-1], np.int64), const("n", D - 1, np.float32), const("eps", 1e-5, np.float32)]
    model = make_model(nodes, [("x", FLOAT, ["b", "s", D])], [("y", FLOAT, None)], inits, opset=18)
    assert_not_fused(model, {"x": [2, 3, D]})


@pytest.mark.parametrize("dynamo", [False, True])
def test_torch_var_unbiased_exported(dynamo):
    torch = pytest.importorskip("torch")

    class UnbiasedLayerNorm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.from_numpy(W))
            self.b = torch.nn.Parameter(torch.from_numpy(B))

        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            var = x.var(-1, unbiased=True, keepdim=True)
            return (x - mean) / torch.sqrt(var + 1e-5) * self.w + self.b

    example = torch.randn(2, 3, D)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            model = torch.onnx.export(UnbiasedLayerNorm(), (example,), dynamo=True, opset_version=18).model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(
                UnbiasedLayerNorm(), (example,), buffer, opset_version=17, dynamo=False, input_names=["x"]
            )
            model = onnx.load_from_string(buffer.getvalue())
    name = model.graph.input[0].name
    _optimized, report = assert_fused(model, {name: [2, 3, D]}, ["LayerNorm"])
    assert report.norms[0].variant == "unbiased variance"


@pytest.mark.parametrize("target", ["onnx-norm", "onnx", "ort"])
def test_unbiased_variance_in_float16_fuses_with_a_float32_scale(target: str) -> None:
    """The whole graph in float16: w * sqrt((N-1)/N) is not a float16 value, so the new Scale and Bias are float32
    (the standard LayerNormalization then runs on X widened, between Casts); the numbers are the original's."""
    from onnxconverter_common import float16

    from onnx_norm.rewrite import optimize

    model = float16.convert_float_to_float16(hand_written(D - 1.0), keep_io_types=False)
    optimized, report = optimize(model, target=target)
    norms = [n for n in optimized.graph.node if "Norm" in n.op_type]
    assert len(norms) == 1 and not report.near_misses, report.near_misses
    made = [i for i in optimized.graph.initializer if i.name.startswith("onnx_norm_")]
    assert made and {i.data_type for i in made} == {onnx.TensorProto.FLOAT}
    feeds = {"x": rng.standard_normal((2, 3, D)).astype(np.float16)}
    want, got = run(model, feeds)[0], run(optimized, feeds)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
