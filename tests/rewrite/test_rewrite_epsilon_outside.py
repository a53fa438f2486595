"""Norms with epsilon added to the standard deviation, outside the square root: the Annotated Transformer's
LayerNorm `a * (x - mean) / (x.std(-1) + eps) + b` (an unbiased std), copied into much hand-written model code,
and its RMS and biased-std cousins. They fuse into our LayerNorm/RMSNorm with `epsilon_outside=1`; the standard
targets, which have no such op, leave them decomposed with the reason."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from rewrite_support import (
    FLOAT,
    FLOAT16,
    assert_fused,
    assert_not_less_accurate,
    const,
    make_model,
    random_feeds,
)

import onnx_norm
from onnx_norm.ops.schema import DOMAIN
from onnx_norm.rewrite import optimize

D = 16
SHAPES = {"x": [2, 3, D]}


def _std_nodes(*, unbiased: bool, rms: bool = False, root: str = "Sqrt") -> list[onnx.NodeProto]:
    """`centred / (std + eps)`, std the square root of the (unbiased when asked) variance, as `sd`."""
    nodes = []
    if rms:
        nodes.append(helper.make_node("Identity", ["x"], ["d"]))
    else:
        nodes += [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]), helper.make_node("Sub", ["x", "mu"], ["d"])]
    nodes.append(helper.make_node("Mul", ["d", "d"], ["sq"]))
    if unbiased:  # sum / (N - 1), as x.std(-1) computes it
        nodes += [
            helper.make_node("ReduceSum", ["sq", "axes"], ["ss"], keepdims=1),
            helper.make_node("Div", ["ss", "n1"], ["var"]),
        ]
    else:
        nodes.append(helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]))
    if root == "Sqrt":
        nodes.append(helper.make_node("Sqrt", ["var"], ["sd"]))
    else:
        nodes.append(helper.make_node("Pow", ["var", "half"], ["sd"]))
    return nodes


def _model(*, unbiased: bool = True, rms: bool = False, root: str = "Sqrt", dtype: int = FLOAT) -> onnx.ModelProto:
    np_type = np.float16 if dtype == FLOAT16 else np.float32
    nodes = [
        *_std_nodes(unbiased=unbiased, rms=rms, root=root),
        helper.make_node("Add", ["sd", "eps"], ["se"]),
        helper.make_node("Mul", ["a", "d"], ["ad"]),
        helper.make_node("Div", ["ad", "se"], ["n" if not rms else "y"]),
    ]
    if not rms:  # an RMS norm has no bias
        nodes.append(helper.make_node("Add", ["n", "b"], ["y"]))
    rng = np.random.default_rng(1)
    inits = [
        const("eps", 1e-6, np_type),
        const("a", rng.uniform(0.5, 1.5, D), np_type),
        const("b", rng.standard_normal(D), np_type),
        const("axes", [-1], np.int64),
        const("n1", D - 1, np_type),
        const("half", 0.5, np_type),
    ]
    used = {name for node in nodes for name in node.input}
    return make_model(nodes, [("x", dtype, SHAPES["x"])], [("y", dtype, None)], [i for i in inits if i.name in used])


def _fused_node(model: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.domain == DOMAIN]
    return node


def _attribute(node: onnx.NodeProto, name: str) -> float | int:
    return helper.get_attribute_value(next(a for a in node.attribute if a.name == name))


@pytest.mark.parametrize(
    ("unbiased", "rms", "root", "op"),
    [
        (True, False, "Sqrt", "LayerNorm"),  # the Annotated Transformer's x.std(-1)
        (False, False, "Sqrt", "LayerNorm"),
        (False, False, "Pow", "LayerNorm"),
        (False, True, "Sqrt", "RMSNorm"),
    ],
)
def test_epsilon_outside_the_square_root_fuses_with_the_attribute(unbiased: bool, rms: bool, root: str, op: str):
    model = _model(unbiased=unbiased, rms=rms, root=root)
    # The model-local function (no library) against the original, then our kernels against float64.
    optimized, report = assert_fused(model, SHAPES, [op], rtol=1e-5, atol=1e-5)
    node = _fused_node(optimized)
    assert _attribute(node, "epsilon_outside") == 1
    # sqrt(c var) + eps = sqrt(c) (sqrt(var) + eps / sqrt(c)): the unbiased std's correction moves into eps and scale.
    correction = D / (D - 1) if unbiased else 1.0
    assert _attribute(node, "epsilon") == pytest.approx(1e-6 / correction**0.5, rel=1e-6)
    assert_not_less_accurate(model, optimized, random_feeds(model, SHAPES))
    assert [r.variant for r in report.norms] and not report.near_misses


@pytest.mark.parametrize("unbiased", [False, True])
def test_epsilon_outside_in_float16_runs_in_our_kernels_as_in_the_original(unbiased: bool):
    """All in float16, the Annotated Transformer's x.std(-1) too: the sqrt((N-1)/N) folded into the weight is not a
    float16 value, so the op reads a float32 Scale (and Bias) beside the float16 X, and is no less accurate."""
    model = _model(dtype=FLOAT16, unbiased=unbiased)
    optimized, report = optimize(model)
    assert _attribute(_fused_node(optimized), "epsilon_outside") == 1, report.near_misses
    scale_types = {i.data_type for i in optimized.graph.initializer if i.name.startswith("onnx_norm_")}
    assert (onnx.TensorProto.FLOAT in scale_types) == unbiased  # biased: the graph's own float16 weight
    feeds = random_feeds(model, SHAPES)
    assert_not_less_accurate(model, optimized, feeds)


def test_a_norm_with_epsilon_inside_is_written_exactly_as_before():
    """The attribute is written only where it is set: the usual norm's node carries the shared attributes only."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["y"]),
    ]
    model = make_model(nodes, [("x", FLOAT, SHAPES["x"])], [("y", FLOAT, None)], [const("eps", 1e-5, np.float32)])
    optimized, _ = optimize(model)
    assert "epsilon_outside" not in {a.name for a in _fused_node(optimized).attribute}


@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_standard_targets_leave_it_decomposed_with_the_reason(target: str):
    model = _model(unbiased=False)
    optimized, report = optimize(model, target=target)
    assert not [n for n in optimized.graph.node if n.op_type in ("LayerNormalization", "SkipLayerNormalization")]
    reasons = " | ".join(m.reason for m in report.near_misses)
    assert "outside the square root" in reasons, reasons


def test_a_residual_add_in_front_folds_into_the_skip_op_with_the_attribute():
    model = _model(unbiased=True)
    graph = model.graph
    graph.node.insert(0, helper.make_node("Add", ["x0", "r"], ["x"]))
    del graph.input[:]
    graph.input.extend([helper.make_tensor_value_info(n, FLOAT, SHAPES["x"]) for n in ("x0", "r")])
    onnx.checker.check_model(model)
    shapes = {"x0": SHAPES["x"], "r": SHAPES["x"]}
    optimized, _ = assert_fused(model, shapes, ["SkipLayerNorm"])
    assert _attribute(_fused_node(optimized), "epsilon_outside") == 1
    assert_not_less_accurate(model, optimized, random_feeds(model, shapes))


def test_the_library_rejects_an_epsilon_outside_that_is_not_0_or_1():
    x = helper.make_tensor_value_info("x", FLOAT, [2, D])
    y = helper.make_tensor_value_info("y", FLOAT, [2, D])
    node = helper.make_node("LayerNorm", ["x"], ["y"], domain=DOMAIN, epsilon_outside=2)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=opsets)
    model.ir_version = 10
    # Checked once, when the kernel is created.
    with pytest.raises(Exception, match="LayerNorm: attribute epsilon_outside must be 0 or 1, got 2"):
        ort.InferenceSession(model.SerializeToString(), onnx_norm.session_options())


class _AnnotatedLayerNorm:
    """The Annotated Transformer's LayerNorm module (harvardnlp), as written there."""

    @staticmethod
    def make(features: int):
        import torch

        class LayerNorm(torch.nn.Module):
            def __init__(self, features: int, eps: float = 1e-6) -> None:
                super().__init__()
                self.a_2 = torch.nn.Parameter(torch.rand(features) + 0.5)
                self.b_2 = torch.nn.Parameter(torch.randn(features))
                self.eps = eps

            def forward(self, x):
                mean = x.mean(-1, keepdim=True)
                std = x.std(-1, keepdim=True)
                return self.a_2 * (x - mean) / (std + self.eps) + self.b_2

        return LayerNorm(features).eval()


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_the_annotated_transformers_layer_norm_exported_by_torch_fuses(dynamo: bool):
    torch = pytest.importorskip("torch")
    module = _AnnotatedLayerNorm.make(32)
    x = torch.randn(2, 5, 32)
    buffer = io.BytesIO()
    if dynamo:
        program = torch.onnx.export(module, (x,), dynamo=True, verbose=False)
        program.save(buffer)
    else:
        torch.onnx.export(module, (x,), buffer, dynamo=False, opset_version=17)
    model = onnx.load_from_string(buffer.getvalue())
    optimized, report = optimize(model)
    assert [n.op_type for n in optimized.graph.node if n.domain == DOMAIN] == ["LayerNorm"], report
    session = ort.InferenceSession(optimized.SerializeToString(), onnx_norm.session_options())
    (y,) = session.run(None, {model.graph.input[0].name: x.numpy()})
    np.testing.assert_allclose(y, module(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_an_op_built_on_the_norm_without_the_attribute_fuses_the_norm_alone():
    """adaLN's modulated op has no epsilon_outside: the modulation stays, the norm inside it is fused (never the
    modulated op with the epsilon moved inside)."""
    nodes = [
        *_std_nodes(unbiased=False),
        helper.make_node("Add", ["sd", "eps"], ["se"]),
        helper.make_node("Div", ["d", "se"], ["n"]),
        helper.make_node("Add", ["one", "scale"], ["gate"]),
        helper.make_node("Mul", ["n", "gate"], ["m"]),
        helper.make_node("Add", ["m", "shift"], ["y"]),
    ]
    inputs = [("x", FLOAT, SHAPES["x"]), ("scale", FLOAT, [2, 1, D]), ("shift", FLOAT, [2, 1, D])]
    inits = [const("eps", 1e-6, np.float32), const("one", 1.0, np.float32)]
    model = make_model(nodes, inputs, [("y", FLOAT, None)], inits)
    shapes = {"x": SHAPES["x"], "scale": [2, 1, D], "shift": [2, 1, D]}
    _, report = assert_fused(model, shapes, ["LayerNorm"])
    reasons = " | ".join(m.reason for m in report.near_misses)
    assert "has no attribute epsilon_outside" in reasons, reasons
