"""L2 normalisation as a family (onnx_norm/rewrite/families/l2_norm.py, op L2Norm): each spelling exporters write
(ReduceL2 or the norm spelled out, clamped by Max or Clip or not at all, Div or Mul(Reciprocal), constant factors
before or after the division) is fused into one L2Norm with the numbers ONNX Runtime gives for the original (through
the library's CPU kernel and through the model-local function) and the float64 reference; the near-misses and the
other targets say why; LpNormalization is taken over; float16 rows whose sum of squares overflows float16 stay
finite; torch's two exporters and CLIP's embeddings fuse."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from rewrite_support import FLOAT, FLOAT16, const, fused_ops, make_model, run

import onnx_norm
from onnx_norm.ops.l2_norm import l2_norm
from onnx_norm.rewrite import optimize

D = 16
SHAPE = [2, 3, D]
EPS = 1e-12


def _with_library(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        model.SerializeToString(), onnx_norm.session_options(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def _x(shape: list[int] = SHAPE, dtype=np.float32, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 2 + 0.3).astype(dtype)


def _norm_nodes(how: str) -> list[onnx.NodeProto]:
    """`x`'s L2 norm over its last axis into `n`, as `how` spells it."""
    if how == "reduce_l2":
        return [helper.make_node("ReduceL2", ["x"], ["n"], axes=[-1], keepdims=1)]
    if how == "pow_sum_sqrt":
        return [
            helper.make_node("Pow", ["x", "two"], ["sq"]),
            helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
            helper.make_node("Sqrt", ["s"], ["n"]),
        ]
    if how == "mul_sum_sqrt":
        return [
            helper.make_node("Mul", ["x", "x"], ["sq"]),
            helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
            helper.make_node("Sqrt", ["s"], ["n"]),
        ]
    assert how == "sum_square_sqrt"
    return [
        helper.make_node("ReduceSumSquare", ["x"], ["s"], axes=[-1], keepdims=1),
        helper.make_node("Sqrt", ["s"], ["n"]),
    ]


def _clamp_nodes(clamp: str) -> tuple[list[onnx.NodeProto], str]:
    """The norm `n` clamped below by eps (or not), and the name of the result."""
    if clamp == "max":
        return [helper.make_node("Max", ["n", "eps"], ["c"])], "c"
    if clamp == "max_swapped":
        return [helper.make_node("Max", ["eps", "n"], ["c"])], "c"
    if clamp == "clip":
        return [helper.make_node("Clip", ["n", "eps", ""], ["c"])], "c"
    assert clamp == "none"
    return [], "n"


def _divide_nodes(divide: str, denominator: str, out: str = "y") -> list[onnx.NodeProto]:
    if divide == "div":
        return [helper.make_node("Div", ["x", denominator], [out])]
    return [
        helper.make_node("Reciprocal", [denominator], ["r"]),
        helper.make_node("Mul", ["x", "r"], [out]),
    ]


_INITS = [
    const("two", np.float32(2)),
    const("axes", np.array([-1], np.int64)),
    const("eps", np.float32(EPS)),
]


def _model(how: str, clamp: str, divide: str, tail: list[onnx.NodeProto] = (), inits: list = ()) -> onnx.ModelProto:
    clamp_nodes, denominator = _clamp_nodes(clamp)
    last = "y" if not tail else "q"
    nodes = [*_norm_nodes(how), *clamp_nodes, *_divide_nodes(divide, denominator, last), *tail]
    return make_model(nodes, [("x", FLOAT, SHAPE)], [("y", FLOAT, SHAPE)], [*_INITS, *inits])


def _check(
    model: onnx.ModelProto, scale: np.ndarray | None, eps: float, x: np.ndarray | None = None
) -> onnx.ModelProto:
    """One L2Norm, and the numbers of the original, of the library's kernel, of the model-local function and of the
    float64 reference agree."""
    optimized, report = optimize(model)
    onnx.checker.check_model(optimized)
    assert fused_ops(optimized) == ["L2Norm"], [m.reason for m in report.near_misses]
    x = _x() if x is None else x
    feeds = {"x": x}
    (expected,) = l2_norm(x.astype(np.float64), scale, epsilon=eps, axis=-1)
    (original,) = run(model, feeds)
    (fused,) = _with_library(optimized, feeds)
    (function,) = run(optimized, feeds)
    for got in (original, fused, function):
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=2e-6, atol=1e-6)
    return optimized


@pytest.mark.parametrize("how", ["reduce_l2", "pow_sum_sqrt", "mul_sum_sqrt", "sum_square_sqrt"])
@pytest.mark.parametrize("clamp", ["max", "max_swapped", "clip", "none"])
@pytest.mark.parametrize("divide", ["div", "mul_reciprocal"])
def test_spellings_fuse_with_parity(how: str, clamp: str, divide: str) -> None:
    optimized = _check(_model(how, clamp, divide), None, 0.0 if clamp == "none" else EPS)
    (node,) = [n for n in optimized.graph.node if n.op_type == "L2Norm"]
    eps = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon")
    assert eps == pytest.approx(0.0 if clamp == "none" else EPS, rel=1e-6)
    assert len(node.input) == 1  # no scale


def test_rsqrt_of_a_clamped_sum_is_the_clamped_norm() -> None:
    """x * Pow(max(sum(x^2), eps^2), -1/2): max(||x||, eps) under the square root."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
        helper.make_node("Max", ["s", "eps2"], ["c"]),
        helper.make_node("Pow", ["c", "minus_half"], ["r"]),
        helper.make_node("Mul", ["x", "r"], ["y"]),
    ]
    inits = [*_INITS, const("eps2", np.float32(1e-6)), const("minus_half", np.float32(-0.5))]
    model = make_model(nodes, [("x", FLOAT, SHAPE)], [("y", FLOAT, SHAPE)], inits)
    x = _x()
    x[0, 0] = 1e-5  # a row whose norm is below the clamp
    optimized = _check(model, None, 1e-3, x)
    (node,) = [n for n in optimized.graph.node if n.op_type == "L2Norm"]
    assert [helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"] == [pytest.approx(1e-3)]


def test_scale_norm_and_x_transformers_rms_norm_fold_their_constants() -> None:
    """ScaleNorm `x * (g / max(||x||, eps))` and x-transformers' `normalize(x) * sqrt(d) * gamma`: the scalar and
    the row fold into one Scale."""
    g = np.float32(math.sqrt(D))
    scale_norm = [
        helper.make_node("ReduceL2", ["x"], ["n"], axes=[-1], keepdims=1),
        helper.make_node("Max", ["n", "eps"], ["c"]),
        helper.make_node("Div", ["g", "c"], ["f"]),
        helper.make_node("Mul", ["x", "f"], ["y"]),
    ]
    model = make_model(scale_norm, [("x", FLOAT, SHAPE)], [("y", FLOAT, SHAPE)], [*_INITS, const("g", g)])
    _check(model, np.full(D, g), EPS)
    gamma = (np.random.default_rng(1).random(D) + 0.5).astype(np.float32)
    tail = [helper.make_node("Mul", ["q", "sqrt_d"], ["q2"]), helper.make_node("Mul", ["q2", "gamma"], ["y"])]
    model = _model("reduce_l2", "clip", "div", tail, [const("sqrt_d", g), const("gamma", gamma)])
    _check(model, g * gamma.astype(np.float64), EPS)


def test_a_scale_over_another_axis_is_a_near_miss() -> None:
    """The norm over the last axis, the factor varying along the one before: not an L2Norm's Scale. After the
    division it stays outside the fused norm; inside the product (`x * (rows / max(||x||, eps))`) it is a near-miss."""
    rows = (np.arange(SHAPE[1], dtype=np.float32) + 2).reshape(SHAPE[1], 1)
    tail = [helper.make_node("Mul", ["q", "rows"], ["y"])]
    model = _model("reduce_l2", "max", "div", tail, [const("rows", rows)])
    optimized, _ = optimize(model)
    assert fused_ops(optimized) == ["L2Norm"]
    (node,) = [n for n in optimized.graph.node if n.op_type == "L2Norm"]
    assert len(node.input) == 1 and [n.op_type for n in optimized.graph.node].count("Mul") == 1
    feeds = {"x": _x()}
    np.testing.assert_allclose(_with_library(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-6, atol=1e-6)
    inside = [
        helper.make_node("ReduceL2", ["x"], ["n"], axes=[-1], keepdims=1),
        helper.make_node("Max", ["n", "eps"], ["c"]),
        helper.make_node("Div", ["rows", "c"], ["f"]),
        helper.make_node("Mul", ["x", "f"], ["y"]),
    ]
    model = make_model(inside, [("x", FLOAT, SHAPE)], [("y", FLOAT, SHAPE)], [*_INITS, const("rows", rows)])
    optimized, report = optimize(model)
    assert fused_ops(optimized) == []
    reasons = " | ".join(m.reason for m in report.near_misses)
    assert "varies along axes [-2]" in reasons, reasons


def test_a_norm_over_axes_that_are_not_contiguous_is_not_fused() -> None:
    """x / ||x|| over axes 0 and 2 is a near-miss (one over a non-trailing block of axes is fused between
    Transposes: test_l2_norm_channels_first.py); an L1 norm is no L2 norm."""
    nodes = [
        helper.make_node("ReduceL2", ["x"], ["n"], axes=[0, 2], keepdims=1),
        helper.make_node("Div", ["x", "n"], ["y"]),
    ]
    model = make_model(nodes, [("x", FLOAT, SHAPE)], [("y", FLOAT, SHAPE)])
    optimized, report = optimize(model)
    assert fused_ops(optimized) == []
    assert any("are not contiguous" in m.reason for m in report.near_misses), report.near_misses
    l1 = [
        helper.make_node("ReduceL1", ["x"], ["n"], axes=[-1], keepdims=1),
        helper.make_node("Max", ["n", "eps"], ["c"]),
        helper.make_node("Div", ["x", "c"], ["y"]),
    ]
    model = make_model(l1, [("x", FLOAT, SHAPE)], [("y", FLOAT, SHAPE)], _INITS)
    assert fused_ops(optimize(model)[0]) == []


def test_norm_of_another_tensor_is_a_near_miss() -> None:
    """a / ||b||: not a normalisation of a."""
    nodes = [
        helper.make_node("ReduceL2", ["b"], ["n"], axes=[-1], keepdims=1),
        helper.make_node("Max", ["n", "eps"], ["c"]),
        helper.make_node("Div", ["x", "c"], ["y"]),
    ]
    model = make_model(nodes, [("x", FLOAT, SHAPE), ("b", FLOAT, SHAPE)], [("y", FLOAT, SHAPE)], _INITS)
    optimized, report = optimize(model)
    assert fused_ops(optimized) == []
    assert report.near_misses, "a division by another tensor's norm is reported"


def test_onnx_target_writes_lp_normalization_only_without_epsilon() -> None:
    model = _model("reduce_l2", "none", "div")
    optimized, _ = optimize(model, target="onnx")
    assert [n.op_type for n in optimized.graph.node] == ["LpNormalization"]
    feeds = {"x": _x()}
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-6, atol=1e-7)
    for target, reason in (("onnx", "LpNormalization has no epsilon"), ("ort", "ONNX Runtime has no L2")):
        optimized, report = optimize(_model("reduce_l2", "max", "div"), target=target)
        assert "LpNormalization" not in [n.op_type for n in optimized.graph.node]
        reasons = " | ".join(m.reason for m in report.near_misses)
        assert reason in reasons, reasons


def _native_model(p: int, axis: int = -1) -> onnx.ModelProto:
    node = helper.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=p)
    return make_model([node], [("x", FLOAT, SHAPE)], [("y", FLOAT, SHAPE)])


def test_lp_normalization_is_taken_over() -> None:
    model = _native_model(2)
    optimized, report = optimize(model, take_over_native=True)
    assert fused_ops(optimized) == ["L2Norm"]
    feeds = {"x": _x()}
    np.testing.assert_allclose(_with_library(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-6, atol=1e-7)
    optimized, report = optimize(_native_model(1), take_over_native=True)
    assert fused_ops(optimized) == []
    reasons = " | ".join(str(r.get("reason")) for r in report.native_taken_over)
    assert "p=1" in reasons, reasons


@pytest.mark.parametrize("how", ["reduce_l2", "mul_sum_sqrt"])
def test_float16_rows_beyond_float16_squares_stay_finite(how: str) -> None:
    """|x| ~ 1000 in float16: each square (~1e6) and the sum of squares (~6e7) overflow float16 (max 65504), so a
    runtime that computes the graph in float16 (onnx's reference evaluator here; QNN, onnxruntime-qnn#589) gives a
    norm of inf and y = 0 (ONNX Runtime's CPU provider computes float16 in float32 between Casts and does not);
    L2Norm sums in float32 and gives the float64 answer for both spellings."""
    shape = [4, 64]
    nodes = [
        *_norm_nodes(how),
        helper.make_node("Max", ["n", "eps"], ["c"]),
        helper.make_node("Div", ["x", "c"], ["y"]),
    ]
    inits = [const("eps", np.float16(1e-6)), const("axes", np.array([-1], np.int64))]
    model = make_model(nodes, [("x", FLOAT16, shape)], [("y", FLOAT16, shape)], inits)
    optimized, report = optimize(model)
    assert fused_ops(optimized) == ["L2Norm"], [m.reason for m in report.near_misses]
    x = (1000 * np.random.default_rng(0).uniform(0.5, 1.0, shape)).astype(np.float16)
    (original,) = ReferenceEvaluator(model).run(None, {"x": x})
    (fused,) = _with_library(optimized, {"x": x})
    (expected,) = l2_norm(x.astype(np.float64), None, epsilon=float(np.float16(1e-6)))
    assert np.all(original == 0)  # x / inf: the unfused float16 graph overflows
    assert fused.dtype == np.float16
    np.testing.assert_allclose(fused.astype(np.float64), expected, rtol=1e-3, atol=1e-4)


def test_float16_graph_fuses_with_parity() -> None:
    nodes = [*_norm_nodes("reduce_l2"), *_clamp_nodes("clip")[0], *_divide_nodes("div", "c")]
    inits = [const("eps", np.float16(1e-6))]
    model = make_model(nodes, [("x", FLOAT16, SHAPE)], [("y", FLOAT16, SHAPE)], inits)
    optimized, report = optimize(model)
    assert fused_ops(optimized) == ["L2Norm"], [m.reason for m in report.near_misses]
    x = _x(dtype=np.float16)
    (expected,) = l2_norm(x.astype(np.float64), None, epsilon=float(np.float16(1e-6)))
    for got in (_with_library(optimized, {"x": x})[0], run(optimized, {"x": x})[0], run(model, {"x": x})[0]):
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=2e-3, atol=1e-3)
    fused_error = np.abs(_with_library(optimized, {"x": x})[0].astype(np.float64) - expected).max()
    original_error = np.abs(run(model, {"x": x})[0].astype(np.float64) - expected).max()
    assert fused_error <= original_error


def test_kernel_rejects_a_scale_of_the_wrong_size() -> None:
    node = helper.make_node("L2Norm", ["x", "s"], ["y"], domain="onnx_norm", epsilon=1e-12)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", FLOAT, SHAPE)],
        [const("s", np.ones(D + 1, np.float32))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnx_norm", 1)])
    model.ir_version = 10
    with pytest.raises(Exception, match="Scale has shape"):
        _with_library(model, {"x": _x()})


def _torch_modules() -> dict:
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional

    class Normalize(torch.nn.Module):  # F.normalize(x, dim=-1): x / clamp_min(||x||, 1e-12) (its expand_as form)
        def forward(self, x):
            return functional.normalize(x, dim=-1)

    class NormDiv(torch.nn.Module):  # no epsilon
        def forward(self, x):
            return x / x.norm(dim=-1, keepdim=True)

    class NormUnsqueeze(torch.nn.Module):  # the norm's dim dropped, restored by indexing (Unsqueeze)
        def forward(self, x):
            return x / x.norm(dim=-1).clamp(min=1e-6)[..., None]

    class ScaleNorm(torch.nn.Module):  # Nguyen & Salazar: g / clamp(||x||, eps), g a learned scalar
        def __init__(self) -> None:
            super().__init__()
            self.g = torch.nn.Parameter(torch.tensor(D**0.5 * 1.1))

        def forward(self, x):
            return x * (self.g / torch.norm(x, dim=-1, keepdim=True).clamp(min=1e-5))

    class XTransformersRMSNorm(torch.nn.Module):  # x-transformers' RMSNorm
        def __init__(self) -> None:
            super().__init__()
            self.scale = D**0.5
            self.g = torch.nn.Parameter(torch.rand(D) + 0.5)

        def forward(self, x):
            return functional.normalize(x, dim=-1) * self.scale * self.g

    class SentenceTransformersNormalize(torch.nn.Module):  # sentence_transformers.models.Normalize, written out
        def forward(self, embeddings):
            return functional.normalize(embeddings, p=2, dim=1)

    return {
        "normalize": (Normalize, 1e-12),
        "norm_div": (NormDiv, 0.0),
        "norm_unsqueeze": (NormUnsqueeze, 1e-6),
        "scale_norm": (ScaleNorm, 1e-5),
        "x_transformers_rms_norm": (XTransformersRMSNorm, 1e-12),
        "sentence_transformers": (SentenceTransformersNormalize, 1e-12),
    }


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize(
    "name",
    ["normalize", "norm_div", "norm_unsqueeze", "scale_norm", "x_transformers_rms_norm", "sentence_transformers"],
)
def test_torch_exports_fuse(tmp_path: Path, name: str, dynamo: bool, dtype: str) -> None:
    torch = pytest.importorskip("torch")
    if dynamo and dtype == "float16" and name not in ("normalize", "scale_norm"):
        pytest.skip("float16 dynamo exports: two spellings suffice (the others are the same graphs)")
    cls, eps = _torch_modules()[name]
    torch.manual_seed(0)
    module = cls().eval().to(getattr(torch, dtype))
    shape = [4, D] if name == "sentence_transformers" else SHAPE
    x = torch.from_numpy(_x(shape, np.dtype(dtype)))
    path = tmp_path / "model.onnx"
    kwargs = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 17}
    with torch.no_grad():
        torch.onnx.export(module, (x,), str(path), **kwargs)
        expected = module(x.double() if dtype == "float32" else x.float()).double().numpy()
    model = onnx.load(str(path))
    optimized, report = optimize(model)
    assert fused_ops(optimized) == ["L2Norm"], [m.reason for m in report.near_misses]
    (node,) = [n for n in optimized.graph.node if n.op_type == "L2Norm"]
    got_eps = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon")
    assert got_eps == pytest.approx(float(np.array(eps, dtype)), rel=1e-6, abs=1e-15)  # as the clamp's type holds it
    feeds = {model.graph.input[0].name: x.numpy()}
    rtol = 1e-5 if dtype == "float32" else 2e-3
    fused = _with_library(optimized, feeds)[0].astype(np.float64)
    np.testing.assert_allclose(fused, run(model, feeds)[0].astype(np.float64), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(fused, expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_clip_embeddings_fuse(tmp_path: Path, dynamo: bool) -> None:
    """transformers' CLIPModel (tiny config): `image_embeds / image_embeds.norm(p=2, dim=-1, keepdim=True)` and
    the same for the text embeddings: two L2Norms (epsilon 0), the logits as before."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    text = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = transformers.CLIPConfig(
        text_config={**text, "vocab_size": 99, "max_position_embeddings": 16},
        vision_config={**text, "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )
    torch.manual_seed(0)
    clip = transformers.CLIPModel(config).eval()

    class Embeddings(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.clip = clip  # a submodule: its weights are initializers, not constants

        def forward(self, input_ids, pixel_values):
            out = self.clip(input_ids=input_ids, pixel_values=pixel_values, return_dict=True)
            return out.logits_per_image, out.image_embeds, out.text_embeds

    ids, pixels = torch.randint(0, 99, (2, 7)), torch.randn(2, 3, 32, 32)
    path = tmp_path / "clip.onnx"
    kwargs = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 17}
    with torch.no_grad():
        torch.onnx.export(Embeddings().eval(), (ids, pixels), str(path), **kwargs)
    model = onnx.load(str(path))
    optimized, report = optimize(model)
    assert fused_ops(optimized).count("L2Norm") == 2, [m.reason for m in report.near_misses]
    feeds = dict(zip([i.name for i in model.graph.input], (ids.numpy(), pixels.numpy()), strict=True))
    for got, want in zip(_with_library(optimized, feeds), run(model, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _dropped_dims_model(unsqueeze_axis: int, shape: list[int]) -> onnx.ModelProto:
    """x / Unsqueeze(max(ReduceL2(x, keepdims=0), eps), axis): the norm's dim restored by an Unsqueeze."""
    nodes = [
        helper.make_node("ReduceL2", ["x"], ["n"], axes=[-1], keepdims=0),
        helper.make_node("Max", ["n", "eps"], ["c"]),
        helper.make_node("Unsqueeze", ["c", "where"], ["u"]),
        helper.make_node("Div", ["x", "u"], ["y"]),
    ]
    inits = [*_INITS, const("where", np.array([unsqueeze_axis], np.int64))]
    return make_model(nodes, [("x", FLOAT, shape)], [("y", FLOAT, shape)], inits)


def test_a_norm_with_its_dim_dropped_and_restored_fuses() -> None:
    """`x / x.norm(dim=-1).clamp(min=eps).unsqueeze(-1)` (TorchScript and dynamo write ReduceL2 with keepdims=0, then
    Unsqueeze); an Unsqueeze at another axis broadcasts the norms across the wrong dim: the proof refuses it."""
    _check(_dropped_dims_model(-1, SHAPE), None, EPS)
    model = _dropped_dims_model(1, [2, 4, 4])
    optimized, report = optimize(model)
    assert fused_ops(optimized) == []
    assert any("proof failed" in m.reason for m in report.near_misses), [m.reason for m in report.near_misses]
