"""The shapes of ONNX Runtime's own LayerNorm / SimplifiedLayerNorm / SkipLayerNorm fusion test models, rebuilt
here (written for these tests from what its generator scripts and graph-transform tests exercise): nodes appended
after their consumers, residual and bias Adds after the norm, a duplicated centring Sub, gamma on either side of the
Mul, graph outputs without a type. Every positive case is fused and passes verify (parity, and never less
accurate than the original); every negative one is left exactly as it was."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_norm

H = 4
SHAPE = [16, 32, H]
F32 = TensorProto.FLOAT


def _t(name: str, values, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def _model(nodes, inputs, initializers, *, typed_output: bool = False, dtype: int = F32) -> onnx.ModelProto:
    """Nodes as given (consumers first, as the generators append them), opset 13, output typed or not."""
    output = helper.make_tensor_value_info("C", dtype, SHAPE) if typed_output else onnx.ValueInfoProto(name="C")
    graph = helper.make_graph(
        nodes, "ort_case", [helper.make_tensor_value_info(n, dtype, SHAPE) for n in inputs], [output], initializers
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _layer_norm_nodes(x: str, *, two_subs: bool, gamma_first: bool) -> list[onnx.NodeProto]:
    centred_for_div = "sb1" if two_subs else "sb2"
    nodes = [
        helper.make_node("Mul", ["gamma", "div"] if gamma_first else ["div", "gamma"], ["mul"]),
        helper.make_node("Add", ["mul", "beta"], ["C"]),
        helper.make_node("Div", [centred_for_div, "sqrt"], ["div"]),
        helper.make_node("Sqrt", ["ve"], ["sqrt"]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("ReduceMean", ["pow"], ["var"], axes=[-1], keepdims=1),
        helper.make_node("Pow", ["sb2", "two"], ["pow"]),
        helper.make_node("Sub", [x, "mean"], ["sb2"]),
        helper.make_node("ReduceMean", [x], ["mean"], axes=[-1], keepdims=1),
    ]
    if two_subs:
        nodes.append(helper.make_node("Sub", [x, "mean"], ["sb1"]))
    return nodes


def _ln_constants(eps: float = 1e-12) -> list[onnx.TensorProto]:
    return [
        _t("two", 2.0),
        _t("eps", eps),
        _t("gamma", [1.0, 2.0, 3.0, 4.0]),
        _t("beta", [0.1, 0.2, 0.3, 0.4]),
    ]


def _skip(fmt: int, partial: bool) -> onnx.ModelProto:
    """Format 1: (A + bias) + B; format 2: A + (B + bias); format 3: A + B. `partial`: the sum before the
    residual Add (or the residual sum itself, format 3) has another consumer too."""
    nodes = _layer_norm_nodes("ln_in", two_subs=True, gamma_first=True)
    constants = _ln_constants()
    if fmt == 1:
        nodes += [helper.make_node("Add", ["A", "bias"], ["a3"]), helper.make_node("Add", ["a3", "B"], ["ln_in"])]
    elif fmt == 2:
        nodes += [helper.make_node("Add", ["B", "bias"], ["a3"]), helper.make_node("Add", ["A", "a3"], ["ln_in"])]
    else:
        nodes += [helper.make_node("Add", ["A", "B"], ["ln_in"])]
    if fmt != 3:
        constants.append(_t("bias", [0.1, 0.2, 0.3, 0.4]))
    model = _model(nodes, ["A", "B"], constants)
    if partial:
        model.graph.node.append(helper.make_node("Neg", ["ln_in" if fmt == 3 else "a3"], ["neg"]))
        model.graph.output.append(onnx.ValueInfoProto(name="neg"))
    return model


def _simplified(reciprocal: bool) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Mul", ["scale", "normed"], ["C"]),
        helper.make_node("Mul", ["x", "inv"], ["normed"])
        if reciprocal
        else helper.make_node("Div", ["x", "sqrt"], ["normed"]),
        helper.make_node("Sqrt", ["ve"], ["sqrt"]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Pow", ["x", "two"], ["sq"]),
    ]
    if reciprocal:
        nodes.insert(2, helper.make_node("Reciprocal", ["sqrt"], ["inv"]))
    constants = [_t("two", 2.0), _t("eps", 1e-6), _t("scale", [1.0, 2.0, 3.0, 4.0])]
    return _model(nodes, ["x"], constants)


def _fp16_with_casts(skip: bool) -> onnx.ModelProto:
    """fp16 in and out, the norm in fp32 between Casts (ORT's layer_norm_with_cast cases)."""
    nodes = _layer_norm_nodes("x32", two_subs=False, gamma_first=False)
    nodes[1] = helper.make_node("Add", ["mul", "beta"], ["c32"])
    nodes += [helper.make_node("Cast", ["c32"], ["C"], to=TensorProto.FLOAT16)]
    if skip:
        nodes += [helper.make_node("Add", ["A", "B"], ["x16"]), helper.make_node("Cast", ["x16"], ["x32"], to=F32)]
        inputs = ["A", "B"]
    else:
        nodes += [helper.make_node("Cast", ["x"], ["x32"], to=F32)]
        inputs = ["x"]
    return _model(nodes, inputs, _ln_constants(1e-5), dtype=TensorProto.FLOAT16)


def _fp16_skip_to_fp32() -> onnx.ModelProto:
    """fp16 residual Add, Cast to fp32 before the norm, fp32 out: Y needs another type than X."""
    nodes = _layer_norm_nodes("x32", two_subs=False, gamma_first=False)
    nodes += [helper.make_node("Add", ["A", "B"], ["x16"]), helper.make_node("Cast", ["x16"], ["x32"], to=F32)]
    graph = helper.make_graph(
        nodes,
        "ort_case",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT16, SHAPE) for n in ("A", "B")],
        [onnx.ValueInfoProto(name="C")],
        _ln_constants(1e-5),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


POSITIVE = {
    "layer_norm": (
        lambda: _model(_layer_norm_nodes("x", two_subs=False, gamma_first=False), ["x"], _ln_constants()),
        {"LayerNorm": 1},
    ),
    "layer_norm_two_subs_gamma_first": (
        lambda: _model(
            _layer_norm_nodes("x", two_subs=True, gamma_first=True), ["x"], _ln_constants(), typed_output=True
        ),
        {"LayerNorm": 1},
    ),
    "skip_format1": (lambda: _skip(1, False), {"SkipLayerNorm": 1}),
    "skip_format2": (lambda: _skip(2, False), {"SkipLayerNorm": 1}),
    "skip_format3": (lambda: _skip(3, False), {"SkipLayerNorm": 1}),
    "skip_format1_partial": (lambda: _skip(1, True), None),
    "skip_format2_partial": (lambda: _skip(2, True), None),
    "skip_format3_sum_also_used": (lambda: _skip(3, True), None),
    "simplified_div": (lambda: _simplified(False), {"RMSNorm": 1}),
    "simplified_reciprocal": (lambda: _simplified(True), {"RMSNorm": 1}),
    "layer_norm_fp16_casts": (lambda: _fp16_with_casts(False), {"LayerNorm": 1}),
    "skip_layer_norm_fp16_casts": (lambda: _fp16_with_casts(True), {"SkipLayerNorm": 1}),
}


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = (rng.standard_normal(SHAPE) * 2 + 0.5).astype(dtype)
    return feeds


def _norm_ops(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.domain == "onnx_norm":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("case", list(POSITIVE))
def test_onnx_runtime_positive_case_is_fused_with_parity(case: str):
    build, expected = POSITIVE[case]
    model = build()
    optimized, report = onnx_norm.optimize(model)
    fused = _norm_ops(optimized)
    assert sum(fused.values()) == 1, (fused, [m.reason for m in report.near_misses])
    if expected is not None:
        assert fused == expected
    parity = onnx_norm.verify(model, optimized, inputs=[_feeds(model)])
    assert parity.passed, [o.message for o in parity.outputs]


@pytest.mark.parametrize("build", [_fp16_skip_to_fp32])
def test_onnx_runtime_mixed_precision_skip_case(build):
    model = build()
    optimized, report = onnx_norm.optimize(model)
    assert sum(_norm_ops(optimized).values()) == 1, [m.reason for m in report.near_misses]
    assert onnx_norm.verify(model, optimized, inputs=[_feeds(model)]).passed


def _negative(kind: str) -> onnx.ModelProto:
    nodes = _layer_norm_nodes("x", two_subs=False, gamma_first=False)
    constants = _ln_constants()
    if kind == "cube":  # Pow(d, 3): not a variance
        constants[0] = _t("two", 3.0)
    elif kind == "variance_over_another_axis":
        nodes[5] = helper.make_node("ReduceMean", ["pow"], ["var"], axes=[1], keepdims=1)
    elif kind == "mean_of_another_tensor":
        nodes[7] = helper.make_node("Sub", ["x", "mean_y"], ["sb2"])
        nodes.append(helper.make_node("ReduceMean", ["y"], ["mean_y"], axes=[-1], keepdims=1))
        return _model(nodes, ["x", "y"], constants)
    return _model(nodes, ["x"], constants)


@pytest.mark.parametrize("kind", ["cube", "variance_over_another_axis", "mean_of_another_tensor"])
def test_onnx_runtime_negative_case_is_left_exactly_as_it_was(kind: str):
    import onnxruntime as ort

    model = _negative(kind)
    optimized, _ = onnx_norm.optimize(model)
    assert _norm_ops(optimized) == {}
    feeds = _feeds(model)

    def run(m: onnx.ModelProto) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

    for before, after in zip(run(model), run(optimized), strict=True):
        np.testing.assert_array_equal(after, before)
