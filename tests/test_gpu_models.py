"""The GPU run's whole-model stage without a GPU: `tools/device/run_gpu.sh models` with GPU_DRY=1 runs the same
commands (make_gpu_models.py, onnx-norm optimize / verify / bench, summarize.py) on the CPU provider at tiny sizes,
so that a wrong invocation shows here and not in the GPU session's few minutes."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "device" / "run_gpu.sh"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "device" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


make_gpu_models = _load("make_gpu_models")
summarize = _load("summarize")


@pytest.mark.parametrize("name", sorted(make_gpu_models.MODELS))
def test_models_have_the_norms_they_claim(name: str) -> None:
    """Each generated model checks and has the norm ops its family is made of (the count the stage asserts)."""
    spec = make_gpu_models.Spec(hidden=32, intermediate=64, layers=2, dtype="fp16")
    model = make_gpu_models.build(name, spec)
    ops = [node.op_type for node in model.graph.node]
    expected = make_gpu_models.norm_count(name, spec.layers)
    marker = {"llama": "Sqrt", "bert-decomposed": "Sqrt", "bert-native": "LayerNormalization"}
    assert ops.count(next(v for k, v in marker.items() if name.startswith(k))) == expected
    assert ("Reciprocal" in ops) == (name == "llama-reciprocal")


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_models_stage_dry_run(tmp_path: Path) -> None:
    """The stage end to end on the CPU: every norm found and fused, parity passes, the bench measured two
    sequence lengths, and the summary carries the table."""
    out = tmp_path / "out"
    env = {**os.environ, "GPU_DRY": "1", "PYTHON": sys.executable, "OUT": str(out)}
    result = subprocess.run(
        ["bash", str(SCRIPT), "models"], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    manifest = json.loads((out / "models" / "models.json").read_text())
    assert sorted(manifest) == sorted(make_gpu_models.MODELS)
    for name, spec in manifest.items():
        optimized = json.loads((out / "models" / f"{name}.optimize.json").read_text())
        assert summarize.fused_count(optimized) == spec["norms"], name
        assert json.loads((out / "models" / f"{name}.verify.json").read_text())["passed"], name
        bench = json.loads((out / "models" / f"{name}.bench.json").read_text())
        assert [point["dims"] for point in bench["points"]] == [{"sequence": 8}, {"sequence": 16}], name
    fused = onnx.load(str(ROOT / "build" / "gpu-models" / "llama-div.fused.onnx"))
    assert not any(node.op_type == "Sqrt" for node in fused.graph.node)
    summary = (out / "summary.md").read_text()
    assert "dry run: CPU provider" in summary
    for name in make_gpu_models.MODELS:
        assert summary.count(f"| {name} |") == 2  # one row per sequence length
    assert "onnx-norm bench" in summary  # the commands that made the table
    # A CUDA-graph report beside a model's plain one (the stage writes it on the GPU only; here the plain report
    # stands in for it) adds that model's rows marked "on", the plain ones staying "off".
    graph_report = out / "models" / "llama-reciprocal.bench-graph.json"
    graph_report.write_text((out / "models" / "llama-reciprocal.bench.json").read_text())
    summary = summarize.write_summary(out)
    assert summary is not None
    rows = [line for line in summary.splitlines() if line.startswith("| llama-reciprocal |")]
    assert [row.split(" | ")[5] for row in rows] == ["off", "off", "on", "on"]
