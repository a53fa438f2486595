"""verify --per-node names each norm of the original that overflows, underflows or loses its epsilon in its own
narrow type on the given inputs, and shows the fused op's error beside the original's (parity/numerics.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnx_norm
from onnx_norm.cli import main

H = 64


def _layer_norm(dtype: int, eps: float) -> onnx.ModelProto:
    """A decomposed LayerNorm computed in `dtype` throughout, as an fp16 export writes it."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], name="mean"),
        helper.make_node("Sub", ["x", "mean"], ["d"], name="centre"),
        helper.make_node("Pow", ["d", "two"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], name="variance"),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
        helper.make_node("Sqrt", ["ve"], ["std"], name="std"),
        helper.make_node("Div", ["d", "std"], ["y"], name="normalise"),
    ]
    constants = [numpy_helper.from_array(np.array(v, np_dtype), n) for n, v in (("two", 2), ("eps", eps))]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", dtype, ["b", H])],
        [helper.make_tensor_value_info("y", dtype, ["b", H])],
        constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _inputs(dtype) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, H)) * 400  # squares above fp16's 65504
    x[1] = rng.standard_normal(H) * 1e-4  # squares below fp16's smallest subnormal
    return {"x": x.astype(dtype)}


def test_an_fp16_norm_that_overflows_is_named_with_the_fused_error_beside_it(tmp_path: Path, capsys):
    model = _layer_norm(TensorProto.FLOAT16, 1e-12)  # 1e-12 is 0 in fp16
    optimized, _ = onnx_norm.optimize(model)
    report = onnx_norm.verify(model, optimized, inputs=[_inputs(np.float16)], per_node=True)
    (norm,) = report.norms
    problems = " | ".join(norm.numerics.problems)
    assert "Pow 'square' (fp16):" in problems and "overflow to inf/NaN" in problems
    assert "ReduceMean 'variance' (fp16):" in problems and "underflow to 0" in problems
    assert "Add 'add_eps': epsilon is 0 in fp16" in problems
    # The original computed in fp16 is far off where it overflowed; the fused op (fp32 statistics) is not.
    assert norm.numerics.original_max_error > 1.0
    assert norm.numerics.fused_max_error < 1e-2
    assert report.to_dict()["norms"][0]["numerics"]["problems"] == norm.numerics.problems

    onnx.save(model, tmp_path / "m.onnx")
    onnx.save(optimized, tmp_path / "opt.onnx")
    np.savez(tmp_path / "x.npz", **_inputs(np.float16))
    code = main(
        [
            "verify",
            str(tmp_path / "m.onnx"),
            str(tmp_path / "opt.onnx"),
            "--per-node",
            "--inputs",
            str(tmp_path / "x.npz"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out  # the fused op is closer to the float64 result: parity passes
    assert "Original norms in their own types" in out and "overflow to inf/NaN" in out


def test_a_float32_norm_has_nothing_to_name():
    model = _layer_norm(TensorProto.FLOAT, 1e-5)
    optimized, _ = onnx_norm.optimize(model)
    report = onnx_norm.verify(model, optimized, inputs=[_inputs(np.float32)], per_node=True)
    (norm,) = report.norms
    assert norm.numerics is not None and norm.numerics.problems == []
    assert norm.numerics.fused_max_error < 1e-4


def test_a_norm_on_its_input_widened_in_front_is_one_norm_with_its_input_mapped():
    """An fp16 norm whose result the graph Casts to fp32 is fused as the op on X cast to fp32 (the Cast is the
    rewrite's, not a norm): --per-node lists the one norm, maps its X through the Cast (inputs match), and still
    names the original's overflow."""
    model = _layer_norm(TensorProto.FLOAT16, 1e-12)
    graph = model.graph
    graph.node[-1].output[0] = "y16"
    graph.node.append(helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT))
    graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    optimized, _ = onnx_norm.optimize(model)
    assert [n.op_type for n in optimized.graph.node] == ["Cast", "LayerNorm"]
    report = onnx_norm.verify(model, optimized, inputs=[_inputs(np.float16)], per_node=True, atol=1e-2, rtol=1e-2)
    assert report.passed, [o.message for o in report.outputs]
    (norm,) = report.norms
    assert norm.op_type == "LayerNorm" and norm.inputs_match is True and norm.status == "ok"
    assert not any("no original value" in w for w in report.warnings), report.warnings
    assert norm.numerics is not None and any("overflow to inf/NaN" in p for p in norm.numerics.problems)


def test_a_bf16_rounding_that_underflows_is_named():
    """A bf16 model as ONNX Runtime's CPU provider runs one (each op in fp32, its result rounded to bf16 by a Cast,
    tools/fp16_accuracy.py's conversion): the squares of a row of tiny values underflow to 0 at the bf16 rounding,
    not in fp32, and --per-node names that Cast in bf16."""
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16, name="to_bf16")]
    wide = {"xb": "xw", "sq": "sqw", "var": "varw"}
    for name, widened in wide.items():
        if name != "xb":
            nodes.append(helper.make_node("Cast", [name + "32"], [name], to=TensorProto.BFLOAT16, name=f"round_{name}"))
        nodes.append(helper.make_node("Cast", [name], [widened], to=TensorProto.FLOAT, name=f"widen_{name}"))
    nodes += [
        helper.make_node("Mul", ["xw", "xw"], ["sq32"], name="square"),
        helper.make_node("ReduceMean", ["sqw"], ["var32"], axes=[-1], name="variance"),
        helper.make_node("Add", ["varw", "eps"], ["ve"], name="add_eps"),
        helper.make_node("Sqrt", ["ve"], ["std"], name="std"),
        helper.make_node("Div", ["xw", "std"], ["y"], name="normalise"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", H])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", H])],
        [numpy_helper.from_array(np.array(1e-30, np.float32), "eps")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = np.random.default_rng(0).standard_normal((2, H))
    x[1] *= 2.0**-70  # squares near 2^-140: fp32 subnormals, below bf16's smallest subnormal (2^-133)
    optimized, report = onnx_norm.optimize(model)
    assert [n.op_type for n in optimized.graph.node if n.domain == "onnx_norm"] == ["RMSNorm"], report.near_misses
    verified = onnx_norm.verify(model, optimized, inputs=[{"x": x.astype(np.float32)}], per_node=True)
    (norm,) = verified.norms
    assert norm.numerics is not None
    problems = " | ".join(norm.numerics.problems)
    assert "Cast 'round_sq' (bf16):" in problems and "underflow to 0" in problems, problems
