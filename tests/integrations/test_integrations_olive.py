"""Olive: a one-pass workflow (`OnnxNormFusion`, added through a package config as Olive documents) on a bundled
tiny LLaMA; the output is fused, and Olive's own evaluation ran it on our kernels (ORT's profile names them)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from repo_paths import EXAMPLES

from onnx_norm.library import library_available

pytest.importorskip(
    "olive", reason="olive-ai is not installed (optional: pip install -c constraints olive-ai requests; see docs)"
)
pytestmark = pytest.mark.skipif(not library_available(), reason="the onnx-norm custom-op library is not built")

MODEL = EXAMPLES / "llama-rmsnorm-dynamo-fp32.onnx"


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


def _model_file(path: Path) -> Path:
    """The .onnx file of an Olive model path: the file, or the one file in its folder (a model with external data)."""
    return path if path.is_file() else next(path.glob("*.onnx"))


def _norm_ops(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        if node.domain == "onnx_norm" or "LayerNormalization" in node.op_type:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _olive_command() -> list[str]:
    """`olive` as a user types it: the console script beside this Python, or `python -m olive` (Olive's own
    fallback) where the environment has no script."""
    script = Path(sys.executable).with_name("olive")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "olive"]


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OLIVE_DISABLE_TELEMETRY": "1"}
    done = subprocess.run(command, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def package_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documented command, as a user types it (once: it imports Olive, ~10 s)."""
    cwd = tmp_path_factory.mktemp("olive-package-config")
    done = _run([sys.executable, "-m", "onnx_norm.integrations.olive", "olive_package_config.json"], cwd)
    assert "olive run --config" in done.stdout
    return cwd / "olive_package_config.json"


def test_package_config_command_names_an_importable_pass(package_config: Path) -> None:
    path = package_config
    module_path = json.loads(path.read_text())["passes"]["OnnxNormFusion"]["module_path"]
    module, _, name = module_path.rpartition(".")
    assert getattr(importlib.import_module(module), name).__name__ == "OnnxNormFusion"


def test_package_config_help_prints_usage_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command's `main` in this process (the fixture above runs the command as a user types it; another
    process would import Olive again, ~7 CPU-s)."""
    from onnx_norm.integrations import olive as olive_integration

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        olive_integration.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m onnx_norm.integrations.olive") and "PACKAGE_CONFIG.json" in out
    assert list(tmp_path.iterdir()) == []


def _runs_with_our_library(path: Path) -> None:
    import numpy as np
    import onnxruntime as ort

    from onnx_norm.library import session_options

    session = ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
    ids = np.ones((1, 8), dtype=np.int64)
    (logits, *_) = session.run(None, {"input_ids": ids, "attention_mask": ids})
    assert np.isfinite(logits).all()


def test_documented_olive_run_fuses_and_olive_evaluates_on_our_kernels(tmp_path: Path, package_config: Path) -> None:
    # Profiling on: the profile of each evaluation session names the kernels that ran (into the working directory).
    (tmp_path / "workflow.json").write_text(json.dumps(_workflow(tmp_path, verify=True)))
    _run([*_olive_command(), "run", "--config", "workflow.json", "--package-config", str(package_config)], tmp_path)

    config = json.loads((tmp_path / "out" / "model_config.json").read_text())
    assert config["type"] == "onnxnormmodel"
    best = Path(config["config"]["model_path"])
    assert _norm_ops(best) == {"RMSNorm": 1, "SkipRMSNorm": 4}
    _runs_with_our_library(best)
    profiles = sorted(tmp_path.glob("onnxruntime_profile_*.json"))
    ours = [p for p in profiles if '"op_name" : "SkipRMSNorm"' in p.read_text()]
    # Olive evaluated the input model (our ops absent) and the output (our kernels, as the library is registered;
    # without it ORT would inline the model-local functions and the profile would name standard ops only).
    assert len(profiles) == 2 and len(ours) == 1


def test_documented_olive_run_on_an_export_with_external_data(tmp_path: Path, package_config: Path) -> None:
    """Every dynamo export has external data: the output must not reference the input's data file."""
    source = tmp_path / "export"
    source.mkdir()
    onnx.save(onnx.load(str(MODEL)), str(source / "model.onnx"), save_as_external_data=True, size_threshold=0)
    workflow = {
        "input_model": {"type": "ONNXModel", "model_path": "export/model.onnx"},
        "passes": {"fuse": {"type": "OnnxNormFusion"}},
        "output_dir": "out",
        "cache_dir": "cache",
    }
    (tmp_path / "workflow.json").write_text(json.dumps(workflow))
    _run([*_olive_command(), "run", "--config", "workflow.json", "--package-config", str(package_config)], tmp_path)

    shutil.rmtree(source)  # nothing of the input may be needed any more
    output = _model_file(Path(json.loads((tmp_path / "out" / "model_config.json").read_text())["config"]["model_path"]))
    assert _norm_ops(output) == {"RMSNorm": 1, "SkipRMSNorm": 4}  # onnx.load reads its external data too
    assert (output.parent / f"{output.name}.data").is_file()  # external data in, external data out
    _runs_with_our_library(output)


def test_pass_options_reach_the_rewrite(tmp_path: Path, monkeypatch) -> None:
    from olive.workflows import run

    from onnx_norm.integrations import olive as integration

    monkeypatch.setenv("OLIVE_DISABLE_TELEMETRY", "1")
    monkeypatch.chdir(tmp_path)
    workflow = _workflow(tmp_path, target="ort", disable=["skip_rms_norm"])
    output = run(workflow, package_config=integration.package_config())
    # ORT's own ops, and with the Skip rule disabled, the residual Adds stay.
    assert _norm_ops(Path(output.get_best_candidate().model_path)) == {"SimplifiedLayerNormalization": 5}


# Olive with the pass on each (model, output folder) pair in turn, in one process: after each run, its output model
# and the process's peak RSS so far (ru_maxrss, KiB on Linux).
_OLIVE_RUNS = """
import os, resource, sys
os.environ["OLIVE_DISABLE_TELEMETRY"] = "1"
from olive.workflows import run
from onnx_norm.integrations import olive as integration
for model, out in zip(sys.argv[1::2], sys.argv[2::2]):
    workflow = {
        "input_model": {"type": "ONNXModel", "model_path": model},
        "passes": {"fuse": {"type": "OnnxNormFusion"}},
        "output_dir": out,
        "cache_dir": out + "_cache",
    }
    output = run(workflow, package_config=integration.package_config())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("model:", output.get_best_candidate().model_path, "peak:", peak, flush=True)
"""


def test_the_pass_streams_the_weights_of_a_model_with_external_data(tmp_path: Path) -> None:
    """The pass loads the input memory-mapped and writes the output a tensor at a time: Olive with the pass on a
    0.5 GiB model peaks within 1 W of the same run on a tiny model. Reading the weights into memory and serialising
    them, as the pass did, took 4 W more (2.40 GiB against 0.39 GiB, measured); now 0 to 0.4 W more, the rest of
    the bound is room for the page cache's noise on a shared machine. A 0.5 GiB model and not one past 2 GiB: the
    GenAI route's test runs the same load and save past 2 GiB, and an Olive run of that size would add ~40 s. With
    the pass's `verify` on, the parity gate's own budget applies (1.5 W, tested through `optimize --verify`).

    Both runs in one process, the tiny one first (one import of Olive, ~8 CPU-s, instead of two): the tiny run's
    peak is that of a process of its own, and the big run's peak can only be the same or higher for what the tiny
    run left behind, so the bound is no looser than with a process per run."""
    from memory_tools import memory_check

    layers, sizes, pairs = {"tiny": 2, "big": 8}, {}, []
    for name, hidden in (("tiny", 64), ("big", 4096)):
        path = tmp_path / name / "m.onnx"
        args = {"shape": "blocks", "layers": layers[name], "hidden": hidden, "intermediate": 128, "dtype": "float32"}
        sizes[name] = memory_check.build(path, argparse.Namespace(**args, layout="onnx", data_dir=None))
        pairs += [str(path), str(tmp_path / f"{name}_out")]
    code, _, peak, output = memory_check.measure([sys.executable, "-c", _OLIVE_RUNS, *pairs])
    assert code == 0, output[-3000:]
    runs = [line.removeprefix("model: ").rpartition(" peak: ") for line in output.splitlines()]
    runs = [(Path(written), int(peak_so_far)) for written, found, peak_so_far in runs if found]
    assert len(runs) == 2, output[-3000:]
    for name, (written_path, _) in zip(layers, runs, strict=True):
        written = _model_file(written_path)
        fused = onnx.load(str(written), load_external_data=False).graph.node
        assert sum(node.domain == "onnx_norm" for node in fused) == layers[name]
        assert (written.parent / f"{written.name}.data").is_file()  # external data in, external data out
    # The tiny run's peak as the process read it then; the big run's, the whole process's (its exit included).
    peaks = [runs[0][1], peak]
    assert runs[0][1] <= runs[1][1] <= peak
    assert peaks[1] - peaks[0] <= sizes["big"], f"{peaks[1] / 2**30:.2f} GiB against {peaks[0] / 2**30:.2f} GiB"
    for folder in ("big", "big_out"):  # 0.5 GiB each: not left to pytest's kept temporary folders
        shutil.rmtree(tmp_path / folder)
