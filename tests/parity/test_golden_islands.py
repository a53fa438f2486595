"""The float64 golden model runs in ONNX Runtime even where ORT has no float64 kernel: such ops run in float32 between
Casts, multi-input ones too (Conv: ConvNeXt, UNets, VAEs, timm), and ops ORT expands into their ONNX function body
(Gelu-20 into Erf). Before, every Conv model and every dynamo export with Gelu was verified without a float64
result ("golden: none"): onnx.reference, the fallback, cannot run LayerNormalization with stash_type=double."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_norm import parity
from onnx_norm.parity import golden

C = 8


def _conv_gelu_layer_norm(opset: int = 20) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((C, C, 1, 1)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b"),
        numpy_helper.from_array(np.ones(C, np.float32), "scale"),
        numpy_helper.from_array(np.zeros(C, np.float32), "shift"),
        numpy_helper.from_array(np.array([0, 2, 3, 1], np.int64), "nhwc"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"]),
        helper.make_node("Gelu", ["c"], ["g"]),
        helper.make_node("Transpose", ["g"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("LayerNormalization", ["t", "scale", "shift"], ["y"], axis=-1, epsilon=1e-6),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_gelu_ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, C])],
        weights[:4],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _float64(x: np.ndarray, model: onnx.ModelProto) -> np.ndarray:
    """The model's result in numpy float64 (Gelu exact, by erf's series through math.erf)."""
    import math

    w, b = (numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer[:2])
    c = np.einsum("oi,nihw->nohw", w[:, :, 0, 0], x.astype(np.float64)) + b[None, :, None, None]
    g = 0.5 * c * (1 + np.vectorize(math.erf)(c / math.sqrt(2)))
    t = g.transpose(0, 2, 3, 1)
    return (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-6)


def test_conv_and_gelu_models_get_a_float64_result_from_onnx_runtime() -> None:
    model = _conv_gelu_layer_norm()
    x = np.random.default_rng(1).standard_normal((1, C, 4, 4)).astype(np.float32)
    report = parity.verify(model, model, inputs=[{"x": x}])
    assert report.passed
    assert report.golden == "ort"
    (output,) = report.outputs
    assert output.golden is not None
    evaluator = golden.GoldenEvaluator(model, "ort", None)
    result = evaluator.run({"x": x}, ["y"])
    assert result is not None
    # float32 islands (Conv, Gelu) bound the golden result's error near float32's, far below any fp16 tolerance
    assert np.abs(result["y"] - _float64(x, model)).max() < 1e-5


def test_only_ops_whose_inputs_and_outputs_are_float_by_their_schema_are_narrowed() -> None:
    model = _conv_gelu_layer_norm()
    assert golden._narrowable(model, "Conv") == {"Conv": ([True, True, True], [True])}
    assert list(golden._narrowable(model, "Erf")) == ["Gelu"]  # no Erf node: ORT expanded Gelu's function body
    # Transpose's data may be an integer tensor: a Cast to float32 could change it, so it is never narrowed
    assert golden._narrowable(model, "Transpose") == {}
    narrowed = golden._run_in_float32(model, golden._narrowable(model, "Conv"))
    conv = next(node for node in narrowed.graph.node if node.op_type == "Conv")
    casts = [node for node in narrowed.graph.node if node.op_type == "Cast"]
    assert len(casts) == 4  # X, W, B to float32, Y back
    assert all(name.startswith("onnx_norm_f32_") for name in conv.input)


def test_narrowing_rounds_make_distinct_names() -> None:
    """Each round narrows the op types ORT names then (Conv, then Gelu): the Casts of a later round, whose nodes sit
    at other positions, must not reuse a name of an earlier one."""
    model = _conv_gelu_layer_norm()
    twice = golden._run_in_float32(
        golden._run_in_float32(model, golden._narrowable(model, "Conv")),
        {"Gelu": golden._narrowable(model, "Erf")["Gelu"]},
    )
    outputs = [name for node in twice.graph.node for name in node.output]
    assert len(outputs) == len(set(outputs))
    onnx.checker.check_model(twice)


def _instance_norm_model(opset: int) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    weights = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, C).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "bias"),
    ]
    node = helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"], epsilon=1e-3)
    graph = helper.make_graph(
        [node],
        "instance_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, C, 3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, C, 3, 5])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def test_instance_normalization_is_evaluated_in_float64_not_as_a_float32_island() -> None:
    """ORT has no float64 InstanceNormalization: as a float32 island the golden result would be the original's own
    rounding (the original exact, any rewrite 'less accurate'); written out in float64 ops it is exact."""
    x = np.random.default_rng(3).standard_normal((2, C, 3, 5)).astype(np.float32) * 3 + 5
    for opset in (17, 18):  # ReduceMean's axes an attribute, then an input
        model = _instance_norm_model(opset)
        result = golden.GoldenEvaluator(model, "ort", None).run({"x": x}, ["y"])
        assert result is not None
        scale, bias = (numpy_helper.to_array(t).astype(np.float64).reshape(1, C, 1, 1) for t in model.graph.initializer)
        x64 = x.astype(np.float64)
        mean = x64.mean(axis=(2, 3), keepdims=True)
        var = x64.var(axis=(2, 3), keepdims=True)
        exact = (x64 - mean) / np.sqrt(var + np.float64(np.float32(1e-3))) * scale + bias
        assert result["y"].dtype == np.float64
        np.testing.assert_allclose(result["y"], exact, rtol=1e-12, atol=1e-12)
