"""L2 normalisation over a non-trailing axis (onnx_norm/rewrite/families/l2_norm.py, rule l2_norm_channels_first):
`F.normalize(x, dim=1)` on [N, C, H, W] or [N, C, L] is one L2Norm between the two Transposes the LayerNorm and
RMSNorm families' channels-first norms use, a per-channel weight its Scale row; `--target onnx` writes
LpNormalization along that axis (no Transposes) where the match has no epsilon; `--take-over-native` reads
LpNormalization(p=2) over any one axis; a weight the model takes at run time is read by L2Norm as it is; SSD's
`x / (||x|| + eps)` (epsilon added, not clamped) stays as it is with its reason. Numbers against ONNX Runtime on
the original, the float64 reference and onnx_norm.verify."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from rewrite_support import FLOAT, FLOAT16, assert_not_fused, const, fused_ops, make_model, run

import onnx_norm
from onnx_norm.ops.l2_norm import l2_norm
from onnx_norm.rewrite import optimize

C = 8
EPS = 1e-12


def _with_library(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        model.SerializeToString(), onnx_norm.session_options(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def _x(shape: list[int], dtype=np.float32, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 2 + 0.3).astype(dtype)


def _expected(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """The float64 reference over axis 1: X moved channels-last, L2Norm, moved back."""
    moved = np.moveaxis(x.astype(np.float64), 1, -1)
    (y,) = l2_norm(moved, None if weight is None else weight.reshape(-1).astype(np.float64), epsilon=eps, axis=-1)
    return np.moveaxis(y, -1, 1)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _norm(how: str) -> list[onnx.NodeProto]:
    """The L2 norm of `x` over axis 1 into `n`."""
    if how == "reduce_l2":
        return [helper.make_node("ReduceL2", ["x"], ["n"], axes=[1], keepdims=1)]
    return [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
        helper.make_node("Sqrt", ["s"], ["n"]),
    ]


def _model(how: str, clamp: bool, weight: np.ndarray | None, shape: list[int], dtype: int = FLOAT) -> onnx.ModelProto:
    """`x / max(||x||_1, eps) [* weight]` over axis 1 (TorchScript's and dynamo's `F.normalize(x, dim=1)`)."""
    np_type = np.float16 if dtype == FLOAT16 else np.float32
    nodes = [*_norm(how)]
    if clamp:
        nodes.append(helper.make_node("Max", ["n", "eps"], ["c"]))
    nodes.append(helper.make_node("Div", ["x", "c" if clamp else "n"], ["q" if weight is not None else "y"]))
    inits = [const("two", np_type(2)), const("axes", np.array([1], np.int64)), const("eps", np_type(EPS))]
    if weight is not None:
        nodes.append(helper.make_node("Mul", ["q", "w"], ["y"]))
        inits.append(const("w", weight.astype(np_type)))
    return make_model(nodes, [("x", dtype, shape)], [("y", dtype, shape)], inits)


def _weight(shape: list[int]) -> np.ndarray:
    """SSD's `weight[None, :, None, None]`, as an initializer of X's rank."""
    values = (np.random.default_rng(1).random(C) + 0.5).astype(np.float32)
    return values.reshape([1, C] + [1] * (len(shape) - 2))


@pytest.mark.parametrize("shape", [[2, C, 3, 5], [2, C, 7]], ids=["nchw", "ncl"])
@pytest.mark.parametrize("how", ["reduce_l2", "pow_sum_sqrt"])
@pytest.mark.parametrize("clamp", [True, False], ids=["max", "no_eps"])
@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "no_weight"])
def test_channels_first_norm_fuses_between_transposes(shape: list[int], how: str, clamp: bool, weighted: bool) -> None:
    weight = _weight(shape) if weighted else None
    model = _model(how, clamp, weight, shape)
    optimized, report = optimize(model)
    onnx.checker.check_model(optimized)
    assert fused_ops(optimized) == ["L2Norm"], [m.reason for m in report.near_misses]
    assert _ops(optimized) == ["Transpose", "L2Norm", "Transpose"]
    (record,) = report.norms
    assert record.rule == "l2_norm_channels_first" and record.axes == [1] and "channels first" in record.variant
    (node,) = [n for n in optimized.graph.node if n.op_type == "L2Norm"]
    assert len(node.input) == (2 if weighted else 1)  # the per-channel weight is the Scale row [C]
    if weighted:
        (scale,) = [i for i in optimized.graph.initializer if i.name == node.input[1]]
        assert list(scale.dims) == [C]
    feeds = {"x": _x(shape)}
    expected = _expected(feeds["x"], weight, EPS if clamp else 0.0)
    for got in (run(model, feeds)[0], _with_library(optimized, feeds)[0], run(optimized, feeds)[0]):
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=2e-6, atol=1e-6)


def test_float16_channels_first_norm_fuses_with_parity() -> None:
    shape = [2, C, 4, 4]
    weight = _weight(shape)
    model = _model("reduce_l2", True, weight, shape, FLOAT16)
    optimized, report = optimize(model)
    assert fused_ops(optimized) == ["L2Norm"], [m.reason for m in report.near_misses]
    feeds = {"x": _x(shape, np.float16)}
    fused = _with_library(optimized, feeds)[0]
    assert fused.dtype == np.float16
    expected = _expected(feeds["x"], weight, float(np.float16(EPS)))
    np.testing.assert_allclose(fused.astype(np.float64), expected, rtol=2e-3, atol=2e-3)
    assert onnx_norm.verify(model, optimized, inputs=[feeds]).passed


def test_a_norm_over_axes_that_are_not_contiguous_is_a_near_miss() -> None:
    nodes = [
        helper.make_node("ReduceL2", ["x"], ["n"], axes=[1, 3], keepdims=1),
        helper.make_node("Div", ["x", "n"], ["y"]),
    ]
    model = make_model(nodes, [("x", FLOAT, [2, C, 3, 5])], [("y", FLOAT, [2, C, 3, 5])])
    assert_not_fused(model, {"x": [2, C, 3, 5]}, "are not contiguous")


def test_a_weight_that_varies_along_another_axis_than_the_channels_is_a_near_miss() -> None:
    """x * (w / max(||x||_1, eps)) with w varying along H: no Scale row of the channels (after the division it would
    stay a Mul of its own)."""
    shape = [2, C, 3, 5]
    nodes = [
        *_norm("reduce_l2"),
        helper.make_node("Max", ["n", "eps"], ["c"]),
        helper.make_node("Div", ["w", "c"], ["f"]),
        helper.make_node("Mul", ["x", "f"], ["y"]),
    ]
    inits = [const("eps", np.float32(EPS)), const("w", (np.arange(3, dtype=np.float32) + 2).reshape(3, 1))]
    model = make_model(nodes, [("x", FLOAT, shape)], [("y", FLOAT, shape)], inits)
    assert_not_fused(model, {"x": shape}, "varies along axes [-2]")


@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "no_weight"])
def test_onnx_target_writes_lp_normalization_along_the_axis(weighted: bool) -> None:
    """No epsilon: LpNormalization(axis=1) of X itself, no Transposes, the weight a Mul after it; with a clamp the
    target says why it leaves the norm as it is."""
    shape = [2, C, 3, 5]
    weight = _weight(shape) if weighted else None
    model = _model("reduce_l2", False, weight, shape)
    optimized, report = optimize(model, target="onnx")
    ops = _ops(optimized)
    assert ops.count("LpNormalization") == 1 and "Transpose" not in ops and "ReduceL2" not in ops, ops
    (lp,) = [n for n in optimized.graph.node if n.op_type == "LpNormalization"]
    attrs = {a.name: helper.get_attribute_value(a) for a in lp.attribute}
    assert attrs == {"axis": 1, "p": 2}
    assert ops.count("Mul") == (1 if weighted else 0)
    assert "Reshape" not in ops  # the weight is a constant of the shape it scales with: nothing left to fold
    feeds = {"x": _x(shape)}
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-6, atol=1e-7)
    optimized, report = optimize(_model("reduce_l2", True, weight, shape), target="onnx")
    assert "LpNormalization" not in _ops(optimized)
    assert any("LpNormalization has no epsilon" in m.reason for m in report.near_misses), report.near_misses


@pytest.mark.parametrize(("shape", "axis"), [([2, C, 3, 5], 1), ([2, C, 7], 1), ([2, C, 7], -2), ([C, 6], 0)])
@pytest.mark.parametrize("dtype", [FLOAT, FLOAT16])
def test_lp_normalization_over_another_axis_is_taken_over(shape: list[int], axis: int, dtype: int) -> None:
    node = helper.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=2)
    model = make_model([node], [("x", dtype, shape)], [("y", dtype, shape)])
    optimized, report = optimize(model, take_over_native=True)
    assert fused_ops(optimized) == ["L2Norm"]
    assert _ops(optimized) == ["Transpose", "L2Norm", "Transpose"]
    (record,) = report.native_taken_over
    assert record["converted"], record
    np_type = np.float16 if dtype == FLOAT16 else np.float32
    feeds = {"x": _x(shape, np_type)}
    expected = np.moveaxis(l2_norm(np.moveaxis(feeds["x"].astype(np.float64), axis, -1), epsilon=0.0)[0], -1, axis)
    tolerance = 2e-3 if dtype == FLOAT16 else 1e-6
    for got in (_with_library(optimized, feeds)[0], run(model, feeds)[0]):
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tolerance, atol=tolerance)


def test_lp_normalization_with_p_1_stays_with_its_reason() -> None:
    node = helper.make_node("LpNormalization", ["x"], ["y"], axis=1, p=1)
    model = make_model([node], [("x", FLOAT, [2, C, 7])], [("y", FLOAT, [2, C, 7])])
    optimized, report = optimize(model, take_over_native=True)
    assert _ops(optimized) == ["LpNormalization"]
    (record,) = report.native_taken_over
    assert not record["converted"] and "p=1" in record["reason"], record


def _trailing(weight_nodes: list[onnx.NodeProto], weight: str, inputs: list, inits: list = ()) -> onnx.ModelProto:
    """`F.normalize(x, dim=-1) * weight` over [2, 3, C], the weight computed by `weight_nodes` from run-time inputs."""
    nodes = [
        *weight_nodes,
        helper.make_node("ReduceL2", ["x"], ["n"], axes=[-1], keepdims=1),
        helper.make_node("Max", ["n", "eps"], ["c"]),
        helper.make_node("Div", ["x", "c"], ["q"]),
        helper.make_node("Mul", ["q", weight], ["y"]),
    ]
    shape = [2, 3, C]
    return make_model(
        nodes, [("x", FLOAT, shape), *inputs], [("y", FLOAT, shape)], [const("eps", np.float32(EPS)), *inits]
    )


@pytest.mark.parametrize("spelling", ["input", "neg", "slice", "one_plus"])
def test_a_weight_computed_at_run_time_is_read_as_the_scale(spelling: str) -> None:
    """A graph-input weight, its Neg, a Slice of a longer one, `1 + w`: read by L2Norm as its Scale (the shared
    reading of run-time rows, match.runtime_rows), the nodes computing it left in front."""
    weight_nodes = {
        "input": [],
        "neg": [helper.make_node("Neg", ["w"], ["g"])],
        "slice": [helper.make_node("Slice", ["w", "start", "stop"], ["g"])],
        "one_plus": [helper.make_node("Add", ["one", "w"], ["g"])],
    }[spelling]
    inits = [const("start", np.array([2], np.int64)), const("stop", np.array([2 + C], np.int64))]
    inits.append(const("one", np.float32(1)))
    width = 2 * C if spelling == "slice" else C
    model = _trailing(weight_nodes, "w" if spelling == "input" else "g", [("w", FLOAT, [width])], inits)
    optimized, report = optimize(model)
    assert fused_ops(optimized) == ["L2Norm"], [m.reason for m in report.near_misses]
    (node,) = [n for n in optimized.graph.node if n.op_type == "L2Norm"]
    assert node.input[1] == ("w" if spelling == "input" else "g")
    assert "Mul" not in _ops(optimized)
    w = (np.random.default_rng(2).random(width) + 0.5).astype(np.float32)
    feeds = {"x": _x([2, 3, C]), "w": w}
    row = {"input": w, "neg": -w, "slice": w[2 : 2 + C], "one_plus": 1 + w}[spelling]
    (expected,) = l2_norm(feeds["x"].astype(np.float64), row.astype(np.float64), epsilon=EPS)
    for got in (run(model, feeds)[0], _with_library(optimized, feeds)[0], run(optimized, feeds)[0]):
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=2e-6, atol=1e-6)


def test_a_run_time_weight_beside_a_constant_factor_stays_a_mul() -> None:
    """`normalize(x) * sqrt(d) * g` with g a graph input: a run-time Scale cannot absorb the constant (the shared
    reading refuses), so L2Norm takes sqrt(d) and g stays a Mul after it."""
    nodes = [helper.make_node("Mul", ["q0", "sqrt_d"], ["q"])]
    model = _trailing([], "w", [("w", FLOAT, [C])], [const("sqrt_d", np.float32(C**0.5))])
    graph = model.graph
    (div,) = [n for n in graph.node if n.op_type == "Div"]
    div.output[0] = "q0"
    graph.node.insert(list(graph.node).index(div) + 1, nodes[0])
    optimized, _ = optimize(model)
    assert fused_ops(optimized) == ["L2Norm"] and _ops(optimized).count("Mul") == 1
    feeds = {"x": _x([2, 3, C]), "w": (np.random.default_rng(3).random(C) + 0.5).astype(np.float32)}
    np.testing.assert_allclose(_with_library(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_a_per_channel_weight_taken_at_run_time_stays_a_mul_after_the_transposes() -> None:
    """A graph-input weight [1, C, 1, 1] over [N, C, H, W] is no run-time row of trailing dims (it broadcasts inside):
    the norm is fused between the Transposes and the Mul stays after it."""
    shape = [2, C, 3, 5]
    nodes = [*_norm("reduce_l2"), helper.make_node("Max", ["n", "eps"], ["c"])]
    nodes += [helper.make_node("Div", ["x", "c"], ["q"]), helper.make_node("Mul", ["q", "w"], ["y"])]
    inputs = [("x", FLOAT, shape), ("w", FLOAT, [1, C, 1, 1])]
    model = make_model(nodes, inputs, [("y", FLOAT, shape)], [const("eps", np.float32(EPS))])
    optimized, report = optimize(model)
    assert _ops(optimized) == ["Transpose", "L2Norm", "Transpose", "Mul"], [m.reason for m in report.near_misses]
    feeds = {"x": _x(shape), "w": _weight(shape)}
    np.testing.assert_allclose(_with_library(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def _added_epsilon_model(
    where: str, shape: list[int], dtype: int = FLOAT, weighted: bool = True, axis: int = 1
) -> onnx.ModelProto:
    """`x / (||x|| + eps) * w` over `axis` (SSD's L2Norm, `x / (x.pow(2).sum(1, keepdim=True).sqrt() + eps) *
    weight[None, :, None, None]`: where="norm") or `x / sqrt(sum(x^2) + eps) * w` (where="sum")."""
    np_type = np.float16 if dtype == FLOAT16 else np.float32
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
    ]
    if where == "norm":
        nodes += [helper.make_node("Sqrt", ["s"], ["n"]), helper.make_node("Add", ["n", "eps"], ["c"])]
    else:
        nodes += [helper.make_node("Add", ["eps", "s"], ["e"]), helper.make_node("Sqrt", ["e"], ["c"])]
    nodes.append(helper.make_node("Div", ["x", "c"], ["q" if weighted else "y"]))
    inits = [const("two", np_type(2)), const("axes", np.array([axis], np.int64)), const("eps", np_type(1e-4))]
    if weighted:
        nodes.append(helper.make_node("Mul", ["q", "w"], ["y"]))
        weight = np.full([1] * len(shape), 20.0) if axis == -1 else _weight(shape) * 20
        inits.append(const("w", weight.astype(np_type)))
    return make_model(nodes, [("x", dtype, shape)], [("y", dtype, shape)], inits)


@pytest.mark.parametrize("where", ["norm", "sum"])
@pytest.mark.parametrize("dtype", [FLOAT, FLOAT16])
@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "no_weight"])
def test_epsilon_added_is_fused_as_the_rms_norm_it_is(where: str, dtype: int, weighted: bool) -> None:
    """||x|| + eps = sqrt(C) * (sqrt(mean(x^2)) + eps / sqrt(C)): SSD's L2Norm is exactly an RMSNorm with
    epsilon_outside, epsilon eps / sqrt(C) and Scale w / sqrt(C) (S + eps: epsilon eps / C, inside); L2Norm, which
    clamps, would differ on rows whose norm is near eps (one is fed here)."""
    shape = [2, C, 3, 5]
    model = _added_epsilon_model(where, shape, dtype, weighted)
    optimized, report = optimize(model)
    onnx.checker.check_model(optimized)
    assert fused_ops(optimized) == ["RMSNorm"], [m.reason for m in report.near_misses]
    assert _ops(optimized) == ["Transpose", "RMSNorm", "Transpose"]
    (record,) = report.norms
    assert record.kind == "l2" and record.rule == "l2_norm_channels_first" and "+ eps" in record.variant
    (node,) = [n for n in optimized.graph.node if n.op_type == "RMSNorm"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    eps = float(np.float16(1e-4)) if dtype == FLOAT16 else 1e-4
    want = eps / C**0.5 if where == "norm" else eps / C
    assert attrs["epsilon"] == pytest.approx(want, rel=1e-5)
    assert attrs.get("epsilon_outside", 0) == (1 if where == "norm" else 0)
    np_type = np.float16 if dtype == FLOAT16 else np.float32
    x = _x(shape, np_type)
    x[0, :, 0, 0] = np.float32(3e-5)  # a row whose norm is near eps: max(||x||, eps) would give another answer
    feeds = {"x": x}
    xf = x.astype(np.float64)
    sums = (xf * xf).sum(axis=1, keepdims=True)
    denominator = np.sqrt(sums) + eps if where == "norm" else np.sqrt(sums + eps)
    expected = xf / denominator * (_weight(shape).astype(np_type).astype(np.float64) * 20 if weighted else 1.0)
    tolerance = 4e-2 if dtype == FLOAT16 else 2e-5
    for got in (run(model, feeds)[0], _with_library(optimized, feeds)[0], run(optimized, feeds)[0]):
        assert got.dtype == np_type
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tolerance, atol=tolerance)
    assert onnx_norm.verify(model, optimized, inputs=[feeds]).passed


def test_epsilon_added_over_the_last_axis_and_the_other_targets() -> None:
    """Over the last axis no Transposes; `--target onnx`/`ort` follow the RMSNorm family's lowering: epsilon added to
    the root is no standard op (left with that reason), epsilon under the root is ONNX Runtime's
    SimplifiedLayerNormalization."""
    shape = [2, 3, C]
    model = _added_epsilon_model("norm", shape, axis=-1)
    optimized, _ = optimize(model)
    assert _ops(optimized) == ["RMSNorm"]
    for target in ("onnx", "ort"):
        optimized, report = optimize(model, target=target)
        assert _ops(optimized) == _ops(model)
        reasons = " | ".join(m.reason for m in report.near_misses)
        assert "standard deviation" in reasons, reasons
    inside = _added_epsilon_model("sum", shape, axis=-1)
    optimized, _ = optimize(inside, target="ort")
    assert "SimplifiedLayerNormalization" in _ops(optimized), _ops(optimized)
    feeds = {"x": _x(shape)}
    np.testing.assert_allclose(run(optimized, feeds)[0], run(inside, feeds)[0], rtol=1e-5, atol=1e-5)


def test_epsilon_added_over_a_symbolic_row_is_a_near_miss() -> None:
    """The RMSNorm it is needs the row size N (epsilon / sqrt(N)); a symbolic one is named."""
    model = _added_epsilon_model("norm", [2, 3, C], weighted=False, axis=-1)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "d"
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_param = "d"
    assert_not_fused(model, {"x": [2, 3, C]}, "its RMSNorm needs the row size")


def _torch_modules() -> dict:
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional

    class ConvNormalize(torch.nn.Module):  # a conv net with F.normalize over the channels
        def __init__(self, conv) -> None:
            super().__init__()
            self.conv1, self.conv2 = conv(3, C, 3, padding=1), conv(C, 4, 1)

        def forward(self, x):
            return self.conv2(functional.normalize(self.conv1(x), dim=1))

    class ScaledL2Norm(torch.nn.Module):  # SSD's L2Norm with F.normalize's clamp: `normalize(x, dim=1) * w[:, None]`
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, C, 3, padding=1)
            self.weight = torch.nn.Parameter(torch.rand(C) + 0.5)

        def forward(self, x):
            return functional.normalize(self.conv(x), dim=1) * self.weight[None, :, None, None]

    class SSDL2Norm(torch.nn.Module):  # ssd.pytorch's layers/modules/l2norm.py, written out
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, C, 3, padding=1)
            self.weight = torch.nn.Parameter(torch.full((C,), 20.0))
            self.eps = 1e-10

        def forward(self, x):
            x = self.conv(x)
            norm = x.pow(2).sum(dim=1, keepdim=True).sqrt() + self.eps
            return torch.div(x, norm) * self.weight[None, :, None, None]

    return {
        "conv2d_normalize": (lambda: ConvNormalize(torch.nn.Conv2d), [2, 3, 6, 5]),
        "conv1d_normalize": (lambda: ConvNormalize(torch.nn.Conv1d), [2, 3, 9]),
        "scaled_l2_norm": (ScaledL2Norm, [2, 3, 6, 5]),
        "ssd_l2_norm": (SSDL2Norm, [2, 3, 6, 5]),
    }


def _export(tmp_path: Path, name: str, dynamo: bool, dtype: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    torch = pytest.importorskip("torch")
    make, shape = _torch_modules()[name]
    torch.manual_seed(0)
    module = make().eval().to(getattr(torch, dtype))
    x = torch.from_numpy(_x(shape, np.dtype(dtype)))
    path = tmp_path / "model.onnx"
    kwargs = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 17}
    with torch.no_grad():
        torch.onnx.export(module, (x,), str(path), **kwargs)
    model = onnx.load(str(path))
    return model, {model.graph.input[0].name: x.numpy()}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("name", ["conv2d_normalize", "conv1d_normalize", "scaled_l2_norm"])
def test_torch_channels_first_exports_fuse(tmp_path: Path, name: str, dynamo: bool, dtype: str) -> None:
    model, feeds = _export(tmp_path, name, dynamo, dtype)
    optimized, report = optimize(model)
    assert fused_ops(optimized) == ["L2Norm"], [m.reason for m in report.near_misses]
    (record,) = report.norms
    assert record.rule == "l2_norm_channels_first" and record.axes == [1]
    (node,) = [n for n in optimized.graph.node if n.op_type == "L2Norm"]
    assert len(node.input) == (2 if name == "scaled_l2_norm" else 1)
    parity = onnx_norm.verify(model, optimized, inputs=[feeds])
    assert parity.passed, parity
    tolerance = 1e-5 if dtype == "float32" else 3e-3
    np.testing.assert_allclose(
        _with_library(optimized, feeds)[0].astype(np.float64),
        run(model, feeds)[0].astype(np.float64),
        rtol=tolerance,
        atol=tolerance,
    )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_torch_ssd_l2_norm_fuses(tmp_path: Path, dynamo: bool, dtype: str) -> None:
    """SSD's L2Norm adds epsilon to the norm: TorchScript's graph keeps the Add, fused as the RMSNorm it is
    (epsilon_outside). Dynamo's export writes no Add at all (`+ 1e-10` is gone from its graph: `x / sqrt(sum(x^2))`),
    which is an L2Norm with epsilon 0 and the weight as Scale."""
    model, feeds = _export(tmp_path, "ssd_l2_norm", dynamo, dtype)
    optimized, report = optimize(model)
    assert ("Add" in _ops(model)) != dynamo
    assert fused_ops(optimized) == (["L2Norm"] if dynamo else ["RMSNorm"]), [m.reason for m in report.near_misses]
    (record,) = report.norms
    assert record.kind == "l2" and record.rule == "l2_norm_channels_first"
    if dynamo:
        assert record.epsilon == 0.0
    parity = onnx_norm.verify(model, optimized, inputs=[feeds])
    assert parity.passed, parity
    tolerance = 1e-4 if dtype == "float32" else 5e-2  # the weight is 20
    np.testing.assert_allclose(
        _with_library(optimized, feeds)[0].astype(np.float64),
        run(model, feeds)[0].astype(np.float64),
        rtol=tolerance,
        atol=tolerance,
    )
