"""Real exporter output: small torch modules exported inside the test, optimized, compared with the original."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from repo_paths import EXAMPLES
from rewrite_support import fused_ops, run

from onnx_norm.rewrite import optimize

torch = pytest.importorskip("torch")


class LayerNormModule(torch.nn.Module):
    def __init__(self, hidden: int = 24, shape=None) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(shape or hidden)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)
        self.proj = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.proj(self.norm(x))


class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm: fp32 statistics, rounded back before the weight multiply."""

    def __init__(self, hidden: int = 24, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(hidden) + 0.5)
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(dtype)


class GemmaRMSNorm(torch.nn.Module):
    """Gemma: `(1 + w)` multiplied in fp32, then cast back."""

    def __init__(self, hidden: int = 24, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(hidden) * 0.2)
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class PreNormBlock(torch.nn.Module):
    """residual = x + f(x); y = norm(residual); the residual also feeds the next add."""

    def __init__(self, hidden: int = 24) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(hidden, hidden)
        self.norm = LlamaRMSNorm(hidden)
        self.out = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        residual = x + self.lin(x)
        return residual + self.out(self.norm(residual))


def export(module, example, *, opset: int = 14, dynamo: bool = False, dynamic=None) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(module, (example,), dynamo=True, opset_version=opset, verbose=False)
            return program.model_proto
        torch.onnx.export(
            module,
            (example,),
            buffer,
            opset_version=opset,
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": dynamic or {0: "batch", 1: "seq"}},
        )
    return onnx.load_from_string(buffer.getvalue())


def check(model: onnx.ModelProto, shape: list[int], expected: list[str], dtype=np.float32, rtol=1e-5, atol=1e-5):
    optimized, report = optimize(model)
    onnx.checker.check_model(optimized)
    assert sorted(fused_ops(optimized)) == sorted(expected), [(m.reason, m.nodes) for m in report.near_misses]
    name = model.graph.input[0].name
    rng = np.random.default_rng(0)
    feeds = {name: (rng.standard_normal(shape) * 3 + 1).astype(dtype)}
    (before,), (after,) = run(model, feeds)[:1], run(optimized, feeds)[:1]
    assert before.dtype == after.dtype
    np.testing.assert_allclose(after.astype(np.float64), before.astype(np.float64), rtol=rtol, atol=atol)
    return optimized, report


@pytest.mark.parametrize("opset", [11, 13, 14, 16])
def test_torchscript_layer_norm_decomposed(opset):
    model = export(LayerNormModule().eval(), torch.randn(2, 5, 24), opset=opset)
    assert "LayerNormalization" not in {n.op_type for n in model.graph.node}
    _, report = check(model, [3, 7, 24], ["LayerNorm"])
    assert report.norms[0].epsilon == pytest.approx(1e-5, rel=1e-6)


def test_torchscript_layer_norm_over_two_axes():
    model = export(LayerNormModule(8, shape=(3, 8)).eval(), torch.randn(2, 3, 8), opset=14, dynamic={0: "batch"})
    _, report = check(model, [4, 3, 8], ["LayerNorm"])
    assert report.norms[0].attributes["axis"] == -2


@pytest.mark.parametrize("opset", [14, 17])
def test_torchscript_llama_rms_norm(opset):
    model = export(LlamaRMSNorm().eval(), torch.randn(2, 5, 24), opset=opset)
    check(model, [3, 7, 24], ["RMSNorm"])


def test_torchscript_llama_rms_norm_fp16():
    model = export(LlamaRMSNorm().half().eval(), torch.randn(2, 5, 24).half(), opset=17)
    _, report = check(model, [3, 7, 24], ["RMSNorm"], dtype=np.float16, rtol=2e-3, atol=2e-3)
    attrs = report.norms[0].attributes
    # The graph rounds before and after `w * h`; the fused op once, at its output (casts.op_rounding).
    assert attrs["normalized_type"] == 0 and attrs["multiply_type"] == 0
    assert "fp16 before scale" in report.norms[0].cast_placement


def test_torchscript_gemma_rms_norm_fp16():
    model = export(GemmaRMSNorm().half().eval(), torch.randn(2, 5, 24).half(), opset=17)
    _, report = check(model, [3, 7, 24], ["RMSNorm"], dtype=np.float16, rtol=2e-3, atol=2e-3)
    attrs = report.norms[0].attributes
    assert attrs["output_type"] in (0, onnx.TensorProto.FLOAT16)  # 0: the type of X, fp16 here
    assert attrs["normalized_type"] == 0 and attrs["multiply_type"] == 0


def test_torchscript_pre_norm_residual_kept():
    model = export(PreNormBlock().eval(), torch.randn(2, 5, 24), opset=17)
    _, report = check(model, [3, 7, 24], ["SkipRMSNorm"])
    assert report.norms[0].residual and report.norms[0].residual_sum_kept


def test_dynamo_rms_norm():
    model = export(LlamaRMSNorm().eval(), torch.randn(2, 5, 24), opset=18, dynamo=True)
    check(model, [2, 5, 24], ["RMSNorm"])


def test_dynamo_hand_written_layer_norm():
    class HandLayerNorm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(24) + 0.5)
            self.bias = torch.nn.Parameter(torch.rand(24))

        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
            return (x - mean) / torch.sqrt(var + 1e-12) * self.weight + self.bias

    model = export(HandLayerNorm().eval(), torch.randn(2, 5, 24), opset=18, dynamo=True)
    check(model, [2, 5, 24], ["LayerNorm"], rtol=1e-4, atol=1e-4)


class StatisticLayouts(torch.nn.Module):
    """Hand-written norms whose statistic is reduced without its dims and restored by a layout op somewhere later."""

    def __init__(self, spelling: str, hidden: int = 24) -> None:
        super().__init__()
        self.spelling = spelling
        self.weight = torch.nn.Parameter(torch.rand(hidden) + 0.5)
        self.bias = torch.nn.Parameter(torch.rand(hidden))

    def forward(self, x):
        if self.spelling == "unsqueeze_after_sqrt":
            return x / torch.sqrt((x * x).sum(-1) / x.shape[-1] + 1e-6).unsqueeze(-1) * self.weight
        if self.spelling == "view":
            inv = torch.rsqrt((x * x).mean(-1) + 1e-6)
            return x * inv.view(x.shape[0], x.shape[1], 1) * self.weight
        if self.spelling == "expand_as":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6).expand_as(x) * self.weight
        mean = x.mean(-1, keepdim=True)  # "var": dynamo reduces with keepdims=0 and restores with broadcast_in_dim
        var = x.var(-1, keepdim=True, unbiased=False)
        return (x - mean) * torch.rsqrt(var + 1e-5) * self.weight + self.bias


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("spelling", ["unsqueeze_after_sqrt", "view", "expand_as", "var"])
def test_statistic_restored_by_layout_ops(spelling, dynamo):
    module = StatisticLayouts(spelling).eval()
    model = export(module, torch.randn(2, 5, 24), opset=18 if dynamo else 17, dynamo=dynamo)
    check(model, [2, 5, 24], ["LayerNorm" if spelling == "var" else "RMSNorm"], rtol=1e-4, atol=1e-4)


class DistributedLayerNorm(torch.nn.Module):
    """tf.nn.batch_normalization's formula, which TF/Keras LayerNormalization uses, written in torch:
    x * s + (beta - mean * s) with s = gamma * rsqrt(var + eps) (`keras3`: (-mean) * s + beta)."""

    def __init__(self, spelling: str, hidden: int = 24) -> None:
        super().__init__()
        self.spelling = spelling
        self.gamma = torch.nn.Parameter(torch.rand(hidden) + 0.5)
        self.beta = torch.nn.Parameter(torch.rand(hidden))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) * (x - mean)).mean(-1, keepdim=True)
        s = torch.rsqrt(var + 1e-3) * self.gamma
        if self.spelling == "keras3":
            return x * s + ((-mean) * s + self.beta)
        return x * s + (self.beta - mean * s)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("spelling", ["tf", "keras3"])
def test_distributed_layer_norm_as_exported(spelling, dynamo):
    module = DistributedLayerNorm(spelling).eval()
    model = export(module, torch.randn(2, 5, 24), opset=18 if dynamo else 17, dynamo=dynamo)
    _, report = check(model, [2, 5, 24], ["LayerNorm"], rtol=1e-4, atol=1e-4)
    assert report.norms[0].epsilon == pytest.approx(1e-3, rel=1e-6)


def test_weights_exported_as_overridable_inputs_stay_inputs():
    """keep_initializers_as_inputs=True: the weights are graph inputs with defaults, which a caller may override.
    The norm still fuses, but an overridden weight must act on the optimized model as on the original."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            LlamaRMSNorm().eval(),
            (torch.randn(2, 5, 24),),
            buffer,
            opset_version=17,
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch", 1: "seq"}},
            keep_initializers_as_inputs=True,
        )
    model = onnx.load_from_string(buffer.getvalue())
    (weight,) = [i.name for i in model.graph.input if i.name != "x"]
    optimized, _ = optimize(model)
    assert fused_ops(optimized) == ["RMSNorm"]
    assert weight in {i.name for i in optimized.graph.input}
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((3, 7, 24)).astype(np.float32), weight: rng.random(24).astype(np.float32) * 3}
    (before,), (after,) = run(model, feeds), run(optimized, feeds)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "counts"),
    [
        ("bert-layernorm-opset13", {"skip_layer_norm": 4, "layer_norm": 1}),
        ("llama-rmsnorm-fp32", {"skip_rms_norm": 4, "rms_norm": 1}),
        ("llama-rmsnorm-fp16", {"skip_rms_norm": 4, "rms_norm": 1}),
        ("llama-rmsnorm-dynamo-fp32", {"skip_rms_norm": 4, "rms_norm": 1}),
        ("llama-rmsnorm-dynamo-fp16", {"skip_rms_norm": 4, "rms_norm": 1}),
    ],
)
def test_bundled_examples(name, counts):
    """Whole exported models (attention Reshapes defeat onnx's shape inference in BERT, so the symbolic one is
    needed to see the residual Adds' shapes)."""
    path = EXAMPLES / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} not in this checkout")
    model = onnx.load(path)
    optimized, report = optimize(model)
    onnx.checker.check_model(optimized)
    assert report.rule_counts == counts, [(m.reason, m.nodes) for m in report.near_misses]
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(0, 128, (2, 9), dtype=np.int64),
        "attention_mask": np.ones((2, 9), dtype=np.int64),
    }
    for before, after in zip(run(model, feeds), run(optimized, feeds), strict=True):
        tolerance = 2e-2 if before.dtype == np.float16 else 1e-4
        np.testing.assert_allclose(after.astype(np.float64), before.astype(np.float64), rtol=tolerance, atol=tolerance)


def test_fp16_converted_after_export():
    float16 = pytest.importorskip("onnxconverter_common.float16")
    model = export(LayerNormModule().eval(), torch.randn(2, 5, 24), opset=14)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = float16.convert_float_to_float16(model, keep_io_types=False)
    _, report = check(converted, [3, 7, 24], ["LayerNorm"], dtype=np.float16, rtol=1e-2, atol=1e-2)
    assert report.norms[0].dtype == "fp16"
    assert report.norms[0].attributes["normalized_type"] == 0
