"""Segmented verification (onnx_norm/parity/segments.py, segmented.py): the models cut at the same values and run one
segment at a time give the verdict and the differences the whole models give; a model that differs fails alike and
the report names the first segment where the two part; bad settings are one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import cli
from onnx import TensorProto, helper, numpy_helper
from repo_paths import EXAMPLES

import onnx_norm
from onnx_norm import parity
from onnx_norm.parity import segments

HIDDEN = 32


def _layers(count: int = 4) -> onnx.ModelProto:
    """`count` layers of x + MatMul(x, W) then a decomposed LayerNorm, each layer's MatMul also a graph output (a
    side output made mid-chain, as a KV cache is)."""
    rng = np.random.default_rng(0)
    nodes, inits, outputs = [], [], []
    x = "x"
    for i in range(count):
        p = f"l{i}_"
        inits += [
            numpy_helper.from_array((rng.standard_normal((HIDDEN, HIDDEN)) / 6).astype(np.float32), p + "w"),
            numpy_helper.from_array((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), p + "g"),
        ]
        nodes += [
            helper.make_node("MatMul", [x, p + "w"], [p + "side"]),
            helper.make_node("Add", [x, p + "side"], [p + "res"]),
            helper.make_node("ReduceMean", [p + "res"], [p + "mean"], axes=[-1]),
            helper.make_node("Sub", [p + "res", p + "mean"], [p + "d"]),
            helper.make_node("Mul", [p + "d", p + "d"], [p + "sq"]),
            helper.make_node("ReduceMean", [p + "sq"], [p + "var"], axes=[-1]),
            helper.make_node("Add", [p + "var", "eps"], [p + "ve"]),
            helper.make_node("Sqrt", [p + "ve"], [p + "std"]),
            helper.make_node("Div", [p + "d", p + "std"], [p + "n"]),
            helper.make_node("Mul", [p + "n", p + "g"], [p + "y"]),
        ]
        outputs.append(helper.make_tensor_value_info(p + "side", TensorProto.FLOAT, None))
        x = p + "y"
    inits.append(numpy_helper.from_array(np.array(1e-5, np.float32), "eps"))
    outputs.insert(0, helper.make_tensor_value_info(x, TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        outputs,
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _same(whole: parity.ParityReport, cut: parity.ParityReport) -> None:
    """Same verdict and row; the same differences within rounding: a few ulps of the output's type at its error's
    size (ONNX Runtime fuses across a cut in the whole model only, and rounds there in another order)."""
    assert cut.passed == whole.passed
    for a, b in zip(whole.outputs, cut.outputs, strict=True):
        assert a.name == b.name and a.row == b.row
        rounding = 4 * float(np.spacing(np.asarray(max(a.metrics.max_abs, 1.0), a.dtype)))
        assert b.metrics.max_abs == pytest.approx(a.metrics.max_abs, abs=rounding)
        if a.golden is not None:
            assert b.golden.optimized_max_abs == pytest.approx(a.golden.optimized_max_abs, abs=rounding)


@pytest.mark.parametrize("count", [2, 3, 4])
def test_segments_give_what_the_whole_models_give(count: int):
    model = _layers()
    optimized, _ = onnx_norm.optimize(model)
    whole = parity.verify(model, optimized, segments="off")
    cut = parity.verify(model, optimized, segments=count)
    assert whole.form == "whole model" and cut.form.startswith(f"{count} segments")
    assert cut.first_parting_segment is None and len(cut.cuts) == count - 1
    _same(whole, cut)


def test_the_plan_cuts_at_the_residual_stream_and_makes_side_outputs_in_their_layer():
    model = _layers()
    optimized, _ = onnx_norm.optimize(model)
    plan = segments.plan(model, optimized, 4)
    assert all(len(cut) == 1 for cut in plan.cuts)  # one value crosses between layers
    made = [[o for o in segment.outputs if o.endswith("side")] for segment in plan.original]
    assert made == [["l0_side"], ["l1_side"], ["l2_side"], ["l3_side"]]
    assert [s.outputs for s in plan.optimized] == [s.outputs for s in plan.original]


@pytest.mark.parametrize(
    "example", ["llama-rmsnorm-fp32.onnx", "llama-rmsnorm-fp16.onnx", "bert-layernorm-opset13.onnx"]
)
def test_the_bundled_examples_verify_alike_whole_and_in_segments(example: str, tmp_path: Path):
    optimized = tmp_path / "opt.onnx"
    onnx_norm.save(onnx_norm.optimize(str(EXAMPLES / example))[0], optimized)
    whole = parity.verify(EXAMPLES / example, optimized, segments="off", shapes={"sequence": 16})
    cut = parity.verify(EXAMPLES / example, optimized, segments=2, shapes={"sequence": 16})
    _same(whole, cut)


def test_a_model_that_differs_fails_alike_and_the_report_names_where_they_part(tmp_path: Path):
    model = _layers()
    optimized, _ = onnx_norm.optimize(model)
    fused = [node for node in optimized.graph.node if node.domain == "onnx_norm"]
    for attr in fused[2].attribute:  # the third layer's norm
        if attr.name == "epsilon":
            attr.f = 0.5
    files = {"orig": tmp_path / "m.onnx", "opt": tmp_path / "m.opt.onnx", "report": tmp_path / "r.json"}
    onnx.save(model, files["orig"])
    onnx.save(optimized, files["opt"])
    run = cli("verify", files["orig"], files["opt"], "--segments", "4", "--report", files["report"])
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the models part after segment 3" in " ".join(run.stdout.split())
    report = json.loads(files["report"].read_text())
    assert report["first_parting_segment"] == 3 and report["form"].startswith("4 segments")
    assert cli("verify", files["orig"], files["opt"], "--segments", "off").returncode == 1


@pytest.mark.parametrize(("value", "message"), [("abc", "expected auto, off or a number"), ("40", "--segments 40")])
def test_bad_segment_settings_are_one_line_exit_2(value: str, message: str, tmp_path: Path):
    original = tmp_path / "m.onnx"
    onnx.save(_layers(2), original)
    run = cli("verify", original, original, "--segments", value)
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in run.stderr


def test_auto_runs_the_whole_model_when_it_fits():
    model = _layers(2)
    report = parity.verify(model, onnx_norm.optimize(model)[0])
    assert report.form == "whole model" and report.cuts == []
