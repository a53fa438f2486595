"""The parity gate (onnx_norm.parity): correct optimized models pass, corrupted ones fail and name the norm.

The models are built by hand so each test controls exactly what differs: a two-norm fp32 network with decomposed
LayerNorms as the original and standard LayerNormalization nodes (tagged like the rewriter tags its nodes) as the
optimized model, and an fp16 RMSNorm whose decomposed graph overflows where a float32-accumulating fused op does not.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_norm import inputs, parity
from onnx_norm.sessions import SessionError

HIDDEN = 32
EPS = 1e-5


def _tag(node: onnx.NodeProto, rule: str) -> onnx.NodeProto:
    prop = node.metadata_props.add()
    prop.key, prop.value = parity.RULE_KEY, rule
    return node


def _model(nodes, initializers, dtype=TensorProto.FLOAT, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "two_norms",
        [helper.make_tensor_value_info("x", dtype, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info("y", dtype, ["batch", "sequence", HIDDEN])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _weights(np_dtype=np.float32) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(7)
    arrays = {
        "ln0.gamma": 1 + 0.1 * rng.standard_normal(HIDDEN),
        "ln0.beta": 0.1 * rng.standard_normal(HIDDEN),
        "ln1.gamma": 1 + 0.1 * rng.standard_normal(HIDDEN),
        "ln1.beta": 0.1 * rng.standard_normal(HIDDEN),
        "proj.weight": rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN),
    }
    return [numpy_helper.from_array(a.astype(np_dtype), name) for name, a in arrays.items()]


def _decomposed_ln(prefix: str, x: str, out: str) -> list[onnx.NodeProto]:
    """What torch's opset-13 export of nn.LayerNorm looks like."""
    return [
        helper.make_node("ReduceMean", [x], [f"{prefix}/mean"], axes=[-1], name=f"{prefix}/ReduceMean"),
        helper.make_node("Sub", [x, f"{prefix}/mean"], [f"{prefix}/centred"], name=f"{prefix}/Sub"),
        helper.make_node("Pow", [f"{prefix}/centred", "two"], [f"{prefix}/sq"], name=f"{prefix}/Pow"),
        helper.make_node("ReduceMean", [f"{prefix}/sq"], [f"{prefix}/var"], axes=[-1], name=f"{prefix}/ReduceMean_1"),
        helper.make_node("Add", [f"{prefix}/var", "eps"], [f"{prefix}/var_eps"], name=f"{prefix}/Add"),
        helper.make_node("Sqrt", [f"{prefix}/var_eps"], [f"{prefix}/std"], name=f"{prefix}/Sqrt"),
        helper.make_node("Div", [f"{prefix}/centred", f"{prefix}/std"], [f"{prefix}/normed"], name=f"{prefix}/Div"),
        helper.make_node("Mul", [f"{prefix}/normed", f"{prefix}.gamma"], [f"{prefix}/scaled"], name=f"{prefix}/Mul"),
        helper.make_node("Add", [f"{prefix}/scaled", f"{prefix}.beta"], [out], name=f"{prefix}/Add_1"),
    ]


def _tail(h0: str, h1: str) -> list[onnx.NodeProto]:
    return [
        helper.make_node("MatMul", [h0, "proj.weight"], ["proj"], name="proj/MatMul"),
        helper.make_node("Tanh", ["proj"], [h1 + "_in"], name="act/Tanh"),
    ]


def original_model() -> onnx.ModelProto:
    constants = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(EPS, np.float32), "eps"),
    ]
    nodes = [*_decomposed_ln("ln0", "x", "h0"), *_tail("h0", "h1"), *_decomposed_ln("ln1", "h1_in", "y")]
    return _model(nodes, _weights() + constants)


def optimized_model(
    *, eps1: float = EPS, scale1: str = "ln1.gamma", bias1: str = "ln1.beta", cast_before_ln1: bool = False
) -> onnx.ModelProto:
    """The original with each norm fused to a tagged LayerNormalization; arguments corrupt the second one."""
    ln0 = _tag(
        helper.make_node(
            "LayerNormalization", ["x", "ln0.gamma", "ln0.beta"], ["fused0"], axis=-1, epsilon=EPS, name="fused_ln0"
        ),
        "layer_norm_div",
    )
    if cast_before_ln1:
        # The cast to fp16 placed before the norm instead of after: the norm runs on rounded inputs in fp16.
        ln1_nodes = [
            helper.make_node("Cast", ["h1_in"], ["h1_half"], to=TensorProto.FLOAT16, name="cast_in"),
            helper.make_node("Cast", [scale1], ["g_half"], to=TensorProto.FLOAT16, name="cast_g"),
            helper.make_node("Cast", [bias1], ["b_half"], to=TensorProto.FLOAT16, name="cast_b"),
            helper.make_node(
                "LayerNormalization", ["h1_half", "g_half", "b_half"], ["ln1_half"], axis=-1, epsilon=eps1
            ),
            _tag(
                helper.make_node("Cast", ["ln1_half"], ["y"], to=TensorProto.FLOAT, name="fused_ln1"), "layer_norm_div"
            ),
        ]
    else:
        ln1_nodes = [
            _tag(
                helper.make_node(
                    "LayerNormalization", ["h1_in", scale1, bias1], ["y"], axis=-1, epsilon=eps1, name="fused_ln1"
                ),
                "layer_norm_div",
            )
        ]
    return _model([ln0, *_tail("fused0", "h1"), *ln1_nodes], _weights())


def _run(original, optimized, **kwargs) -> parity.ParityReport:
    kwargs.setdefault("samples", 2)
    kwargs.setdefault("shapes", {"sequence": [16]})
    return parity.verify(original, optimized, **kwargs)


def test_a_correct_optimized_model_passes_with_every_norm_mapped():
    report = _run(original_model(), optimized_model(), per_node=True)
    assert report.passed
    (output,) = report.outputs
    assert output.name == "y"
    assert output.passed
    assert output.metrics.mismatched == 0
    assert output.metrics.cosine > 0.999999
    assert report.golden == "ort"
    assert output.golden is not None
    assert output.golden.optimized_max_abs < 1e-4
    assert [(n.node, n.original_value, n.status) for n in report.norms] == [
        ("fused_ln0", "h0", "ok"),
        ("fused_ln1", "y", "ok"),
    ]
    assert report.first_divergent_norm is None


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda: optimized_model(eps1=0.5), id="epsilon-changed"),
        pytest.param(lambda: optimized_model(scale1="ln1.beta", bias1="ln1.gamma"), id="scale-swapped-with-bias"),
        pytest.param(lambda: optimized_model(scale1="ln0.gamma"), id="scale-of-another-norm"),
        pytest.param(lambda: optimized_model(cast_before_ln1=True), id="cast-order-changed"),
    ],
)
def test_a_corrupted_norm_fails_and_the_per_node_report_names_it(corrupt: Callable[[], onnx.ModelProto]):
    original = original_model()
    # Hidden states with a large mean make the fp16 cast placement visible, as in real residual streams.
    rng = np.random.default_rng(0)
    samples = [{"x": (rng.standard_normal((1, 16, HIDDEN)) * 3 + 40).astype(np.float32)} for _ in range(2)]
    report = parity.verify(original, corrupt(), inputs=samples, per_node=True)
    assert not report.passed
    (output,) = report.outputs
    assert not output.passed
    assert output.metrics.mismatched > 0
    assert output.metrics.first_mismatches  # indices of the first elements out of tolerance
    statuses = {n.node: n.status for n in report.norms}
    assert statuses == {"fused_ln0": "ok", "fused_ln1": "diverges"}
    assert report.first_divergent_norm.node == "fused_ln1"
    assert report.to_dict()["first_divergent_norm"] == "fused_ln1"


def test_a_norm_downstream_of_a_broken_one_is_reported_as_inheriting_the_difference():
    model = optimized_model()
    model.graph.node[0].attribute[1].f = 0.5  # epsilon of fused_ln0
    report = _run(original_model(), model, per_node=True)
    statuses = {n.node: (n.status, n.inputs_match) for n in report.norms}
    assert statuses == {"fused_ln0": ("diverges", True), "fused_ln1": ("input differs", False)}
    assert report.first_divergent_norm.node == "fused_ln0"


# ------------------------------------------------------------------------------------------------ fp16


def _rms_fp16(fused: bool) -> onnx.ModelProto:
    """fp16 RMSNorm, rsqrt style, normalised value rounded to fp16 before the fp16 weight multiply.

    Original: the square is rounded to fp16, as an fp16 graph computes it op by op on CUDA. ONNX Runtime's CPU
    provider runs fp16 graphs in fp32 between inserted casts, so the rounding is an explicit Cast pair here.
    Optimized: statistics in fp32 (what the fused op does with normalized_type = multiply_type = FLOAT16)."""
    weight = numpy_helper.from_array(
        (1 + 0.1 * np.random.default_rng(3).standard_normal(HIDDEN)).astype(np.float16), "w"
    )
    square = [helper.make_node("Mul", ["xf", "xf"], ["sq"], name="rms/Mul")]
    if not fused:
        square = [
            helper.make_node("Mul", ["xf", "xf"], ["sq32"], name="rms/Mul"),
            helper.make_node("Cast", ["sq32"], ["sq16"], to=TensorProto.FLOAT16, name="rms/Cast_sq"),
            helper.make_node("Cast", ["sq16"], ["sq"], to=TensorProto.FLOAT, name="rms/Cast_sq_back"),
        ]
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT, name="rms/Cast"),
        *square,
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], name="rms/ReduceMean"),
        helper.make_node("Add", ["ms", "eps"], ["ms_eps"], name="rms/Add"),
        helper.make_node("Sqrt", ["ms_eps"], ["rms"], name="rms/Sqrt"),
        helper.make_node("Reciprocal", ["rms"], ["inv"], name="rms/Reciprocal"),
        helper.make_node("Mul", ["xf", "inv"], ["nf"], name="rms/Mul_1"),
        helper.make_node("Cast", ["nf"], ["n16"], to=TensorProto.FLOAT16, name="rms/Cast_1"),
        helper.make_node("Mul", ["n16", "w"], ["y"], name="rms/Mul_2"),
    ]
    if fused:
        _tag(nodes[-1], "rms_norm_rsqrt").name = "fused_rms"
    constants = [numpy_helper.from_array(np.array(1e-6, np.float32), "eps")]
    return _model(nodes, [weight, *constants], dtype=TensorProto.FLOAT16)


def _outlier_samples() -> list[dict[str, np.ndarray]]:
    # Outlier features of a few hundred, as fp16 LLM residual streams have: x*x overflows fp16 (max 65504).
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8, HIDDEN))
    x[:, 0, 3] = 300.0  # one token per sequence
    return [{"x": x.astype(np.float16)}]


def test_fp16_fused_norm_more_accurate_than_the_original_passes_against_the_golden_result():
    report = parity.verify(_rms_fp16(fused=False), _rms_fp16(fused=True), inputs=_outlier_samples(), per_node=True)
    assert report.passed
    (output,) = report.outputs
    assert output.metrics.mismatched > 0  # far from the original, which overflowed...
    assert output.golden.optimized_max_abs < 0.05 < output.golden.original_max_abs  # ...but close to exact
    assert output.verdict == "closer to the exact result than the original"


def test_without_the_golden_result_the_same_fp16_model_is_a_parity_failure():
    report = parity.verify(_rms_fp16(fused=False), _rms_fp16(fused=True), inputs=_outlier_samples(), golden="none")
    assert report.golden == "none"
    assert not report.passed


def test_a_corrupted_fp16_norm_is_not_excused_by_the_golden_result():
    corrupted = _rms_fp16(fused=True)
    corrupted.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array(0.5, np.float32), "eps"))
    report = parity.verify(_rms_fp16(fused=False), corrupted, inputs=_outlier_samples(), per_node=True)
    assert not report.passed
    assert report.outputs[0].golden.within_envelope is False
    assert report.first_divergent_norm.node == "fused_rms"


# ------------------------------------------------------------------------------------------------ metrics


def test_tolerances_default_by_dtype_and_take_per_output_overrides():
    spec = parity.ToleranceSpec(atol={"logits": 0.5, "*": 1e-3}, rtol=None)
    assert spec.for_output("logits", np.dtype(np.float32)) == parity.Tolerance(0.5, 1e-4)
    assert spec.for_output("hidden", np.dtype(np.float16)) == parity.Tolerance(1e-3, 1e-2)
    assert parity.ToleranceSpec().for_output("ids", np.dtype(np.int64)) == parity.Tolerance(0.0, 0.0)
    with pytest.raises(inputs.InputError, match="'median' is not a statistic"):
        parity.ToleranceSpec(stat="median")


def test_statistics_other_than_elementwise_judge_the_whole_tensor():
    expected = [np.ones(1000, np.float32)]
    actual = [expected[0].copy()]
    actual[0][0] += 1.0  # one outlier
    elementwise = parity.compare("y", actual, expected, parity.Tolerance(1e-3, 1e-3))
    mean = parity.compare("y", actual, expected, parity.Tolerance(1e-2, 0.0, "mean"))
    quantile = parity.compare("y", actual, expected, parity.Tolerance(1e-3, 0.0, "quantile", 0.99))
    maximum = parity.compare("y", actual, expected, parity.Tolerance(1e-2, 1e-2, "max"))
    assert not elementwise.passed
    assert mean.passed
    assert quantile.passed
    assert not maximum.passed
    assert elementwise.metrics.mismatched == 1
    assert elementwise.metrics.first_mismatches[0]["index"] == [0]
    assert elementwise.metrics.max_abs == pytest.approx(1.0)
    assert elementwise.metrics.mean_abs == pytest.approx(1e-3)


def test_nan_or_inf_on_one_side_only_fails_and_matching_specials_pass():
    expected = [np.array([1.0, np.inf, np.nan, 2.0], np.float32)]
    same = parity.compare("y", [expected[0].copy()], expected, parity.Tolerance(1e-3, 1e-3, "mean"))
    assert same.passed
    assert same.metrics.nonfinite_mismatched == 0
    broken = [np.array([1.0, np.inf, np.nan, np.nan], np.float32)]
    result = parity.compare("y", broken, expected, parity.Tolerance(10.0, 10.0, "mean"))
    assert not result.passed
    assert result.metrics.nonfinite_mismatched == 1
    assert "NaN/Inf" in result.verdict


def test_shape_or_dtype_changes_fail():
    base = [np.zeros((2, 3), np.float32)]
    assert "shape" in parity.compare("y", [np.zeros((3, 2), np.float32)], base, parity.Tolerance(1, 1)).verdict
    assert "dtype" in parity.compare("y", [np.zeros((2, 3), np.float16)], base, parity.Tolerance(1, 1)).verdict


def test_the_json_report_carries_the_same_numbers(tmp_path):
    report = _run(original_model(), optimized_model(eps1=0.5), per_node=True)
    path = tmp_path / "parity.json"
    report.write_json(path)
    data = json.loads(path.read_text())
    assert data["status"] == "FAILED"
    assert data["passed"] is False
    (output,) = data["outputs"]
    assert output["metrics"]["max_abs"] == report.outputs[0].metrics.max_abs
    assert output["metrics"]["mismatched"] == report.outputs[0].metrics.mismatched
    assert {n["node"]: n["status"] for n in data["norms"]} == {"fused_ln0": "ok", "fused_ln1": "diverges"}
    assert data["shapes"] == {"x": [1, 16, HIDDEN]}
    assert data["samples"] == 2


def test_upcast_copy_is_float64_throughout():
    upcast = parity.upcast_to_double(_rms_fp16(fused=True))
    assert upcast.graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    assert {t.data_type for t in upcast.graph.initializer} == {TensorProto.DOUBLE}
    casts = [n for n in upcast.graph.node if n.op_type == "Cast"]
    assert casts
    assert all(a.i == TensorProto.DOUBLE for n in casts for a in n.attribute if a.name == "to")


def test_models_with_different_inputs_are_refused():
    other = original_model()
    other.graph.input[0].name = "hidden_states"
    other.graph.node[0].input[0] = "hidden_states"
    with pytest.raises(inputs.InputError, match="different inputs"):
        parity.verify(original_model(), other)


def _unknown_op(model: onnx.ModelProto, index: int) -> onnx.ModelProto:
    """Node `index` becomes an op of a domain ONNX Runtime has no kernels for: a valid model that ORT rejects."""
    model.graph.node[index].op_type = "NoSuchOp"
    model.graph.node[index].domain = "no.such.domain"
    model.opset_import.append(helper.make_opsetid("no.such.domain", 1))
    return model


def test_an_optimized_model_that_onnx_runtime_rejects_is_a_parity_failure():
    broken = _unknown_op(optimized_model(), 1)  # the projection MatMul
    report = _run(original_model(), broken)
    assert not report.passed
    assert report.outputs[0].verdict.startswith("the optimized model does not run: ONNX Runtime could not load")


def test_an_original_that_onnx_runtime_rejects_is_an_error():
    broken = _unknown_op(original_model(), 0)
    with pytest.raises(SessionError, match="could not load the original model"):
        _run(broken, optimized_model())
