"""RaiseOpsetPass (`optimize(opset=N)`): the default opset raised with onnx's version converter before the rewrite,
external tensors kept as references to the same files, never lowered, and what the converter cannot do refused
with one clear error. The CLI's `--opset` is tested in tests/cli/test_cli_routes.py."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_norm import model_io
from onnx_norm.rewrite import OpsetError, inspect, opset_pass, optimize
from onnx_norm.rewrite.opset_pass import RaiseOpsetPass

D = 16


def rms_model(opset: int = 17) -> onnx.ModelProto:
    """A decomposed RMSNorm (ReduceMean with its axes as an attribute, which opset 18 turns into an input)."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", D])],
        [
            numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
            numpy_helper.from_array((rng.random(D) + 0.5).astype(np.float32), "w"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)  # onnx 1.23 writes 14


def run(model: onnx.ModelProto | str, x: np.ndarray) -> np.ndarray:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def default_opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def test_raised_to_23_the_rms_norm_becomes_rms_normalization() -> None:
    proto = rms_model(17)
    fused, report = optimize(proto, target="onnx", opset=23)
    assert default_opset(fused) == 23 and default_opset(proto) == 17  # the argument is left alone
    assert [n.op_type for n in fused.graph.node] == ["RMSNormalization"]
    assert report.opset_raised == {"from": 17, "to": 23}
    assert report.to_dict()["opset_raised"] == {"from": 17, "to": 23}
    x = np.random.default_rng(0).standard_normal((3, D)).astype(np.float32)
    np.testing.assert_allclose(run(fused, x), run(proto, x), rtol=1e-5, atol=1e-6)
    # Without the flag nothing changes: the catch the flag is for.
    plain, report = optimize(proto, target="onnx")
    assert report.fused == 0 and report.opset_raised is None and default_opset(plain) == 17


def test_the_model_at_the_opset_already_is_not_converted() -> None:
    proto = rms_model(17)
    same, report = optimize(proto, target="onnx", opset=17)
    assert report.opset_raised is None and default_opset(same) == 17
    assert [n.op_type for n in same.graph.node] == [n.op_type for n in proto.graph.node]


def test_never_lowered_and_the_opset_must_be_one_onnx_knows() -> None:
    with pytest.raises(OpsetError, match="cannot lower the model's default opset 17 to 13"):
        optimize(rms_model(17), target="onnx", opset=13)
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(ValueError, match=f"opset {newest + 1} is not one the installed onnx"):
        optimize(rms_model(17), opset=newest + 1)
    with pytest.raises(ValueError, match="must be an integer"):
        optimize(rms_model(17), opset="23")  # type: ignore[arg-type]


def test_inspect_previews_the_conversion_without_touching_the_model() -> None:
    model = ir.serde.deserialize_model(rms_model(17))
    report = inspect(model, target="onnx", opset=23)
    assert report.opset_raised == {"from": 17, "to": 23} and report.fused == 1 and report.dry_run
    assert model.opset_imports[""] == 17


def test_an_ir_model_is_converted_in_place() -> None:
    model = ir.serde.deserialize_model(rms_model(17))
    out, report = optimize(model, target="onnx", opset=23)
    assert out is model and model.opset_imports[""] == 23 and report.fused == 1
    assert model.ir_version >= onnx.helper.find_min_ir_version_for([helper.make_opsetid("", 23)])


def test_external_data_stays_a_reference_to_the_same_file(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(rms_model(17), path, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    model = model_io.load(path)
    weight = model.graph.initializers["w"].const_value
    assert isinstance(weight, ir.ExternalTensor)
    RaiseOpsetPass(23)(model)
    # The very tensor read from the file (never loaded into the converter's copy), reading from the same folder.
    assert model.graph.initializers["w"].const_value is weight and model.opset_imports[""] == 23
    fused, report = optimize(str(path), target="onnx", opset=23)
    assert report.fused == 1 and isinstance(fused.graph.initializers["w"].const_value, ir.ExternalTensor)
    out = tmp_path / "out" / "m.fused.onnx"
    out.parent.mkdir()
    model_io.save(fused, out, external_data=True)
    assert model_io.data_file(out).is_file()  # the weight read through the reference, written to OUT's data
    x = np.random.default_rng(1).standard_normal((2, D)).astype(np.float32)
    np.testing.assert_allclose(run(str(out), x), run(str(path), x), rtol=1e-5, atol=1e-6)


def test_an_op_without_an_adapter_is_one_clear_error() -> None:
    # ONNX Runtime's LayerNormalization in the ONNX domain below 17: the converter has no adapter from 16.
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"])
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, D]) for name in ("x", "s", "y")]
    graph = helper.make_graph([node], "g", values[:2], values[2:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    with pytest.raises(OpsetError) as raised:
        optimize(model, target="onnx", opset=23)
    message = str(raised.value)
    assert message.startswith("cannot raise the opset from 16 to 23: onnx's version converter: ")
    assert "No Adapter From Version $16 for LayerNormalization" in message and "\n" not in message
    assert "Assertion" not in message and ".h:" not in message


def test_model_local_functions_with_onnx_ops_are_refused() -> None:
    # The converter drops model-local functions: converting would lose the body.
    body = [helper.make_node("Relu", ["a"], ["b"])]
    function = helper.make_function("local", "F", ["a"], ["b"], body, [helper.make_opsetid("", 17)])
    node = helper.make_node("F", ["x"], ["y"], domain="local")
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2]) for name in ("x", "y")]
    graph = helper.make_graph([node], "g", values[:1], values[1:])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[function])
    with pytest.raises(OpsetError, match="model-local function local::F uses ONNX ops"):
        optimize(model, opset=23)


def test_a_model_too_large_for_one_protobuf_is_refused(monkeypatch) -> None:
    # The real limit is 2 GiB; the branch is the same with a smaller one.
    monkeypatch.setattr(opset_pass, "PROTOBUF_LIMIT", D)
    with pytest.raises(OpsetError, match=r"takes the model as one protobuf.*save the model with external data"):
        optimize(rms_model(17), opset=23)
