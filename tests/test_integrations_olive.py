"""Olive: a one-pass workflow (`OnnxNormFusion`, added through a package config as Olive documents) on a bundled
tiny LLaMA; the output is fused, and Olive's own evaluation ran it on our kernels (ORT's profile names them)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from onnx_norm.library import library_available

pytest.importorskip(
    "olive", reason="olive-ai is not installed (optional: pip install -c constraints olive-ai requests; see docs)"
)
pytestmark = pytest.mark.skipif(not library_available(), reason="the onnx-norm custom-op library is not built")

MODEL = Path(__file__).resolve().parent.parent / "examples" / "llama-rmsnorm-dynamo-fp32.onnx"


def _workflow(tmp_path: Path, **pass_options) -> dict:
    dummy = {"input_shapes": [[1, 8], [1, 8]], "input_names": ["input_ids", "attention_mask"]}
    dummy |= {"input_types": ["int64", "int64"], "max_samples": 2}
    # percent-min-improvement 1: any goal; Olive wants one per sub-metric.
    latency = {"name": "avg", "priority": 1, "goal": {"type": "percent-min-improvement", "value": 1}}
    return {
        # Profiling on: the profile of each evaluation session names the kernels that ran.
        "input_model": {
            "type": "ONNXModel",
            "model_path": str(MODEL),
            "inference_settings": {"session_options": {"enable_profiling": True}},
        },
        "systems": {
            "local": {
                "type": "LocalSystem",
                "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}],
            }
        },
        "data_configs": [{"name": "dummy", "type": "DummyDataContainer", "load_dataset_config": dummy}],
        # olive-ai 0.13 fails on an evaluator without a type (None reaches an enum); OnnxEvaluator is the default.
        "evaluators": {
            "latency": {
                "type": "OnnxEvaluator",
                "metrics": [{"name": "latency", "type": "latency", "sub_types": [latency], "data_config": "dummy"}],
            }
        },
        "passes": {"fuse": {"type": "OnnxNormFusion", **pass_options}},
        "evaluator": "latency",
        "host": "local",
        "target": "local",
        "output_dir": str(tmp_path / "out"),
        "cache_dir": str(tmp_path / "cache"),
    }


def _norm_ops(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        if node.domain == "onnx_norm" or "LayerNormalization" in node.op_type:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def test_one_pass_workflow_fuses_and_olive_evaluates_on_our_kernels(tmp_path: Path, monkeypatch) -> None:
    from olive.workflows import run

    from onnx_norm.integrations import olive as integration

    monkeypatch.setenv("OLIVE_DISABLE_TELEMETRY", "1")
    monkeypatch.chdir(tmp_path)  # ORT writes the profiles into the working directory
    package_config = tmp_path / "olive_package_config.json"
    assert integration.main([str(package_config)]) == 0
    output = run(_workflow(tmp_path, verify=True), package_config=str(package_config))

    best = output.get_best_candidate()
    assert best is not None and best.metrics_value["latency-avg"]["value"] > 0
    assert json.loads((tmp_path / "out" / "model_config.json").read_text())["type"] == integration.MODEL_TYPE.lower()
    assert _norm_ops(Path(best.model_path)) == {"RMSNorm": 1, "SkipRMSNorm": 4}
    profiles = sorted(tmp_path.glob("onnxruntime_profile_*.json"))
    ours = [p for p in profiles if '"op_name" : "SkipRMSNorm"' in p.read_text()]
    # Olive evaluated the input model (our ops absent) and the output (our kernels, as the library is registered;
    # without it ORT would inline the model-local functions and the profile would name standard ops only).
    assert len(profiles) == 2 and len(ours) == 1


def test_pass_options_reach_the_rewrite(tmp_path: Path, monkeypatch) -> None:
    from olive.workflows import run

    from onnx_norm.integrations import olive as integration

    monkeypatch.setenv("OLIVE_DISABLE_TELEMETRY", "1")
    monkeypatch.chdir(tmp_path)
    workflow = _workflow(tmp_path, target="ort", disable=["skip_rms_norm"])
    output = run(workflow, package_config=integration.package_config())
    # ORT's own ops, and with the Skip rule disabled, the residual Adds stay.
    assert _norm_ops(Path(output.get_best_candidate().model_path)) == {"SimplifiedLayerNormalization": 5}
