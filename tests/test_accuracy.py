"""Never less accurate than the original: the rule (onnx_norm/accuracy.py), as the proof of each rewrite and
verify apply it, by max and mean absolute error against the float64 result with one ulp of margin."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_norm.accuracy import accuracy_loss, ulp
from onnx_norm.parity.metrics import compare
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
