"""fp16 norm repair end to end: an fp16 LLaMA whose RMSNorm statistics run in fp16 (onnx_norm/zoo/fp16.py) gives
zeros in a true-fp16 evaluation at a realistic residual magnitude; `optimize --target onnx --opset 23` replaces
its norms with RMSNormalization computed in float32, which is finite and within fp16's tolerance of the fp32 parent
in the same evaluation, on ONNX Runtime, OpenVINO and onnxruntime-web/node (where installed; skipped saying why).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from openvino_site import openvino_on_path
from repo_paths import REPO

from onnx_norm.zoo.fp16 import main as fp16_main
from onnx_norm.zoo.fp16 import true_fp16

ROOT = REPO
WEB = ROOT / "tools" / "web"
#: fp16's tolerance against the fp32 parent, relative to the output's largest magnitude (about 4.5 here): fp16
#: weights and activations round at 2**-11 relative, through 2 layers.
TOLERANCE = 1e-2


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from onnx_norm import model_io
    from onnx_norm.rewrite import optimize

    folder = tmp_path_factory.mktemp("fp16")
    assert fp16_main([str(folder)]) == 0  # parent.onnx, fp16.onnx, inputs.npz: python -m onnx_norm.zoo.fp16 OUT
    with np.load(folder / "inputs.npz") as data:
        inputs = {name: data[name] for name in data.files}
    optimized, report = optimize(str(folder / "fp16.onnx"), target="onnx", opset=23)
    model_io.save(optimized, folder / "repaired.onnx")
    parent = ort.InferenceSession(str(folder / "parent.onnx")).run(None, inputs)[0]
    return {"folder": folder, "inputs": inputs, "parent": parent, "report": report}


def _close_to_parent(output: np.ndarray, parent: np.ndarray) -> None:
    assert np.isfinite(output).all()
    error = float(np.max(np.abs(output.astype(np.float64) - parent)))
    assert error <= TOLERANCE * float(np.max(np.abs(parent))), error


def test_the_original_overflows_in_fp16_and_the_repair_does_not(models: dict) -> None:
    folder, inputs, parent = models["folder"], models["inputs"], models["parent"]
    ops = [node.op_type for node in onnx.load(folder / "repaired.onnx").graph.node]
    assert ops.count("RMSNormalization") == 5 and "Pow" not in ops and "Sqrt" not in ops
    original = true_fp16(folder / "fp16.onnx", inputs)[0]
    # x**2 overflows, 1/sqrt(inf) is 0: each norm's output is 0 (or NaN), so the model's is, far from the parent.
    assert not np.isfinite(original).all() or not np.any(original)
    assert np.max(np.abs(np.nan_to_num(original) - parent)) > 0.5 * np.max(np.abs(parent))
    _close_to_parent(true_fp16(folder / "repaired.onnx", inputs)[0], parent)


def test_ort_cpu_hides_the_overflow_and_runs_the_repair(models: dict) -> None:
    """ONNX Runtime's CPU provider upcasts the fp16 ops: the original looks fine there, the repair is as close."""
    folder, inputs, parent = models["folder"], models["inputs"], models["parent"]
    _close_to_parent(ort.InferenceSession(str(folder / "fp16.onnx")).run(None, inputs)[0], parent)
    _close_to_parent(ort.InferenceSession(str(folder / "repaired.onnx")).run(None, inputs)[0], parent)


def test_verify_names_the_overflowing_norms_and_counts_the_repair(models: dict) -> None:
    from onnx_norm.cli import main

    folder = models["folder"]
    report = folder / "verify.json"
    args = ["verify", str(folder / "fp16.onnx"), str(folder / "repaired.onnx"), "--per-node", "--report", str(report)]
    assert main(args) == 0
    data = json.loads(report.read_text())
    assert data["status"] == "PASSED"
    # All five, the final one too: its X is the residual Add the rewrite re-created, mapped to the original's Add,
    # and it is judged in fp16 (its fp32 output is the original's fp16 result widened).
    assert data["repaired_overflows"] == 5
    assert data["repaired"] == "repaired 5 norms that overflowed in the original"
    assert all(norm["status"] == "ok" for norm in data["norms"]), data["norms"]
    flagged = [norm for norm in data["norms"] if norm["numerics"] and norm["numerics"]["overflows"]]
    assert len(flagged) == 5 and all(norm["op_type"] == "RMSNormalization" for norm in flagged)
    assert all("Pow" in norm["numerics"]["problems"][0] for norm in flagged)
    assert all(norm["numerics"]["fused_max_error"] < 0.01 for norm in flagged)


def test_openvino_runs_the_repair_close_to_the_parent(models: dict) -> None:
    with openvino_on_path():
        import openvino
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(str(models["folder"] / "repaired.onnx")), "CPU")
    output = compiled.create_infer_request().infer(models["inputs"])
    _close_to_parent(np.asarray(next(iter(output.values()))), models["parent"])


@pytest.mark.parametrize("backend", ["wasm", "node"])
def test_web_runtimes_run_the_repair_close_to_the_parent(models: dict, backend: str, tmp_path: Path) -> None:
    node = shutil.which("node")
    package = {"wasm": "onnxruntime-web", "node": "onnxruntime-node"}[backend]
    if node is None:
        pytest.skip("node is not on PATH")
    if not (WEB / "node_modules" / package / "package.json").is_file():
        pytest.skip(f"{package} is not installed in tools/web (npm ci there installs it)")
    samples = {}
    for name, array in models["inputs"].items():
        (tmp_path / f"{name}.bin").write_bytes(np.ascontiguousarray(array).tobytes())
        samples[name] = {"dtype": str(array.dtype), "shape": list(array.shape), "file": f"{name}.bin"}
    (tmp_path / "inputs.json").write_text(json.dumps({"samples": [samples]}))
    command = [node, str(WEB / "run_model.mjs"), "--backend", backend, "--repeat", "1"]
    command += ["--inputs", str(tmp_path / "inputs.json"), "--out", str(tmp_path / "out")]
    command += [str(models["folder"] / "repaired.onnx")]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    (result,) = json.loads((tmp_path / "out" / "result.json").read_text())["models"]
    (meta,) = result["outputs"][0].values()
    output = np.frombuffer((tmp_path / "out" / meta["file"]).read_bytes(), np.float32).reshape(meta["shape"])
    _close_to_parent(output, models["parent"])


def test_inspect_names_the_norms_that_overflow_at_a_realistic_magnitude(models: dict, capsys) -> None:
    """inspect evaluates each fp16 norm alone, in fp16, on X drawn at --activation-rms (default 1000): all five
    square values past fp16's range there, none at 20; the JSON report has the same; the fp32 parent has no check."""
    from onnx_norm.cli import main

    folder = models["folder"]
    report = folder / "inspect.json"
    assert main(["inspect", str(folder / "fp16.onnx"), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "5 of 5 fp16/bf16 norm(s) overflow in their own type at activation RMS 1000" in out
    check = json.loads(report.read_text())["overflow_check"]
    assert check["activation_rms"] == 1000 and len(check["overflows"]) == 5
    assert all(row["what"].startswith("Pow ") for row in check["overflows"])
    assert main(["inspect", str(folder / "fp16.onnx"), "--activation-rms", "20"]) == 0
    assert "0 of 5 fp16/bf16 norm(s) overflow" in capsys.readouterr().out
    assert main(["inspect", str(folder / "parent.onnx"), "--target", "onnx", "--opset", "23"]) == 0
    assert "overflow in their own type" not in capsys.readouterr().out
    assert main(["inspect", str(folder / "fp16.onnx"), "--activation-rms", "-1"]) == 2
    assert "--activation-rms must be a finite number >= 0, not -1" in capsys.readouterr().err


def test_our_own_ops_repair_all_five(models: dict, tmp_path: Path) -> None:
    """The default target (onnx-norm's RMSNorm/SkipRMSNorm, fp32 accumulation) replaces all five norms, the final
    one with its residual Add: verify counts five repaired."""
    from onnx_norm import model_io
    from onnx_norm.cli import main
    from onnx_norm.rewrite import optimize

    folder = models["folder"]
    optimized, report = optimize(str(folder / "fp16.onnx"))
    assert report.fused == 5
    model_io.save(optimized, tmp_path / "ops.onnx")
    json_report = tmp_path / "verify.json"
    args = ["verify", str(folder / "fp16.onnx"), str(tmp_path / "ops.onnx"), "--per-node", "--report", str(json_report)]
    assert main(args) == 0
    assert json.loads(json_report.read_text())["repaired_overflows"] == 5
