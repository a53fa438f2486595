"""Taking over native norm ops: the converted model computes what the original computed (same ONNX Runtime
outputs within an ulp, and the numpy reference of the converted semantics), and nodes that cannot be expressed
exactly stay, with a reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnx_norm
from onnx_norm import library
from onnx_norm.ops.reference import layer_norm, skip_layer_norm, skip_rms_norm
from onnx_norm.ops.schema import DOMAIN
from onnx_norm.rewrite import targets
from onnx_norm.rewrite.native import take_over

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
NP = {F32: np.float32, F16: np.float16}
MS = "com.microsoft"


def _model(
    op: str,
    domain: str,
    inputs: list[tuple[str, int, list[int]]],
    outputs: list[tuple[str, int]],
    opset: int,
    **attrs,
) -> onnx.ModelProto:
    in_names = [name for name, _, _ in inputs]
    out_names = [name for name, _ in outputs]
    node = helper.make_node(op, in_names, out_names, domain=domain, name="native", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs if n],
        [helper.make_tensor_value_info(n, t, _out_shape(n, inputs[0][2])) for n, t in outputs if n],
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=imports, ir_version=10))


def _out_shape(name: str, x_shape: list[int]) -> list[int | str]:
    # Shape inference does not know ORT's contrib ops; the checker needs a shape on every graph output.
    return x_shape if name in ("y", "sum") else [f"d{i}" for i in range(len(x_shape))]


def _feeds(proto: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in proto.graph.input:
        t = value.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        loc = 3.0 if value.name in ("x", "skip") else 1.0
        feeds[value.name] = (rng.standard_normal(shape) * 2 + loc).astype(NP[t.elem_type])
    return feeds


def _run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def _take_over(proto: onnx.ModelProto, target: str = "onnx-norm") -> tuple[onnx.ModelProto, list[dict]]:
    model = ir.serde.deserialize_model(proto)
    records = take_over(model, target)
    result = ir.serde.serialize_model(model)
    if all(r["converted"] for r in records):  # the checker does not know ORT's contrib ops that stay
        onnx.checker.check_model(result, full_check=True)
    return result, records


def _ulps(elem: int) -> float:
    return {F32: 3e-5, F16: 1e-2}[elem]


def _check_same(proto: onnx.ModelProto, converted: onnx.ModelProto, tol_type: int) -> dict[str, np.ndarray]:
    feeds = _feeds(proto)
    before, after = _run(proto, feeds), _run(converted, feeds)
    assert before.keys() == after.keys()
    for name in before:
        assert after[name].dtype == before[name].dtype, name
        assert after[name].shape == before[name].shape, name
        tol = _ulps(tol_type) if before[name].dtype != np.float32 or tol_type == F32 else 2 * _ulps(F16)
        np.testing.assert_allclose(after[name], before[name], rtol=tol, atol=tol, err_msg=name)
    return after


def _converted_ops(proto: onnx.ModelProto) -> list[str]:
    return [f"{n.domain}::{n.op_type}" for n in proto.graph.node]


@pytest.mark.parametrize("x_type", [F32, F16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("axis", [-1, -2, 1])
def test_layer_normalization_17(x_type: int, bias: bool, axis: int) -> None:
    shape = [2, 3, 8]
    p_shape = shape[axis:]
    inputs = [("x", x_type, shape), ("scale", x_type, p_shape)] + ([("bias", x_type, p_shape)] if bias else [])
    proto = _model("LayerNormalization", "", inputs, [("y", x_type), ("mean", F32), ("inv", F32)], 17, axis=axis)
    converted, records = _take_over(proto)
    assert records == [
        {
            "name": "native",
            "from": "ai.onnx::LayerNormalization",
            "to": f"{DOMAIN}::LayerNorm",
            "converted": True,
            "reason": None,
            "residual": False,
        }
    ]
    assert _converted_ops(converted) == [f"{DOMAIN}::LayerNorm"]
    node = converted.graph.node[0]
    assert node.metadata_props[0].key == "onnx_norm.rule"
    after = _check_same(proto, converted, x_type)
    # The ONNX function of LayerNormalization rounds to float16 after normalising and after the scale.
    feeds = _feeds(proto)
    rounding = 0 if x_type == F32 else x_type
    want = layer_norm(
        feeds["x"],
        feeds["scale"],
        feeds.get("bias"),
        axis=axis - 3 if axis >= 0 else axis,
        normalized_type=rounding,
        multiply_type=rounding,
    )
    np.testing.assert_allclose(after["y"], want[0], rtol=_ulps(x_type), atol=_ulps(x_type))
    np.testing.assert_allclose(after["mean"], want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_type", [F32, F16])
def test_rms_normalization_23(x_type: int) -> None:
    proto = _model(
        "RMSNormalization", "", [("x", x_type, [2, 3, 8]), ("scale", x_type, [8])], [("y", x_type)], 23, epsilon=1e-6
    )
    converted, records = _take_over(proto)
    assert records[0]["converted"]
    assert _converted_ops(converted) == [f"{DOMAIN}::RMSNorm"]
    _check_same(proto, converted, x_type)


def _take_over_contrib_layer_norm(domain: str, opset: int, types: tuple[int, int], ops: list[str]) -> onnx.ModelProto:
    """The contrib LayerNormalization of X of `types[0]` with scale and bias (and so Y) of `types[1]`: taken over as
    `ops`, the same outputs as ONNX Runtime's where it has the op (the default domain). Returns the original."""
    x_type, scale_type = types
    inputs = [("x", x_type, [2, 4, 8]), ("scale", scale_type, [8]), ("bias", scale_type, [8])]
    proto = _model("LayerNormalization", domain, inputs, [("y", scale_type), ("", 0), ("inv", F32)], opset)
    converted, records = _take_over(proto)
    assert records[0]["converted"], records
    assert [n.op_type for n in converted.graph.node] == ops
    if domain == "":
        _check_same(proto, converted, scale_type)
    return proto


@pytest.mark.parametrize(("domain", "opset"), [("", 16), (MS, 18)])
def test_contrib_layer_norm_with_scale_of_another_type(domain: str, opset: int, monkeypatch) -> None:
    """ORT's contrib LayerNormalization gives Y the scale's type. float32 X with float16 scale and bias: our op
    then a Cast. float16 X with float32 scale and bias: our op on X cast to float32 (our library types Y like X;
    a Cast after the op would round), or with output_type where the library honours it."""
    _take_over_contrib_layer_norm(domain, opset, (F32, F16), ["LayerNorm", "Cast"])
    proto = _take_over_contrib_layer_norm(domain, opset, (F16, F32), ["Cast", "LayerNorm"])
    monkeypatch.setattr(targets, "LIBRARY_TYPES_Y_LIKE_X", False)
    converted, records = _take_over(proto)
    assert records[0]["converted"], records
    node = converted.graph.node[0]
    assert {a.name: a for a in node.attribute}["output_type"].i == F32
    if domain == "":
        _check_same(proto, converted, F32)
    # ONNX Runtime 1.31 has no com.microsoft LayerNormalization to compare with: compare with the reference.
    feeds = _feeds(proto)
    y, _, inv = layer_norm(feeds["x"], feeds["scale"], feeds["bias"], output_type=F32)
    after = _run(converted, feeds)
    np.testing.assert_allclose(after["y"], y, rtol=3e-5, atol=3e-5)
    np.testing.assert_allclose(after["inv"], inv, rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize(("x_type", "s_type"), [(F32, F32), (F16, F16), (F16, F32), (F32, F16)])
def test_simplified_layer_normalization(x_type: int, s_type: int) -> None:
    inputs = [("x", x_type, [2, 3, 8]), ("scale", s_type, [8])]
    proto = _model("SimplifiedLayerNormalization", "", inputs, [("y", s_type), ("inv", F32)], 18, epsilon=1e-6)
    converted, records = _take_over(proto)
    assert records[0]["converted"], records
    if (x_type, s_type) == (F16, F32):
        # A float32 Y from float16 X: our library types Y like X, so the op reads X cast to float32.
        assert [n.op_type for n in converted.graph.node] == ["Cast", "RMSNorm"]
    _check_same(proto, converted, F16 if F16 in (x_type, s_type) else F32)


@pytest.mark.parametrize("x_type", [F32, F16])
@pytest.mark.parametrize("layer", [True, False])
def test_skip_ops(x_type: int, layer: bool) -> None:
    op = "SkipLayerNormalization" if layer else "SkipSimplifiedLayerNormalization"
    inputs = [("x", x_type, [2, 3, 8]), ("skip", x_type, [2, 3, 8]), ("gamma", x_type, [8])]
    if layer:
        inputs.append(("beta", x_type, [8]))
    outputs = [("y", x_type), ("", 0), ("", 0), ("sum", x_type)]
    proto = _model(op, MS, inputs, outputs, 18, epsilon=1e-5)
    converted, records = _take_over(proto)
    assert records[0]["converted"], records
    name = "SkipLayerNorm" if layer else "SkipRMSNorm"
    assert _converted_ops(converted) == [f"{DOMAIN}::{name}"]
    feeds = _feeds(proto)
    after = _run(converted, feeds)
    x, skip = feeds["x"], feeds["skip"]
    s = (x.astype(np.float32) + skip.astype(np.float32)).astype(x.dtype)
    np.testing.assert_array_equal(after["sum"], s)
    # Both ORT's CPU kernel and ours normalise the float32 sum, not the rounded Sum (docs/ops.md).
    norm = skip_layer_norm(x, skip, feeds["gamma"], feeds["beta"]) if layer else skip_rms_norm(x, skip, feeds["gamma"])
    np.testing.assert_allclose(after["y"], norm[0], rtol=_ulps(x_type), atol=_ulps(x_type))
    _check_same(proto, converted, x_type)


def test_skipped_nodes_say_why() -> None:
    base = [("x", F32, [2, 3, 8]), ("skip", F32, [2, 3, 8]), ("gamma", F32, [8]), ("beta", F32, [8])]
    cases = {
        "bias input": _model("SkipLayerNormalization", MS, [*base, ("bias", F32, [8])], [("y", F32)], 18),
        "statistics outputs": _model("SkipLayerNormalization", MS, base, [("y", F32), ("mean", F32)], 18),
        "broadcast": _model(
            "SkipLayerNormalization", MS, [base[0], ("skip", F32, [1, 3, 8]), *base[2:]], [("y", F32)], 18
        ),
        "stash_type": _model("LayerNormalization", "", base[:1] + base[2:3], [("y", F32)], 17, stash_type=11),
        "ill-typed": _model("RMSNormalization", "", [("x", F16, [2, 8]), ("s", F32, [8])], [("y", F32)], 23),
        "fp32, fp16 or bf16": _model(
            "LayerNormalization",
            "",
            [("x", TensorProto.DOUBLE, [2, 8]), ("s", TensorProto.DOUBLE, [8])],
            [("y", TensorProto.DOUBLE)],
            17,
        ),
    }
    for words, proto in cases.items():
        model = ir.serde.deserialize_model(proto)
        before = ir.serde.serialize_model(model).SerializeToString()
        records = take_over(model)
        assert len(records) == 1, records
        assert not records[0]["converted"], (words, records)
        assert words in records[0]["reason"], (words, records)
        assert ir.serde.serialize_model(model).SerializeToString() == before, words


def test_other_targets() -> None:
    """ORT's SimplifiedLayerNormalization becomes the standard RMSNormalization; the standard LayerNormalization
    is already an op of both other targets."""
    proto = _model("SimplifiedLayerNormalization", "", [("x", F32, [2, 8]), ("s", F32, [8])], [("y", F32)], 23)
    converted, records = _take_over(proto, "onnx")
    assert records[0]["converted"]
    assert _converted_ops(converted) == ["::RMSNormalization"]
    _check_same(proto, converted, F32)
    ln = _model("LayerNormalization", "", [("x", F32, [2, 8]), ("s", F32, [8])], [("y", F32)], 18)
    for target in ("onnx", "ort"):
        _, records = _take_over(ln, target)
        assert "already" in records[0]["reason"]
    with pytest.raises(ValueError, match="unknown target"):
        take_over(ir.serde.deserialize_model(ln), "tensorrt")


def test_norm_inside_a_subgraph() -> None:
    inner = helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=-1)
    branch = helper.make_graph([inner], "then", [], [helper.make_tensor_value_info("y", F32, [2, 8])])
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y2"])], "else", [], [helper.make_tensor_value_info("y2", F32, [2, 8])]
    )
    node_if = helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=other)
    graph = helper.make_graph(
        [node_if],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", F32, [2, 8]),
            helper.make_tensor_value_info("s", F32, [8]),
        ],
        [helper.make_tensor_value_info("out", F32, [2, 8])],
    )
    proto = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    )
    converted, records = _take_over(proto)
    assert records[0]["converted"], records
    rng = np.random.default_rng(0)
    feeds = {
        "c": np.array(True),
        "x": rng.standard_normal((2, 8)).astype(np.float32),
        "s": rng.standard_normal(8).astype(np.float32),
    }
    np.testing.assert_allclose(_run(converted, feeds)["out"], _run(proto, feeds)["out"], rtol=3e-5, atol=3e-5)


def _library_cases() -> list:
    sk = [("x", F16, [2, 3, 8]), ("skip", F16, [2, 3, 8]), ("gamma", F16, [8]), ("beta", F16, [8])]
    return [
        pytest.param(
            _model(
                "LayerNormalization",
                "",
                [("x", F16, [2, 3, 8]), ("s", F16, [8]), ("b", F16, [8])],
                [("y", F16), ("mean", F32), ("inv", F32)],
                17,
            ),
            F16,
            id="LayerNormalization-17-f16",
        ),
        pytest.param(
            _model("RMSNormalization", "", [("x", F32, [2, 3, 8]), ("s", F32, [8])], [("y", F32)], 23),
            F32,
            id="RMSNormalization-23",
        ),
        pytest.param(
            _model(
                "SimplifiedLayerNormalization",
                "",
                [("x", F32, [2, 3, 8]), ("s", F16, [8])],
                [("y", F16), ("inv", F32)],
                18,
            ),
            F16,
            id="SimplifiedLayerNormalization-f32-f16",
        ),
        pytest.param(
            _model("SkipLayerNormalization", MS, sk, [("y", F16), ("", 0), ("", 0), ("sum", F16)], 18, epsilon=1e-5),
            F16,
            id="SkipLayerNormalization-f16",
        ),
        pytest.param(
            _model(
                "SkipSimplifiedLayerNormalization",
                MS,
                sk[:3],
                [("y", F16), ("", 0), ("", 0), ("sum", F16)],
                18,
                epsilon=1e-5,
            ),
            F16,
            id="SkipSimplifiedLayerNormalization-f16",
        ),
    ]


@pytest.mark.skipif(not library.library_available(), reason="the onnx_norm library is not built")
@pytest.mark.parametrize(("proto", "tol_type"), _library_cases())
def test_taken_over_nodes_run_on_our_kernels(proto: onnx.ModelProto, tol_type: int) -> None:
    converted, records = _take_over(proto)
    assert records[0]["converted"], records
    feeds = _feeds(proto)
    before = _run(proto, feeds)
    options = library.session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(converted.SerializeToString(), options, providers=["CPUExecutionProvider"])
    after = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    for name, value in before.items():
        tol = 2 * _ulps(tol_type)
        np.testing.assert_allclose(after[name], value, rtol=tol, atol=tol, err_msg=name)


def test_skip_input_made_by_a_contrib_op_is_taken_over_with_its_inferred_shape() -> None:
    """onnx's shape inference stops at ONNX Runtime's contrib ops (FastGelu here), so the skip input's shape is
    known only to ONNX Runtime's symbolic inference: optimize runs it for the take-over, then writes the model
    with the shapes it had."""
    x = helper.make_tensor_value_info("x", F32, ["batch", 3, 8])
    nodes = [
        helper.make_node("FastGelu", ["x"], ["h"], domain=MS),
        helper.make_node("SkipSimplifiedLayerNormalization", ["x", "h", "gamma"], ["y"], domain=MS, epsilon=1e-5),
    ]
    gamma = onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "gamma")
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", F32, ["batch", 3, 8])], [gamma])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    converted, report = onnx_norm.optimize(proto, take_over_native=True)
    assert [r["converted"] for r in report.native_taken_over] == [True], report.native_taken_over
    assert _converted_ops(converted) == [f"{MS}::FastGelu", f"{DOMAIN}::SkipRMSNorm"]
    # The inferred shapes served the take-over only: h is written as it was (no shape; its type is kept).
    assert [v.type.tensor_type.HasField("shape") for v in converted.graph.value_info if v.name == "h"] == [False]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)}
    np.testing.assert_allclose(_run(converted, feeds)["y"], _run(proto, feeds)["y"], rtol=3e-5, atol=3e-5)


def _residual_model(sum_read_elsewhere: bool, skip_shape: list[int], x_type: int = F32) -> onnx.ModelProto:
    """Add(a, b) -> LayerNormalization, as BERT's exports write the residual; the sum optionally also a graph
    output (the residual stream)."""
    a = helper.make_tensor_value_info("a", x_type, [2, 3, 8])
    b = helper.make_tensor_value_info("b", x_type, skip_shape)
    gamma = onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 8).astype(NP[x_type]), "gamma")
    beta = onnx.numpy_helper.from_array(np.linspace(-1, 1, 8).astype(NP[x_type]), "beta")
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"], name="residual"),
        helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], name="native", axis=-1),
    ]
    outputs = [helper.make_tensor_value_info("y", x_type, [2, 3, 8])]
    if sum_read_elsewhere:
        outputs.append(helper.make_tensor_value_info("s", x_type, [2, 3, 8]))
    graph = helper.make_graph(nodes, "g", [a, b], outputs, [gamma, beta])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("x_type", [F32, F16])
@pytest.mark.parametrize("sum_read_elsewhere", [False, True])
def test_a_residual_add_is_folded_into_the_skip_op(x_type: int, sum_read_elsewhere: bool) -> None:
    proto = _residual_model(sum_read_elsewhere, [2, 3, 8], x_type)
    converted, records = _take_over(proto)
    assert [(r["converted"], r["residual"]) for r in records] == [(True, True)], records
    assert _converted_ops(converted) == [f"{DOMAIN}::SkipLayerNorm"]  # the Add is gone
    skip_node = converted.graph.node[0]
    assert list(skip_node.input[:2]) == ["a", "b"]
    assert list(skip_node.output) == (["y", "s"] if sum_read_elsewhere else ["y"])  # Sum: the residual stream
    _check_same(proto, converted, x_type)


def test_a_broadcasting_add_is_not_folded() -> None:
    proto = _residual_model(False, [8])
    converted, records = _take_over(proto)
    assert [(r["converted"], r["residual"]) for r in records] == [(True, False)], records
    assert _converted_ops(converted) == ["::Add", f"{DOMAIN}::LayerNorm"]
    _check_same(proto, converted, F32)
