"""Never less accurate than the original: the rule (onnx_norm/accuracy.py), as the proof of each rewrite and
verify apply it, by max and mean absolute error against the float64 result with one ulp of margin."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from onnx_norm.accuracy import accuracy_loss, ulp
from onnx_norm.parity import compare
from onnx_norm.parity.tolerances import Tolerance

EXACT = np.random.default_rng(1).standard_normal((4, 64))


def test_one_ulp_of_each_type():
    assert ulp(np.float16, 1.0) == 2.0**-10 and ulp(np.float16, 3.0) == 2.0**-9
    assert ulp(np.float32, 5.0) == float(np.spacing(np.float32(5.0)))
    assert ulp(np.float16, 0.0) == 2.0**-24  # the smallest normal's ulp, not zero


def test_rounding_once_is_never_less_accurate_than_rounding_twice():
    once = EXACT.astype(np.float16)
    # Rounded, then scaled by (1 + 2 ulps) and rounded again: two steps of an fp16 chain.
    twice = (EXACT.astype(np.float16).astype(np.float64) * (1 + 2.0**-9)).astype(np.float16)
    assert accuracy_loss(once, twice, EXACT) is None
    loss = accuracy_loss(twice, once, EXACT)
    assert loss is not None and "error" in loss and "margin" in loss


def test_within_one_ulp_is_not_a_loss():
    original = EXACT.astype(np.float32)
    fused = (EXACT + 0.5 * ulp(np.float32, float(np.abs(EXACT).max()))).astype(np.float32)
    assert accuracy_loss(fused, original, EXACT) is None


@pytest.mark.parametrize("farther", [False, True])
def test_verify_fails_an_output_farther_from_exact_even_within_tolerance(farther: bool):
    """Within atol of the original, yet farther from the float64 result than it beyond one ulp: failed, and the
    message gives both distances, by max and mean."""
    original = EXACT.astype(np.float32)
    optimized = (EXACT + (3e-5 if farther else 0.0)).astype(np.float32)
    result = compare("y", [optimized], [original], Tolerance(atol=1e-4, rtol=1e-4), [EXACT])
    assert result.golden is not None
    assert result.passed is not farther
    if farther:
        assert result.verdict.startswith("less accurate than the original")
        assert "vs exact: optimized max" in result.message and "mean" in result.message


def _fp16_two_layer_model(hidden: int = 64):
    """fp16 throughout: a LayerNorm, a MatMul, a residual Add and a second LayerNorm, each norm as the ops an
    fp16 export writes (ReduceMean, Sub, Pow, Sqrt, Div, Mul, Add)."""
    from onnx import TensorProto, helper, numpy_helper

    def norm(x: str, y: str, p: str) -> list:
        steps = [
            ("ReduceMean", [x], "m", {"axes": [-1]}),
            ("Sub", [x, p + "m"], "d", {}),
            ("Pow", [p + "d", "two"], "sq", {}),
            ("ReduceMean", [p + "sq"], "v", {"axes": [-1]}),
            ("Add", [p + "v", "eps"], "ve", {}),
            ("Sqrt", [p + "ve"], "s", {}),
            ("Div", [p + "d", p + "s"], "n", {}),
            ("Mul", [p + "n", p + "g"], "gm", {}),
        ]
        nodes = [helper.make_node(op, ins, [p + out], **attrs) for op, ins, out, attrs in steps]
        return [*nodes, helper.make_node("Add", [p + "gm", p + "b"], [y])]

    rng = np.random.default_rng(0)
    residual = [helper.make_node("MatMul", ["h", "w"], ["mm"]), helper.make_node("Add", ["mm", "x"], ["r"])]
    nodes = [*norm("x", "h", "a_"), *residual, *norm("r", "y", "b_")]
    weights = {"two": np.array(2.0), "eps": np.array(1e-5), "w": rng.standard_normal((hidden, hidden)) / 8}
    for p in ("a_", "b_"):
        weights[p + "g"], weights[p + "b"] = rng.random(hidden) + 0.5, rng.standard_normal(hidden)
    inits = [numpy_helper.from_array(v.astype(np.float16), k) for k, v in weights.items()]
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [4, 16, hidden]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "fp16_two_layers", value[:1], value[1:], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return model, {"x": rng.standard_normal((4, 16, hidden)).astype(np.float16)}


def test_an_fp16_model_is_no_farther_from_exact_in_mean_than_the_original_on_the_cpu():
    import onnx_norm

    model, feeds = _fp16_two_layer_model()
    optimized, _ = onnx_norm.optimize(model)
    report = onnx_norm.verify(model, optimized, inputs=[feeds])
    assert report.passed  # within verify's rule: one fp16 ulp of margin
    golden = report.outputs[0].golden
    assert golden is not None
    assert golden.optimized_mean_abs <= golden.original_mean_abs, (golden.optimized_mean_abs, golden.original_mean_abs)


def _fp16_rmsnorm_computed_in_fp32():
    """An fp16 RMSNorm as LLaMA exports write it: X Cast to fp32, the statistic and the scale in fp32, Y Cast back
    to fp16 at the end: the chain rounds once, at its output."""
    from onnx import TensorProto, helper, numpy_helper

    steps = [
        ("Cast", ["x"], "xf", {"to": TensorProto.FLOAT}),
        ("Pow", ["xf", "two"], "sq", {}),
        ("ReduceMean", ["sq"], "ms", {"axes": [-1]}),
        ("Add", ["ms", "eps"], "mse", {}),
        ("Sqrt", ["mse"], "rms", {}),
        ("Div", ["xf", "rms"], "n", {}),
        ("Mul", ["n", "w"], "yf", {}),
        ("Cast", ["yf"], "y", {"to": TensorProto.FLOAT16}),
    ]
    nodes = [helper.make_node(op, ins, [out], name=out, **attrs) for op, ins, out, attrs in steps]
    rng = np.random.default_rng(0)
    weights = {"two": np.array(2.0), "eps": np.array(1e-6), "w": rng.random(64) + 0.5}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [2, 8, 64]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "rms_fp16_fp32_compute", value[:1], value[1:], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_the_proof_skips_a_rewrite_that_would_round_more_than_the_chain(monkeypatch):
    """The proof's "never less accurate" check (rewrite/prove.py, after the rounding check, which the candidate
    passes: a bfloat16 rounding is within the fp16 graph's few-ulp tolerance). With a rounding plan that rounds the
    normalised value to bfloat16 where the chain kept fp32, the fused op is farther from the float64 result than
    the chain beyond one fp16 ulp: the match is skipped with both errors in its reason, and the model is unchanged.
    The unpatched plan (round once, at the output) fuses the same graph."""
    from onnx import TensorProto

    import onnx_norm
    from onnx_norm.rewrite import casts

    model = _fp16_rmsnorm_computed_in_fp32()
    optimized, report = onnx_norm.optimize(model)
    assert report.fused == 1 and not report.near_misses  # the honest plan is accurate enough

    plan = casts.op_rounding

    def rounds_more(graph: casts.Rounding) -> casts.Rounding:
        return dataclasses.replace(plan(graph), normalized_type=TensorProto.BFLOAT16)

    monkeypatch.setattr(casts, "op_rounding", rounds_more)
    optimized, report = onnx_norm.optimize(model)
    assert report.fused == 0
    (miss,) = report.near_misses
    assert miss.reason.startswith("proof failed: the fused op would be less accurate than the subgraph"), miss.reason
    assert "against the subgraph's" in miss.reason and "from the float64 result (margin" in miss.reason
    assert [(n.op_type, list(n.input), list(n.output)) for n in optimized.graph.node] == [
        (n.op_type, list(n.input), list(n.output)) for n in model.graph.node
    ]


def test_verify_fails_an_optimized_model_farther_from_float64_than_the_original(tmp_path, capsys):
    """verify's half of the rule, end to end through the CLI: a fused model whose bias was nudged by 3e-5 (a rewrite
    that lost accuracy, within the fp32 tolerance of 1e-4 from the original everywhere) is farther from the float64
    evaluation than the original beyond one fp32 ulp: FAILED, exit 1, and the line says why. The honest fused model
    passes."""
    import onnx
    from onnx import numpy_helper

    import onnx_norm
    from onnx_norm.cli import main

    model, _ = _fp16_two_layer_model()
    fp32 = onnx.helper.make_model(model.graph, opset_imports=model.opset_import, ir_version=8)
    for tensor in fp32.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))
    for value in [*fp32.graph.input, *fp32.graph.output]:
        value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    original, honest, nudged = (tmp_path / f"{name}.onnx" for name in ("original", "honest", "nudged"))
    onnx.save(fp32, original)
    fused, report = onnx_norm.optimize(fp32)
    assert report.fused == 2
    onnx_norm.save(fused, honest)
    last = next(n for n in fused.graph.node if n.output[0] == "y")
    bias = next(t for t in fused.graph.initializer if t.name == last.input[2])
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + np.float32(3e-5), bias.name))
    onnx_norm.save(fused, nudged)

    argv = ["verify", str(original)]
    assert main([*argv, str(honest)]) == 0
    capsys.readouterr()
    assert main([*argv, str(nudged), "--report", str(tmp_path / "r.json")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "less accurate than the original" in out and "FAILED" in out, out
    (output,) = json.loads((tmp_path / "r.json").read_text())["outputs"]
    assert output["metrics"]["mismatched"] == 0  # within tolerance of the original: the accuracy rule failed it
    assert output["golden"]["optimized_mean_abs"] > output["golden"]["original_mean_abs"]
