"""optimize()/inspect(), the rule set and pass for pipelines, model loading/saving, and the CLI subcommands."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper
from rewrite_support import FLOAT, const, fused_ops, make_model, run

from onnx_norm import model_io
from onnx_norm.cli import main
from onnx_norm.rewrite import FuseNormsPass, inspect, optimize

D = 16
W = (np.random.default_rng(5).random(D) + 0.5).astype(np.float32)


def rms_model(hidden: int = D, weight=None) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], name="mean_square"),
        helper.make_node("Add", ["ms", "eps"], ["ve"], name="add_eps"),
        helper.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
        helper.make_node("Div", ["x", "s"], ["n"], name="div"),
        helper.make_node("Mul", ["n", "w"], ["y"], name="scale"),
    ]
    w = W if weight is None else weight
    return make_model(
        nodes,
        [("x", FLOAT, ["b", hidden])],
        [("y", FLOAT, ["b", hidden])],
        [const("eps", 1e-6, np.float32), const("w", w)],
    )


def feeds(hidden: int = D):
    return {"x": np.random.default_rng(0).standard_normal((3, hidden)).astype(np.float32)}


def test_optimize_returns_the_kind_it_was_given(tmp_path):
    proto = rms_model()
    original = proto.SerializeToString()
    out_proto, report = optimize(proto)
    assert isinstance(out_proto, onnx.ModelProto) and fused_ops(out_proto) == ["RMSNorm"]
    assert proto.SerializeToString() == original  # the argument is left alone
    assert report.rule_counts == {"rms_norm": 1}
    assert report.ops_before["ReduceMean"] == 1 and report.ops_after.get("ReduceMean", 0) == 0
    assert report.ops_after["onnx_norm::RMSNorm"] == 1

    model = ir.serde.deserialize_model(rms_model())
    out_ir, _ = optimize(model)
    assert out_ir is model and any(n.op_type == "RMSNorm" for n in model.graph)

    path = tmp_path / "m.onnx"
    onnx.save(rms_model(), path)
    out_path_model, _ = optimize(str(path))
    assert isinstance(out_path_model, ir.Model)


def test_fused_node_is_tagged_with_its_rule():
    optimized, _ = optimize(rms_model())
    node = next(n for n in optimized.graph.node if n.op_type == "RMSNorm")
    tags = {p.key: p.value for p in node.metadata_props}
    assert "rms_norm" in tags.values()


def test_report_to_dict_is_json():
    _, report = optimize(rms_model())
    data = json.loads(json.dumps(report.to_dict()))
    assert data["fused"] == 1
    norm = data["norms"][0]
    assert norm["replaced_nodes"] and norm["kind"] == "rms" and norm["epsilon"] == pytest.approx(1e-6)


def test_inspect_is_a_dry_run():
    model = ir.serde.deserialize_model(rms_model())
    before = len(model.graph)
    report = inspect(model)
    assert report.dry_run and report.fused == 1 and len(model.graph) == before


def test_inspect_explain_is_deprecated():
    """The near-misses are always in the report; the keyword says so instead of being silently dropped."""
    with pytest.warns(DeprecationWarning, match="explain"):
        report = inspect(rms_model(), explain=True)
    assert report.dry_run and report.fused == 1


def test_disable_a_rule_and_unknown_rule():
    optimized, report = optimize(rms_model(), disable=["rms_norm"])
    assert fused_ops(optimized) == [] and report.fused == 0
    with pytest.raises(ValueError, match="unknown rule"):
        optimize(rms_model(), disable=["no_such_rule"])


def test_the_pass_for_pipelines():
    model = ir.serde.deserialize_model(rms_model())
    fuse = FuseNormsPass()
    result = fuse(model)
    assert result.modified and result.model is model
    assert [n.op_type for n in model.graph if n.domain == "onnx_norm"] == ["RMSNorm"]
    assert fuse.report.fused == 1 and fuse.report.rule_counts == {"rms_norm": 1}


def test_verify_rewrites_off_still_fuses():
    optimized, _ = optimize(rms_model(), verify_rewrites=False)
    assert fused_ops(optimized) == ["RMSNorm"]


def test_save_with_external_data_and_relative_paths(tmp_path, monkeypatch):
    monkeypatch.setattr(model_io, "EXTERNAL_DATA_THRESHOLD", 16)
    hidden = 256  # tensors above onnx-ir's 256-byte threshold go to the data file
    weight = np.random.default_rng(6).random(hidden).astype(np.float32) + 0.5
    original = rms_model(hidden, weight)
    model, _ = optimize(original)
    out = tmp_path / "out.onnx"
    model_io.save(ir.serde.deserialize_model(model), out)
    assert (tmp_path / "out.onnx.data").exists()
    proto = onnx.load(out, load_external_data=False)
    locations = [e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"]
    assert locations and all(loc == "out.onnx.data" for loc in locations)
    loaded = onnx.load(out)
    expected = run(original, feeds(hidden))[0]
    np.testing.assert_allclose(run(loaded, feeds(hidden))[0], expected, rtol=1e-5, atol=1e-5)
    # An input with external data gives an output with external data, even over itself with --force.
    assert main(["optimize", str(out), "-o", str(out), "--force"]) == 0
    assert (tmp_path / "out.onnx.data").exists()
    np.testing.assert_allclose(run(onnx.load(out), feeds(hidden))[0], expected, rtol=1e-5, atol=1e-5)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_broken_inputs_give_clear_errors(tmp_path):
    with pytest.raises(model_io.ModelLoadError, match="no such file"):
        model_io.load(tmp_path / "missing.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00not a model\xff" * 10)
    with pytest.raises(model_io.ModelLoadError, match=r"garbage\.onnx"):
        model_io.load(garbage)
    with pytest.raises(model_io.ModelLoadError, match="directory"):
        model_io.load(tmp_path)
    with pytest.raises(TypeError):
        model_io.load(42)  # type: ignore[arg-type]


def test_cli_optimize_and_inspect(tmp_path, capsys):
    source = tmp_path / "in.onnx"
    onnx.save(rms_model(), source)
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    assert main(["inspect", str(source), "--explain"]) == 0
    assert "rms_norm" in capsys.readouterr().out
    assert main(["optimize", str(source), "-o", str(out), "--report", str(report)]) == 0
    assert fused_ops(onnx.load(out)) == ["RMSNorm"]
    assert json.loads(report.read_text())["rule_counts"] == {"rms_norm": 1}
    # Never over the input unless forced; bad input is exit 2 with a one-line message.
    assert main(["optimize", str(source), "-o", str(source)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["optimize", str(tmp_path / "nope.onnx"), "-o", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["optimize", str(source), "-o", str(tmp_path / "no_dir" / "x.onnx")]) == 2


def test_take_over_native_layer_normalization():
    nodes = [helper.make_node("LayerNormalization", ["x", "w", "b"], ["y"], axis=-1, epsilon=1e-5)]
    model = make_model(
        nodes, [("x", FLOAT, ["b", D])], [("y", FLOAT, ["b", D])], [const("w", W), const("b", W - 1)], opset=17
    )
    optimized, report = optimize(model, take_over_native=True)
    assert fused_ops(optimized) == ["LayerNorm"] and report.native_taken_over
    np.testing.assert_allclose(run(optimized, feeds())[0], run(model, feeds())[0], rtol=1e-5, atol=1e-5)
    untouched, _ = optimize(model)
    assert fused_ops(untouched) == []


def test_optimizing_twice_changes_nothing_more():
    once, _ = optimize(rms_model())
    twice, report = optimize(once)
    onnx.checker.check_model(twice)
    assert report.fused == 0 and fused_ops(twice) == ["RMSNorm"]
    np.testing.assert_array_equal(run(twice, feeds())[0], run(once, feeds())[0])
