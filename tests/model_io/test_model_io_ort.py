"""What ONNX Runtime loads, onnx-norm loads: nodes out of topological order (ORT sorts them; its own fusion-test
generators append nodes after their consumers), graph outputs and value_info without a type; anything else the
checker refuses is refused only when ORT refuses it too, and the one line says so."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from model_builders import layer_norm_model
from onnx import TensorProto, helper

import onnx_norm
from onnx_norm import model_io
from onnx_norm.cli import main

X = np.random.default_rng(5).standard_normal((2, 5, 16)).astype(np.float32)


def _ort(model: onnx.ModelProto | Path) -> np.ndarray:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, onnx_norm.session_options(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": X})[0]


def _as_ort_test_writes(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` as ORT's fusion-test generators write it: nodes in reverse order, the graph output without a type,
    and a value_info entry that names a value but gives no type."""
    reordered = onnx.ModelProto()
    reordered.CopyFrom(model)
    nodes = list(reordered.graph.node)[::-1]
    del reordered.graph.node[:]
    reordered.graph.node.extend(nodes)
    reordered.graph.output[0].ClearField("type")
    reordered.graph.value_info.append(onnx.ValueInfoProto(name="centred"))
    return reordered


def test_a_model_onnx_runtime_runs_out_of_order_and_untyped_is_fused(tmp_path: Path):
    model = _as_ort_test_writes(layer_norm_model())
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)  # what refused these models before
    expected = _ort(model)  # ... although ONNX Runtime runs them
    before = model.SerializeToString()
    optimized, _ = onnx_norm.optimize(model)
    assert model.SerializeToString() == before  # the ModelProto given is not changed
    assert [n.op_type for n in optimized.graph.node] == ["LayerNorm"]
    np.testing.assert_allclose(_ort(optimized), expected, rtol=1e-5, atol=1e-5)

    onnx.save(model, tmp_path / "ort_style.onnx")
    out = tmp_path / "fused.onnx"
    assert main(["optimize", str(tmp_path / "ort_style.onnx"), "-o", str(out), "--verify"]) == 0
    assert onnx_norm.verify(tmp_path / "ort_style.onnx", out).passed
    onnx.checker.check_model(onnx.load(str(out)))  # what we write is sorted and typed


def test_subgraphs_and_functions_are_sorted_too():
    """An If branch out of order that reads an outer value produced after the If, and a function body out of
    order: every node list is sorted, stably, and an ordered one keeps its order."""
    then_branch = helper.make_graph(
        [helper.make_node("Neg", ["t"], ["u"]), helper.make_node("Relu", ["outer"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("u", TensorProto.FLOAT, [2])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["outer"], ["v"])], "else", [], [helper.make_value_info("v", onnx.TypeProto())]
    )
    function = helper.make_function(
        "local",
        "twice",
        ["a"],
        ["c"],
        [helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Neg", ["a"], ["b"])],
        [helper.make_opsetid("", 17)],
    )
    nodes = [
        helper.make_node("twice", ["y"], ["z"], domain="local"),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Abs", ["x"], ["outer"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("cond", 9, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, functions=[function], opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    )
    loaded = model_io.load(model)
    assert [n.op_type for n in loaded.graph] == ["Abs", "If", "twice"]
    assert [n.op_type for n in loaded.graph.node(1).attributes["then_branch"].value] == ["Relu", "Neg"]
    assert [n.op_type for n in loaded.functions[("local", "twice", "")]] == ["Neg", "Neg"]
    assert model_io.sort_proto(model)
    assert [n.op_type for n in model.graph.node] == ["Abs", "If", "twice"]
    onnx.checker.check_model(model)
    assert not model_io.sort_proto(model)  # sorted already: nothing moves


def test_what_onnx_runtime_refuses_too_is_refused_and_the_line_says_so(tmp_path: Path, capsys):
    cyclic = layer_norm_model()
    cyclic.graph.node[0].input[0] = "y"  # the mean of the output: a cycle, which nothing can sort
    onnx.save(cyclic, tmp_path / "cycle.onnx")
    assert main(["inspect", str(tmp_path / "cycle.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cycle.onnx: not a valid ONNX model" in err and "ONNX Runtime refuses it too" in err
    assert len(err.splitlines()) == 1


def test_what_only_the_checker_refuses_is_loaded(monkeypatch, caplog):
    """A checker stricter than ONNX Runtime (as new checker releases can be) does not refuse a model ORT loads."""

    def stricter(model, *args, **kwargs):
        raise onnx.checker.ValidationError("a rule ONNX Runtime does not have")

    monkeypatch.setattr(onnx.checker, "check_model", stricter)
    with caplog.at_level(logging.WARNING, logger="onnx_norm.model_io"):
        optimized, _ = onnx_norm.optimize(layer_norm_model())
    assert [n.op_type for n in optimized.graph.node] == ["LayerNorm"]
    assert "but ONNX Runtime loads it" in caplog.text


def _ort_optimised_bert(tmp_path: Path) -> Path:
    """A tiny BERT (random weights, static shapes), exported by torch's dynamo exporter and optimised offline by
    ONNX Runtime at its basic level: its norms are already native, and MatMulAddFusion has already run."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    bert = transformers.BertModel(config).eval()
    ids = torch.randint(0, 64, (2, 8))
    torch.onnx.export(bert, (ids,), str(tmp_path / "bert.onnx"), dynamo=True, input_names=["ids"], verbose=False)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(tmp_path / "bert.basic.onnx")
    ort.InferenceSession(str(tmp_path / "bert.onnx"), options, providers=["CPUExecutionProvider"])
    return tmp_path / "bert.basic.onnx"


def test_a_model_onnx_runtime_optimised_still_loads_after_onnx_norm(tmp_path: Path):
    """Nothing to fuse, yet the model is written again: it must keep loading at ORT_ENABLE_ALL (the conftest hook
    checks every saved model that way). Shape inference had moved the large initializers to the end, which made
    ORT's MatMulAddFusion mint an initializer name the model already holds."""
    source = _ort_optimised_bert(tmp_path)
    before = [t.name for t in onnx.load(str(source), load_external_data=False).graph.initializer]
    out = tmp_path / "bert.out.onnx"
    assert main(["optimize", str(source), "-o", str(out), "--take-over-native"]) == 0
    written = onnx.load(str(out), load_external_data=False)
    kept = [t.name for t in written.graph.initializer if t.name in before]
    assert kept == [name for name in before if name in kept]  # the order read is the order written
    options = onnx_norm.session_options()
    ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])  # ORT_ENABLE_ALL by default
