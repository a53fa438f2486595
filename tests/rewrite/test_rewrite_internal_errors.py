"""An exception inside onnx-norm is a bug, never a near-miss of the model: the rewrite still skips the node (one
bad candidate does not stop the others), but the near-miss carries the exception's type (`NearMissRecord.error`),
`inspect --explain` says it is onnx-norm's own error, the traceback is logged at DEBUG, and these tests fail on any
such near-miss in the fixtures the tests have (the exporter and GroupNorm fixtures under tests/data, examples/;
the zoo's exports in tests/rewrite/test_zoo.py, the fuzzed spellings in tests/rewrite/test_rewrite_fuzz.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from repo_paths import REPO
from rewrite_support import FLOAT, const, fused_ops, make_model, rms_nodes

from onnx_norm.cli import main
from onnx_norm.rewrite import driver, inspect, optimize, session

ROOT = REPO
FIXTURE_FILES = sorted((ROOT / "tests" / "data").rglob("*.onnx")) + sorted((ROOT / "examples").glob("*.onnx"))


def _explain(path: Path, tmp_path: Path, capsys) -> tuple[str, dict]:
    """`onnx-norm inspect --explain MODEL --report r.json`: what it prints and the report it writes."""
    report = tmp_path / "report.json"
    assert main(["inspect", "--explain", str(path), "--report", str(report)]) == 0
    return capsys.readouterr().out, json.loads(report.read_text())


def test_the_fixtures_are_found():
    assert len([p for p in FIXTURE_FILES if "exporters" in p.parts]) >= 60
    assert any("group_norm" in p.parts for p in FIXTURE_FILES) and any("examples" in p.parts for p in FIXTURE_FILES)


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_explain_reports_no_internal_error(path: Path, tmp_path: Path, capsys):
    out, report = _explain(path, tmp_path, capsys)
    errors = [m for m in report["near_misses"] if m["error"]]
    assert errors == [], errors
    assert "not analysed (" not in out and "not applied (" not in out and "proof could not run (" not in out, out


def _non_scalar_constant_factor() -> onnx.ModelProto:
    """`(x * c) * x` with `c` a Constant node holding a vector (Jamba's and RecurrentGemma's recurrences, as
    TorchScript writes them): looking for a row mean under the product, the matcher met a factor that is neither a
    scalar nor computed, whose producer has no inputs; it read that producer's last input (IndexError)."""
    vector = numpy_helper.from_array(np.arange(1, 5, dtype=np.float32))
    nodes = [
        helper.make_node("Constant", [], ["c"], value=vector),
        helper.make_node("Mul", ["x", "c"], ["t"]),
        helper.make_node("Mul", ["t", "x"], ["y"]),
    ]
    return make_model(nodes, [("x", FLOAT, [2, 4])], [("y", FLOAT, [2, 4])])


def test_a_factor_made_by_a_node_without_inputs_is_no_internal_error(tmp_path: Path, capsys):
    model = _non_scalar_constant_factor()
    report = inspect(model)
    assert report.near_misses == [], report.near_misses  # there is no norm here, nor anything like one
    path = tmp_path / "product.onnx"
    onnx.save(model, path)
    out, written = _explain(path, tmp_path, capsys)
    assert written["near_misses"] == [] and "no decomposed norm and no near-miss found" in out, out


def _norm_then_product() -> onnx.ModelProto:
    """An RMSNorm, then the product of the test above on its output: the norm must still fuse."""
    vector = numpy_helper.from_array(np.arange(1, 5, dtype=np.float32))
    nodes = [
        *rms_nodes("x", "n"),
        helper.make_node("Constant", [], ["c"], value=vector),
        helper.make_node("Mul", ["n", "c"], ["t"]),
        helper.make_node("Mul", ["t", "n"], ["y"]),
    ]
    return make_model(nodes, [("x", FLOAT, [2, 4])], [("y", FLOAT, [2, 4])], [const("eps", 1e-6, np.float32)])


def test_a_matcher_exception_is_marked_as_onnx_norms_own(monkeypatch, caplog, tmp_path: Path, capsys):
    """Kept as a near-miss in the product (the other nodes are still matched and fused), but marked, logged with
    its traceback at DEBUG and named in `inspect --explain` as an error of onnx-norm."""
    real = driver.find_norm

    def failing_at_y(anchor, **kwargs):
        if anchor.outputs[0].name == "y":
            raise IndexError("tuple index out of range")
        return real(anchor, **kwargs)

    monkeypatch.setattr(driver, "find_norm", failing_at_y)
    model = _norm_then_product()
    with caplog.at_level(logging.DEBUG, logger="onnx_norm.rewrite.driver"):
        optimized, report = optimize(model)
    assert fused_ops(optimized) == ["RMSNorm"]
    assert [(m.reason, m.error) for m in report.near_misses] == [
        ("not analysed (IndexError: tuple index out of range)", "IndexError")
    ]
    tracebacks = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert tracebacks and tracebacks[0].exc_info[0] is IndexError
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    out, written = _explain(path, tmp_path, capsys)
    assert [m["error"] for m in written["near_misses"]] == ["IndexError"]
    assert "1 of these are errors of onnx-norm itself, not of the model" in " ".join(out.split()), out


def test_a_proof_that_raises_is_marked_as_onnx_norms_own(monkeypatch):
    def broken(candidate):
        raise ZeroDivisionError("evaluator bug")

    monkeypatch.setattr(session, "prove", broken)
    model = make_model(
        rms_nodes("x", "y"), [("x", FLOAT, [2, 4])], [("y", FLOAT, [2, 4])], [const("eps", 1e-6, np.float32)]
    )
    optimized, report = optimize(model)
    assert fused_ops(optimized) == []
    assert [(m.reason, m.error) for m in report.near_misses] == [
        ("proof could not run (ZeroDivisionError: evaluator bug)", "ZeroDivisionError")
    ]


def test_a_near_miss_the_graph_causes_has_no_error():
    """A real near-miss (an epsilon that is not a constant) is the model's, not onnx-norm's."""
    nodes = rms_nodes("x", "y", eps="e")
    model = make_model(nodes, [("x", FLOAT, [2, 4]), ("e", FLOAT, [1])], [("y", FLOAT, [2, 4])])
    report = inspect(model)
    assert report.near_misses and all(m.error == "" for m in report.near_misses), report.near_misses
