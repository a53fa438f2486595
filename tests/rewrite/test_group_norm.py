"""GroupNorm (and GroupNorm + SiLU) as a family (onnx_norm/rewrite/families/group_norm.py, op GroupNorm): the graphs
exporters write are fused into one GroupNorm with the numbers ONNX Runtime gives for the original (through the
library's CPU kernel and through the model-local function), GroupNorm(1) is taken whole (not as a LayerNorm without
its per-channel affine), the near-misses and the other targets say why, and torch's two exporters fuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from repo_paths import DATA
from rewrite_support import FLOAT, FLOAT16, const, fused_ops, make_model, run

import onnx_norm
from onnx_norm.ops.group_norm import group_norm
from onnx_norm.rewrite import optimize

N, C, H, W = 2, 8, 3, 5
SHAPE = [N, C, H, W]
FIXTURES = DATA / "group_norm"
_MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def _grouped_norm(how: str, eps: str = "eps") -> list[onnx.NodeProto]:
    """`g` (X as [N, G, -1]) normalised over its last dim into `n`, as `how` spells it."""
    if how == "instance":
        return [helper.make_node("InstanceNormalization", ["g", "ones", "zeros"], ["n"], epsilon=1e-5)]
    mean = [helper.make_node("ReduceMean", ["g", "axes"], ["m"]), helper.make_node("Sub", ["g", "m"], ["d"])]
    if how == "pow_div":  # (x - mean) / sqrt(mean((x - mean)^2) + eps)
        return [
            *mean,
            helper.make_node("Pow", ["d", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["var"]),
            helper.make_node("Add", ["var", eps], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["s"]),
            helper.make_node("Div", ["d", "s"], ["n"]),
        ]
    # "square_rsqrt": var = mean(x^2) - mean(x)^2, then (x - mean) * 1 / sqrt(var + eps)
    return [
        *mean,
        helper.make_node("Mul", ["g", "g"], ["gg"]),
        helper.make_node("ReduceMean", ["gg", "axes"], ["msq"]),
        helper.make_node("Mul", ["m", "m"], ["m2"]),
        helper.make_node("Sub", ["msq", "m2"], ["var"]),
        helper.make_node("Add", ["var", eps], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", ["d", "r"], ["n"]),
    ]


def _model(
    how: str = "instance",
    *,
    groups: int = 4,
    silu: bool = False,
    affine: bool = True,
    dtype: int = FLOAT,
    opset: int = 18,
    instance_scale: float = 1.0,
) -> onnx.ModelProto:
    """GroupNorm(groups, C) over x [N, C, H, W], then optionally SiLU, as TorchScript/dynamo (`instance`) or a
    decomposition writes it."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(1)
    back = "xshape" if how == "instance" else "shape_back"
    nodes = [
        helper.make_node("Reshape", ["x", "split"], ["g"]),
        *_grouped_norm(how),
        *([helper.make_node("Shape", ["x"], ["xshape"])] if how == "instance" else []),
        helper.make_node("Reshape", ["n", back], ["back"]),
    ]
    last = "back"
    if affine:
        nodes += [helper.make_node("Mul", ["back", "gamma"], ["sc"]), helper.make_node("Add", ["sc", "beta"], ["af"])]
        last = "af"
    if silu:
        nodes += [helper.make_node("Sigmoid", [last], ["sg"]), helper.make_node("Mul", [last, "sg"], ["act"])]
        last = "act"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    inits = [
        const("split", np.array([0, groups, -1], np.int64)),
        const("shape_back", np.array(SHAPE, np.int64)),
        const("axes", np.array([2], np.int64)),
        const("two", np.array(2.0, np_type)),
        const("eps", np.array(1e-5, np_type)),
        const("ones", np.full(groups, instance_scale, np_type)),
        const("zeros", np.zeros(groups, np_type)),
        const("gamma", (1 + 0.5 * rng.standard_normal((C, 1, 1))).astype(np_type)),
        const("beta", (0.5 * rng.standard_normal((C, 1, 1))).astype(np_type)),
    ]
    used = {i for n in nodes for i in n.input}
    inits = [t for t in inits if t.name in used]
    return make_model(nodes, [("x", dtype, SHAPE)], [("y", dtype, None)], inits, opset=opset)


def _x(dtype: int = FLOAT, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(SHAPE) * 2 + 0.5).astype(helper.tensor_dtype_to_np_dtype(dtype))


def _with_library(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        model.SerializeToString(), onnx_norm.session_options(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def _group_node(model: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.op_type == "GroupNorm"]
    return node


@pytest.mark.parametrize("how", ["instance", "pow_div", "square_rsqrt"])
@pytest.mark.parametrize("silu", [False, True], ids=["plain", "silu"])
def test_exporter_spellings_fuse_with_parity(how: str, silu: bool) -> None:
    model = _model(how, silu=silu)
    optimized, report = optimize(model)
    assert fused_ops(optimized) == ["GroupNorm"], report
    attrs = {a.name: helper.get_attribute_value(a) for a in _group_node(optimized).attribute}
    assert attrs["num_groups"] == 4 and attrs["activation"] == int(silu)
    assert "axis" not in attrs
    feeds = {"x": _x()}
    (expected,) = run(model, feeds)
    (kernel,) = _with_library(optimized, feeds)
    (function,) = run(optimized, feeds)  # no library: the model-local function
    np.testing.assert_allclose(kernel, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(function, expected, rtol=1e-5, atol=1e-5)


def test_the_kernel_and_the_reference_agree_on_silu_and_no_affine() -> None:
    model = _model(silu=True, affine=False, groups=2)
    optimized, _ = optimize(model)
    assert fused_ops(optimized) == ["GroupNorm"]
    x = _x(seed=3)
    (kernel,) = _with_library(optimized, {"x": x})
    (reference,) = group_norm(x, None, None, num_groups=2, activation=1)
    np.testing.assert_allclose(kernel, reference, rtol=1e-5, atol=1e-5)


def test_group_norm_1_is_taken_whole_with_its_per_channel_affine() -> None:
    """GroupNorm(1) is a LayerNorm over C, H, W: the LayerNorm family would find the grouped norm but not the
    per-channel affine after the Reshape back; the GroupNorm family, in an earlier sweep, takes the whole chain."""
    model = _model("pow_div", groups=1, silu=True)
    optimized, _ = optimize(model)
    assert fused_ops(optimized) == ["GroupNorm"]
    assert {n.op_type for n in optimized.graph.node} <= {"GroupNorm", "Identity"}
    feeds = {"x": _x()}
    np.testing.assert_allclose(_with_library(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    # With the GroupNorm rule off, the LayerNorm family fuses the norm inside alone, the affine left as it was.
    without, _ = optimize(model, disable=["group_norm"])
    assert fused_ops(without) == ["LayerNorm"]
    assert "Sigmoid" in {n.op_type for n in without.graph.node}


def test_float16_graph_is_rounded_once_at_the_output() -> None:
    """An fp16 graph rounds after the normalisation, the affine and each SiLU step; the fused op rounds once, at its
    output, as the other families' ops do (neither float64 nor ONNX Runtime's CPU run of the graph has those
    roundings): no farther from float64 than the original."""
    model = _model("instance", dtype=FLOAT16, silu=True)
    optimized, _ = optimize(model)
    assert fused_ops(optimized) == ["GroupNorm"]
    attrs = {a.name: helper.get_attribute_value(a) for a in _group_node(optimized).attribute}
    assert attrs["normalized_type"] == attrs["multiply_type"] == attrs["output_type"] == 0
    feeds = {"x": _x(FLOAT16)}
    expected = run(model, feeds)[0].astype(np.float64)
    np.testing.assert_allclose(_with_library(optimized, feeds)[0].astype(np.float64), expected, atol=1e-2, rtol=1e-2)
    report = onnx_norm.verify(model, optimized, inputs=[feeds])
    golden = report.outputs[0].golden
    assert report.passed and golden is not None
    assert golden.optimized_mean_abs <= golden.original_mean_abs, golden


def test_instance_norm_with_its_own_affine_is_a_near_miss() -> None:
    model = _model("instance", instance_scale=2.0)
    optimized, report = optimize(model)
    assert fused_ops(optimized) == []
    assert any("per-group affine" in m.reason for m in report.near_misses), report.near_misses


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("dtype", [FLOAT, FLOAT16])
@pytest.mark.parametrize("affine", [True, False])
def test_onnx_target_writes_the_instance_normalization_form(dtype: int, affine: bool) -> None:
    """A decomposed GroupNorm becomes torch's own export (Reshape, InstanceNormalization, Reshape, Mul, Add), which
    ONNX Runtime runs faster than GroupNormalization-21, at the model's own opset (18 here; 6 would do); an fp16
    graph rounds after each step as InstanceNormalization, Mul and Add do, so the parity gate holds it."""
    model = _model("pow_div", silu=True, dtype=dtype, affine=affine)
    optimized, _ = optimize(model, target="onnx")
    ops = _ops(optimized)
    assert ops.count("InstanceNormalization") == 1 and "GroupNormalization" not in ops
    assert {"ReduceMean", "Pow", "Div"}.isdisjoint(ops) and "Sigmoid" in ops
    assert (ops.count("Mul"), ops.count("Add")) == ((2, 1) if affine else (1, 0))  # SiLU's Mul, the affine's
    feeds = {"x": _x(dtype)}
    tolerance = 1e-2 if dtype == FLOAT16 else 1e-5
    np.testing.assert_allclose(
        run(optimized, feeds)[0].astype(np.float64), run(model, feeds)[0], rtol=tolerance, atol=tolerance
    )
    assert onnx_norm.verify(model, optimized, inputs=[feeds]).passed


def test_onnx_target_leaves_the_instance_normalization_form_and_ort_target_says_why() -> None:
    model = _model("instance", silu=True)
    kept, report = optimize(model, target="onnx")
    assert _ops(kept) == _ops(model)
    assert any("already ONNX's InstanceNormalization form" in m.reason for m in report.near_misses), report
    model = _model("pow_div", opset=18)
    optimized, report = optimize(model, target="ort")
    assert "GroupNormalization" not in _ops(optimized)
    assert any("NHWC" in m.reason for m in report.near_misses), report.near_misses
    # the grouped norm inside is still fused, as a LayerNorm over [N, G, -1]
    assert {"ReduceMean", "Sqrt"}.isdisjoint(_ops(optimized))
    feeds = {"x": _x()}
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_group_count_that_does_not_divide_the_channels_is_not_matched() -> None:
    model = _model("pow_div", groups=4)
    for init in model.graph.initializer:
        if init.name == "split":
            init.CopyFrom(const("split", np.array([0, 3, -1], np.int64)))
    optimized, _ = optimize(model, disable=["layer_norm"])
    assert "GroupNorm" not in fused_ops(optimized)


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"num_groups": 3}, "num_groups 3 does not divide the 8 channels"),
        ({}, "attribute num_groups must be set"),
        ({"num_groups": 2, "activation": 2}, "activation=2 is not supported"),
    ],
)
def test_bad_nodes_get_one_line_errors_from_the_kernel(attrs: dict[str, int], message: str) -> None:
    node = helper.make_node("GroupNorm", ["x", "s"], ["y"], domain="onnx_norm", epsilon=1e-5, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", FLOAT, SHAPE), helper.make_tensor_value_info("s", FLOAT, [C])],
        [helper.make_tensor_value_info("y", FLOAT, SHAPE)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("onnx_norm", 1)])
    model.ir_version = 10
    feeds = {"x": _x(), "s": np.ones(C, np.float32)}
    with pytest.raises(Exception, match=message) as error:
        _with_library(model, feeds)
    assert "\n" not in str(error.value).strip()


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_torch_group_norm_exports_fuse(tmp_path, dynamo: bool) -> None:
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = torch.nn.GroupNorm(4, C)
            self.conv = torch.nn.Conv2d(C, C, 3, padding=1)
            self.norm2 = torch.nn.GroupNorm(1, C)  # timm's GroupNorm1

        def forward(self, x):
            return self.norm2(self.conv(torch.nn.functional.silu(self.norm1(x))))

    block = _with_random_norms(Block())
    path = tmp_path / "block.onnx"
    kwargs = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 17}
    torch.onnx.export(block, (torch.randn(*SHAPE),), str(path), **kwargs)
    model = onnx.load(str(path))
    optimized, _ = optimize(model)
    nodes = [n for n in optimized.graph.node if n.op_type == "GroupNorm"]
    assert len(nodes) == 2
    acts = sorted(helper.get_attribute_value(a) for n in nodes for a in n.attribute if a.name == "activation")
    assert acts == [0, 1]
    feeds = {model.graph.input[0].name: _x()}
    np.testing.assert_allclose(_with_library(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def _with_random_norms(block: Any) -> Any:
    """`block` in eval mode with seeded random weights, its norms' scale and bias drawn away from 1 and 0 (where a
    dropped affine would go unnoticed)."""
    import torch

    torch.manual_seed(0)
    block.eval()
    with torch.no_grad():
        for norm in (block.norm1, block.norm2):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    return block


def _export_and_check(module, x, tmp_path, dynamo: bool, expected_group_norms: int) -> onnx.ModelProto:
    """Exports `module`, optimizes it, checks the GroupNorm count and the numbers against ONNX Runtime running
    the original; returns the optimized model."""
    import torch

    path = tmp_path / "model.onnx"
    kwargs = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 17}
    with torch.no_grad():
        torch.onnx.export(module, (x,), str(path), **kwargs)
    model = onnx.load(str(path))
    optimized, report = optimize(model)
    assert fused_ops(optimized).count("GroupNorm") == expected_group_norms, report
    feeds = {model.graph.input[0].name: x.numpy()}
    np.testing.assert_allclose(_with_library(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-4)
    return optimized


@pytest.mark.parametrize("entry", _MANIFEST, ids=[e["file"].removesuffix(".onnx") for e in _MANIFEST])
def test_diffusers_blocks_fuse(entry: dict) -> None:
    """diffusers' ResnetBlock2D (GroupNorm + SiLU twice) and a VAE decoder's UpDecoderBlock2D (four), built from
    their constructors with tiny sizes and random weights, exported by TorchScript and dynamo
    (tests/rewrite/group_norm_fixtures.py): every GroupNorm fused with its SiLU, the numbers ONNX Runtime's."""
    model = onnx.load(str(FIXTURES / entry["file"]))
    optimized, report = optimize(model)
    nodes = [n for n in optimized.graph.node if n.op_type == "GroupNorm"]
    assert len(nodes) == entry["group_norms"], report
    assert all(helper.get_attribute_value(a) == 1 for n in nodes for a in n.attribute if a.name == "activation")
    assert not {"InstanceNormalization", "Sigmoid"} & {n.op_type for n in optimized.graph.node}
    x = np.random.default_rng(0).standard_normal(entry["shape"]).astype(np.float32)
    feeds = {model.graph.input[0].name: x}
    np.testing.assert_allclose(_with_library(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_poolformer_block_with_group_norm_1(tmp_path, dynamo: bool) -> None:
    """A PoolFormer/MetaFormer block as timm builds it with its GroupNorm1 (`nn.GroupNorm(1, C)`, whose forward is
    `F.group_norm(x, 1, ...)`, exported like any GroupNorm): the norms read residual sums, and are fused whole."""
    torch = pytest.importorskip("torch")

    class PoolFormerBlock(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = torch.nn.GroupNorm(1, C), torch.nn.GroupNorm(1, C)
            self.pool = torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False)
            self.mlp = torch.nn.Sequential(torch.nn.Conv2d(C, 2 * C, 1), torch.nn.GELU(), torch.nn.Conv2d(2 * C, C, 1))

        def forward(self, x):
            y = self.norm1(x)
            x = x + (self.pool(y) - y)
            return x + self.mlp(self.norm2(x))

    block = _with_random_norms(PoolFormerBlock())
    optimized = _export_and_check(block, torch.randn(*SHAPE), tmp_path, dynamo, 2)
    assert {
        helper.get_attribute_value(a) for n in optimized.graph.node for a in n.attribute if a.name == "num_groups"
    } == {1}


def _native_model(opset: int, silu: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("GroupNormalization", ["x", "gamma", "beta"], ["gn"], epsilon=1e-5, num_groups=4)]
    nodes.append(helper.make_node("Identity", ["gn"], ["y"]))
    inits = [
        const("gamma", (1 + 0.5 * rng.standard_normal(C if opset >= 21 else 4)).astype(np.float32)),
        const("beta", (0.5 * rng.standard_normal(C if opset >= 21 else 4)).astype(np.float32)),
    ]
    if opset >= 21:
        return make_model(nodes, [("x", FLOAT, SHAPE)], [("y", FLOAT, None)], inits, opset=opset)
    # The checker refuses the deprecated GroupNormalization-18; ONNX Runtime still runs it.
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", FLOAT, SHAPE)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def test_native_group_normalization_21_is_taken_over_and_18_is_not() -> None:
    model = _native_model(21)
    kept, _ = optimize(model)  # without --take-over-native a native op stays
    assert fused_ops(kept) == []
    optimized, report = optimize(model, take_over_native=True)
    assert fused_ops(optimized) == ["GroupNorm"], report.native_taken_over
    feeds = {"x": _x()}
    np.testing.assert_allclose(_with_library(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    old, report = optimize(_native_model(18), take_over_native=True)
    assert fused_ops(old) == []
    (record,) = report.native_taken_over
    assert "per group" in record["reason"]


def test_onnx_target_rewrites_native_group_normalization_21_into_the_instance_normalization_form() -> None:
    """`--take-over-native --target onnx` on GroupNormalization-21: the form ONNX Runtime runs faster (a SiLU after
    it is left as it is), the numbers the original's, the parity gate passing."""
    model = _native_model(21, silu=True)
    optimized, report = optimize(model, take_over_native=True, target="onnx")
    ops = _ops(optimized)
    assert "GroupNormalization" not in ops and ops.count("InstanceNormalization") == 1, report.native_taken_over
    feeds = {"x": _x()}
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    assert onnx_norm.verify(model, optimized, inputs=[feeds]).passed


@pytest.mark.parametrize("dtype", [FLOAT, FLOAT16])
def test_native_instance_normalization_is_taken_over_as_one_group_per_channel(dtype: int) -> None:
    np_type = np.float16 if dtype == FLOAT16 else np.float32
    rng = np.random.default_rng(4)
    inits = [const("s", rng.uniform(0.5, 1.5, C), np_type), const("b", rng.standard_normal(C), np_type)]
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-4)
    model = make_model([node], [("x", dtype, list(SHAPE))], [("y", dtype, None)], inits)
    optimized, report = optimize(model, take_over_native=True)
    (group,) = [n for n in optimized.graph.node if n.op_type == "GroupNorm"]
    assert helper.get_attribute_value(next(a for a in group.attribute if a.name == "num_groups")) == C
    feeds = {"x": _x(dtype)}
    report_ = onnx_norm.verify(model, optimized, inputs=[feeds])
    assert report_.passed, report_
    # The onnx target leaves it: it is already the InstanceNormalization the target would write.
    kept, report = optimize(model, take_over_native=True, target="onnx")
    assert [n.op_type for n in kept.graph.node] == ["InstanceNormalization"]
    (record,) = report.native_taken_over
    assert "InstanceNormalization" in record["reason"]


def _export_dynamic(module: Any, path: Path, dynamo: bool) -> None:
    """`module` exported with N, H and W symbolic, by the dynamo or the TorchScript exporter."""
    import torch

    if dynamo:
        dims = {0: torch.export.Dim("n"), 2: torch.export.Dim("h"), 3: torch.export.Dim("w")}
        kwargs = {"dynamo": True, "dynamic_shapes": (dims,)}
    else:
        kwargs = {"dynamo": False, "opset_version": 17, "dynamic_axes": {"x": {0: "n", 2: "h", 3: "w"}}}
    torch.onnx.export(module, (torch.randn(*SHAPE),), str(path), input_names=["x"], **kwargs)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_dynamic_batch_and_spatial_dims_fuse(tmp_path, dynamo: bool) -> None:
    """N, H and W symbolic: the Reshape back to Shape(X) is read as X's shape; run at another size than exported."""
    torch = pytest.importorskip("torch")
    module = torch.nn.Sequential(torch.nn.GroupNorm(4, C), torch.nn.SiLU()).eval()
    path = tmp_path / "dynamic.onnx"
    _export_dynamic(module, path, dynamo)
    model = onnx.load(str(path))
    optimized, report = optimize(model)
    assert fused_ops(optimized) == ["GroupNorm"], report.near_misses
    x = np.random.default_rng(4).standard_normal([3, C, 6, 7]).astype(np.float32)
    feeds = {model.graph.input[0].name: x}
    np.testing.assert_allclose(_with_library(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_exports_converted_to_float16_fuse_no_less_accurate(tmp_path, dynamo: bool) -> None:
    """GroupNorm + SiLU with N, H and W symbolic, then onnxconverter-common's float16 conversion (float32 I/O kept or
    not): the converter drops the exporters' inferred shapes (the Reshape back's dims come out unnamed) and, keeping
    float32 I/O, casts X once per reader; the Reshape back to Shape(X), or to Shape of such a twin Cast, restores X's
    shape all the same. One GroupNorm, no farther from float64 than the original (1% for float32 noise)."""
    torch = pytest.importorskip("torch")
    from onnxconverter_common import float16

    torch.manual_seed(0)
    sequential = torch.nn.Sequential(torch.nn.GroupNorm(4, C), torch.nn.SiLU()).eval()
    with torch.no_grad():
        sequential[0].weight.normal_(1.0, 0.3)
        sequential[0].bias.normal_(0.0, 0.3)
    path = tmp_path / "dynamic.onnx"
    _export_dynamic(sequential, path, dynamo)
    for keep_io_types in (True, False):
        model = float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=keep_io_types)
        optimized, report = optimize(model)
        assert fused_ops(optimized) == ["GroupNorm"], report.near_misses
        tolerance = {"atol": 1e-2, "rtol": 1e-2} if keep_io_types else {}
        parity = onnx_norm.verify(model, optimized, shapes={"x": [3, C, 6, 7]}, **tolerance)
        golden = parity.outputs[0].golden
        assert parity.passed and golden is not None, [o.message for o in parity.outputs]
        assert golden.optimized_mean_abs <= 1.01 * golden.original_mean_abs, golden
        assert golden.optimized_max_abs <= 1.01 * golden.original_max_abs, golden


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_wav2vec2_feature_encoder_group_norm_fuses(tmp_path, dynamo: bool) -> None:
    """wav2vec2's first conv layer normalises each of its C channels alone (GroupNorm(C, C) over [N, C, L]);
    dynamo writes Reshape, InstanceNormalization, Mul, Add and drops the Reshape back (the grouped value already
    has X's shape)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch

    config = transformers.Wav2Vec2Config(
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), feat_extract_norm="group"
    )
    torch.manual_seed(0)
    encoder = transformers.models.wav2vec2.modeling_wav2vec2.Wav2Vec2FeatureEncoder(config).eval()
    with torch.no_grad():
        norm = encoder.conv_layers[0].layer_norm
        norm.weight.normal_(1.0, 0.3)
        norm.bias.normal_(0.0, 0.3)
    optimized = _export_and_check(encoder, torch.randn(1, 400), tmp_path, dynamo, 1)
    (node,) = [n for n in optimized.graph.node if n.op_type == "GroupNorm"]
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "num_groups")) == 16
    # The gate judges it against an InstanceNormalization evaluated in float64 (a float32 island made the original
    # look exact, and this no less accurate GroupNorm fail).
    report = onnx_norm.verify(onnx.load(str(tmp_path / "model.onnx")), optimized, samples=3)
    assert report.passed, report


def test_one_group_per_channel_over_more_than_one_spatial_dim_needs_its_reshape_back() -> None:
    """Over [N, C, H, W] the grouped value is [N, C, H*W]: without the Reshape back it is not X's shape, and the
    Mul after it is not a per-channel affine of X."""
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["g"]),
        helper.make_node("InstanceNormalization", ["g", "ones", "zeros"], ["y"], epsilon=1e-5),
    ]
    inits = [
        const("shape", [2, C, -1], np.int64),
        const("ones", np.ones(C), np.float32),
        const("zeros", np.zeros(C), np.float32),
    ]
    model = make_model(nodes, [("x", FLOAT, list(SHAPE))], [("y", FLOAT, [2, C, SHAPE[2] * SHAPE[3]])], inits)
    optimized, _ = optimize(model)
    assert "GroupNorm" not in fused_ops(optimized)
