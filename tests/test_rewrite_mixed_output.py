"""Mixed-precision norms, fp16/bf16 in and fp32 out: the input cast to fp32, the norm computed in fp32 and its fp32
result read as it is (an fp32 island of an fp16 model). Every target fuses it without rounding through the input's
type: onnx-norm as the op on X cast to fp32 (exact: widening is, and the kernels compute from the widened X;
ONNX Runtime types a custom op's Y like X unless the op's shape inference runs, docs/ops.md), or, for a residual
sum, as the Skip op with output_type float32 where X's rank is known, onnx as
LayerNormalization on the cast input, ort as its contrib ops where their CPU kernels take X and Y of two types."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from test_rewrite_support import FLOAT, FLOAT16, const, layer_nodes, make_model, random_feeds, rms_nodes, run

import onnx_norm
from onnx_norm.ops.schema import DOMAIN
from onnx_norm.rewrite import optimize

D = 16
SHAPES = {"x": [2, 3, D], "a": [2, 3, D], "b": [2, 3, D]}


def _island(kind: str, *, residual: bool = False) -> onnx.ModelProto:
    """fp16 x (or an fp16 residual sum a + b), Cast to fp32, the norm and its fp32 scale/bias in fp32, fp32 out."""
    nodes = [helper.make_node("Cast", ["x"], ["x32"], to=FLOAT)]
    inputs = [("x", FLOAT16, ["b", "s", D])]
    if residual:  # the sum rounded to fp16 by the graph's own Add, then widened
        nodes.insert(0, helper.make_node("Add", ["a", "b"], ["x"]))
        inputs = [("a", FLOAT16, ["b", "s", D]), ("b", FLOAT16, ["b", "s", D])]
    if kind == "layer":
        nodes += layer_nodes("x32", "y", scale="w", bias="bias")
    else:  # the square taken with Pow, as the TorchScript exporter writes x.pow(2)
        nodes += [*rms_nodes("x32", "n"), helper.make_node("Mul", ["n", "w"], ["y"])]
        nodes[1 + residual] = helper.make_node("Pow", ["x32", "two"], ["sq"])
    inits = [
        const("eps", 1e-5, np.float32),
        const("two", 2.0, np.float32),
        const("w", np.linspace(0.5, 1.5, D), np.float32),
        const("bias", np.linspace(-1, 1, D), np.float32),
    ]
    return make_model(nodes, inputs, [("y", FLOAT, ["b", "s", D])], inits)


def _with_library(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(
        model.SerializeToString(), onnx_norm.session_options(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_fp16_in_fp32_out_is_one_op_on_the_widened_input(kind: str) -> None:
    model = _island(kind)
    optimized, report = optimize(model)
    ops = [(n.domain, n.op_type) for n in optimized.graph.node]
    assert ops == [("", "Cast"), (DOMAIN, "LayerNorm" if kind == "layer" else "RMSNorm")], report.near_misses
    cast, norm = optimized.graph.node
    assert list(cast.input) == ["x"] and norm.input[0] == cast.output[0]
    assert {a.name: a.i for a in norm.attribute if a.type == onnx.AttributeProto.INT}["output_type"] == 0
    feeds = random_feeds(model, SHAPES)
    expected = run(model, feeds)[0]
    for actual in (run(optimized, feeds)[0], _with_library(optimized, feeds)):  # function bodies, then kernels
        assert actual.dtype == np.float32
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("target", "core"), [("onnx", "LayerNormalization"), ("ort", "LayerNormalization")])
def test_other_targets_compute_the_island_in_fp32(target: str, core: str) -> None:
    model = _island("layer")
    optimized, report = optimize(model, target=target)
    assert [n.op_type for n in optimized.graph.node] == ["Cast", core], report.near_misses
    feeds = random_feeds(model, SHAPES)
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_ort_rms_reads_fp16_and_writes_fp32() -> None:
    """ONNX Runtime's CPU SimplifiedLayerNormalization takes X fp16 and an fp32 scale, and writes Y in the scale's
    type: no Cast at all."""
    model = _island("rms")
    optimized, report = optimize(model, target="ort")
    assert [n.op_type for n in optimized.graph.node] == ["SimplifiedLayerNormalization"], report.near_misses
    feeds = random_feeds(model, SHAPES)
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_an_fp16_residual_sum_is_one_skip_op_with_a_float32_output(tmp_path) -> None:
    """a + b in fp16, widened, normalised in fp32: one SkipLayerNorm on the fp16 addends with output_type float32
    (its Sum keeps X's type, so X cast to fp32 in front cannot give it). It normalises the float32 sum, as ONNX
    Runtime's CPU provider computes the original (its fp16 Add runs in fp32), and its Y is float32."""
    model = _island("layer", residual=True)
    optimized, report = optimize(model)
    assert [n.op_type for n in optimized.graph.node] == ["SkipLayerNorm"], report.near_misses
    (node,) = optimized.graph.node
    assert list(node.input[:2]) == ["a", "b"]
    assert {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}["output_type"] == FLOAT
    feeds = random_feeds(model, SHAPES)
    actual = _with_library(optimized, feeds)
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    assert onnx_norm.verify(model, optimized, inputs=[feeds]).passed
    # Written, it loads in ONNX Runtime with and without the library (tests/conftest.py checks every save).
    onnx_norm.save(optimized, tmp_path / "skip_fp32_out.onnx")


def test_an_fp16_residual_sum_of_unknown_rank_stays_an_fp16_add() -> None:
    """Without X's rank in the model ONNX Runtime cannot apply the op's output type: the Add stays and the norm of
    its widened result is fused (the op on a float32 X)."""
    model = _island("layer", residual=True)
    for value in model.graph.input:
        value.type.tensor_type.ClearField("shape")
    optimized, report = optimize(model)
    assert [n.op_type for n in optimized.graph.node] == ["Add", "Cast", "LayerNorm"], report.near_misses
    feeds = random_feeds(model, SHAPES)
    np.testing.assert_allclose(_with_library(optimized, feeds), run(model, feeds)[0], rtol=1e-5, atol=1e-5)
