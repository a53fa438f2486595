"""tools/runtime_check.py: the `--target onnx` output on the runtimes where onnx-norm's library cannot be loaded.

Run as a user types it: OpenVINO (from build/openvino-site, where tools/setup.sh installs it), onnxruntime-web's
wasm backend and onnxruntime-node (tools/web/run_model.mjs; the packages from tools/web/package-lock.json, installed
here with `npm ci` when npm can reach its registry), ONNX Runtime's Python CPU provider without the library. Each
test that needs a runtime skips, saying why, where it is missing. Models: built here (a decomposed RMSNorm then a
decomposed LayerNorm at opset 18, where LayerNormalization-17 fuses as exported and RMSNormalization-23 only after
the tool's opset upgrade), a committed diffusers ResNet block (GroupNorm), and a bundled fp16 LLaMA (int64 inputs,
float16 outputs through the binary exchange with Node).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from filelock import FileLock
from onnx import TensorProto, helper, numpy_helper, version_converter
from openvino_site import openvino_on_path
from repo_paths import REPO

import onnx_norm

ROOT = REPO
TOOL = ROOT / "tools" / "runtime_check.py"
WEB = ROOT / "tools" / "web"
WEB_PACKAGES = ("onnxruntime-web", "onnxruntime-node")
RESNET = ROOT / "tests" / "data" / "group_norm" / "diffusers-resnet-block-2d-torchscript.onnx"
LLAMA_FP16 = ROOT / "examples" / "llama-rmsnorm-fp16.onnx"
HIDDEN = 16
QUICK = ("--no-suite", "--repeat", "2", "--warmup", "0", "--samples", "1")


def norms_model(opset: int = 18) -> onnx.ModelProto:
    """x -> RMSNorm -> LayerNorm, both decomposed as torch's TorchScript exporter writes them, hidden 16."""
    rng = np.random.default_rng(0)

    def const(name: str, value: Any, dtype: Any = np.float32) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, dtype), name)

    def mean(source: str, out: str) -> onnx.NodeProto:  # axes is an input from opset 18
        return helper.make_node("ReduceMean", [source, "axes"], [out], name=out)

    nodes = [
        helper.make_node("Pow", ["x", "two"], ["x_sq"], name="rms_pow"),
        mean("x_sq", "rms_mean"),
        helper.make_node("Add", ["rms_mean", "eps"], ["rms_eps"], name="rms_add"),
        helper.make_node("Sqrt", ["rms_eps"], ["rms_sqrt"], name="rms_sqrt"),
        helper.make_node("Div", ["one", "rms_sqrt"], ["rms_inv"], name="rms_inv"),
        helper.make_node("Mul", ["x", "rms_inv"], ["rms_normed"], name="rms_normed"),
        helper.make_node("Mul", ["rms_weight", "rms_normed"], ["h"], name="rms_scale"),
        mean("h", "ln_mean"),
        helper.make_node("Sub", ["h", "ln_mean"], ["centred"], name="ln_sub"),
        helper.make_node("Pow", ["centred", "two"], ["centred_sq"], name="ln_pow"),
        mean("centred_sq", "ln_var"),
        helper.make_node("Add", ["ln_var", "eps"], ["ln_eps"], name="ln_add"),
        helper.make_node("Sqrt", ["ln_eps"], ["ln_std"], name="ln_sqrt"),
        helper.make_node("Div", ["centred", "ln_std"], ["ln_normed"], name="ln_div"),
        helper.make_node("Mul", ["ln_normed", "ln_weight"], ["ln_scaled"], name="ln_scale"),
        helper.make_node("Add", ["ln_scaled", "ln_bias"], ["y"], name="ln_shift"),
    ]
    weights = [
        const("axes", [-1], np.int64),
        const("two", 2.0),
        const("one", 1.0),
        const("eps", 1e-5),
        const("rms_weight", 1 + 0.1 * rng.standard_normal(HIDDEN)),
        const("ln_weight", 1 + 0.1 * rng.standard_normal(HIDDEN)),
        const("ln_bias", 0.1 * rng.standard_normal(HIDDEN)),
    ]
    graph = helper.make_graph(
        nodes,
        "norms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _tool(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(TOOL), *map(str, args)]
    environment = {**os.environ, **(env or {})}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False, env=environment)


def _rows(report: Path) -> list[dict[str, Any]]:
    return json.loads(report.read_text())["rows"]


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "norms.onnx"
    onnx.save(norms_model(), path)
    return path


# ----------------------------------------------------------------------------------------------------------------
# Every runtime's availability is checked before any model is made; a bad model or flag is one line.


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.onnx"], "missing.onnx"),
        (["zoo:no-such-model:dynamo"], "no-such-model"),
        (["zoo:llama"], "zoo:NAME:EXPORTER"),
        (["{model}", "--report", "no-such-folder/r.json"], "does not exist"),
        (["{model}", "{model}", "--optimized", "{model}"], "--optimized needs exactly one model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(model_path: Path, args: list[str], message: str) -> None:
    done = _tool("--ort", "--no-suite", *(arg.format(model=model_path) for arg in args))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_file_that_is_not_onnx_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    done = _tool("--ort", "--no-suite", bad)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "bad.onnx" in done.stderr


def test_a_missing_runtime_is_said_before_any_work(model_path: Path, tmp_path: Path) -> None:
    done = _tool("--wasm", "--no-suite", model_path, env={"PATH": str(tmp_path)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == "runtime_check: node is not on PATH (Node 20 or newer runs tools/web/run_model.mjs)"
    if importlib.util.find_spec("openvino") is None:  # installed into the venv, it cannot be hidden
        done = _tool("--openvino", "--no-suite", model_path, env={"ONNX_NORM_OPENVINO_SITE": str(tmp_path)})
        assert done.returncode == 2, done.stdout + done.stderr
        assert "openvino is not installed" in done.stderr and len(done.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------------------------------------------
# ONNX Runtime without the library: always there, so the parity check itself is tested here


def test_ort_runs_both_variants_and_the_upgrade_fuses_the_rms_norm(model_path: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = _tool("--ort", *QUICK, model_path, "--keep", tmp_path, "--report", report)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["variant"]: row for row in _rows(report)}
    assert set(rows) == {"as exported (opset 18)", "opset 18->23"}
    exported, upgraded = rows["as exported (opset 18)"], rows["opset 18->23"]
    assert exported["fused"] == 1 and exported["ops"] == {"LayerNormalization": 1}
    assert "RMSNormalization needs default opset >= 23" in exported["left"]
    assert upgraded["fused"] == 2 and upgraded["ops"] == {"LayerNormalization": 1, "RMSNormalization": 1}
    assert all(row["passed"] and row["vs_original_here"]["passed"] for row in rows.values())
    assert len(upgraded["optimized_run"]["times_ms"]) == 2 and upgraded["speedup"]["median"] > 0


def test_the_ort_target_needs_no_opset_upgrade(model_path: Path, tmp_path: Path) -> None:
    """ONNX Runtime's SimplifiedLayerNormalization takes the RMSNorm at the model's own opset 18."""
    report = tmp_path / "report.json"
    done = _tool("--ort", *QUICK, "--target", "ort", "--upgrade-opset", "0", model_path, "--report", report)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = _rows(report)
    assert json.loads(report.read_text())["target"] == "ort"
    assert row["variant"] == "as exported (opset 18)" and row["fused"] == 2 and row["passed"]
    assert row["ops"] == {"LayerNormalization": 1, "SimplifiedLayerNormalization": 1}


def test_a_wrong_optimized_model_fails_parity(model_path: Path, tmp_path: Path) -> None:
    """The optimized model's LayerNormalization with epsilon 0.5 instead of 1e-5: the check fails, exit 1."""
    upgraded = version_converter.convert_version(norms_model(), 23)
    optimized, _ = onnx_norm.optimize(upgraded, target="onnx")
    (node,) = (n for n in optimized.graph.node if n.op_type == "LayerNormalization")
    next(a for a in node.attribute if a.name == "epsilon").f = 0.5
    wrong = tmp_path / "wrong.onnx"
    onnx.save(optimized, wrong)
    report = tmp_path / "report.json"
    done = _tool("--ort", *QUICK, model_path, "--optimized", wrong, "--report", report)
    assert done.returncode == 1, done.stdout + done.stderr
    (row,) = _rows(report)
    assert not row["passed"] and not row["vs_ort_original"]["passed"]
    # The verdict table's row for an output farther from the float64 result than the original's.
    assert row["vs_ort_original"]["text"] == "y: less accurate than the original (less-accurate)", row
    assert "out of atol=0.0001 rtol=0.0001" in row["vs_ort_original"]["detail"]  # fp32's default tolerance


# ----------------------------------------------------------------------------------------------------------------
# OpenVINO


@pytest.fixture(scope="module")
def openvino_available() -> None:
    with openvino_on_path():
        pass


@pytest.mark.usefixtures("openvino_available")
def test_openvino_reads_every_standard_op_and_matches(model_path: Path, tmp_path: Path) -> None:
    """LayerNormalization-17, RMSNormalization-23 and the InstanceNormalization form GroupNorm keeps under the onnx
    target read, compile for the CPU and match the original run by ONNX Runtime and by OpenVINO; the compiled
    graphs' norm layers are counted."""
    report = tmp_path / "report.json"
    done = _tool("--openvino", *QUICK, model_path, RESNET, LLAMA_FP16, "--keep", tmp_path, "--report", report)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(report)
    written = {op for row in rows for op in row["ops"]}
    assert written == {"LayerNormalization", "RMSNormalization", "InstanceNormalization"}
    assert len(rows) == 4  # the norms model as exported and upgraded; the others upgraded only (nothing fused before)
    for row in rows:
        assert row["passed"] and row["vs_ort_original"]["passed"] and row["vs_original_here"]["passed"], row
        assert set(row["optimized_run"]["layers"]) == {"RMS", "MVN"}
    llama = next(row for row in rows if row["model"] == LLAMA_FP16.stem)
    assert llama["ops"] == {"RMSNormalization": 5}


@pytest.mark.usefixtures("openvino_available")
def test_openvino_reads_the_ort_targets_ops(tmp_path: Path) -> None:
    """The dynamo LLaMA at its own opset 20 with `--target ort`: SimplifiedLayerNormalization and com.microsoft's
    SkipSimplifiedLayerNormalization read and match."""
    report = tmp_path / "report.json"
    dynamo = ROOT / "examples" / "llama-rmsnorm-dynamo-fp32.onnx"
    done = _tool("--openvino", *QUICK, "--target", "ort", "--upgrade-opset", "0", dynamo, "--report", report)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = _rows(report)
    assert row["passed"] and row["vs_original_here"]["passed"], row
    assert row["ops"] == {"SimplifiedLayerNormalization": 1, "com.microsoft.SkipSimplifiedLayerNormalization": 4}


@pytest.mark.usefixtures("openvino_available")
def test_openvino_names_the_ops_it_cannot_read(model_path: Path, tmp_path: Path) -> None:
    """The default target's output (onnx_norm ops with model-local functions): OpenVINO's ONNX frontend converts
    neither the ops nor their functions, and the check says which ops, exit 1."""
    library_output = tmp_path / "norms.onnx-norm.onnx"
    optimized, _ = onnx_norm.optimize(norms_model())
    onnx.save(optimized, library_output)
    report = tmp_path / "report.json"
    done = _tool("--openvino", *QUICK, model_path, "--optimized", library_output, "--report", report)
    assert done.returncode == 1, done.stdout + done.stderr
    (row,) = _rows(report)
    error = row["optimized_run"]["error"]
    assert error.startswith("does not load: OpenVINO's ONNX frontend has no conversion for "), error
    assert {"onnx_norm.RMSNorm", "onnx_norm.LayerNorm"} <= set(error.rpartition(" for ")[2].split(", ")), error
    assert row["original_run"]["error"] is None and not row["passed"]


# ----------------------------------------------------------------------------------------------------------------
# onnxruntime-web (wasm) and onnxruntime-node through tools/web/run_model.mjs


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    major = subprocess.run([node, "--version"], capture_output=True, text=True, check=False).stdout
    if int(major.strip().lstrip("v").split(".")[0] or 0) < 20:
        pytest.skip(f"node {major.strip()} is older than 20")
    return node


@pytest.fixture(scope="module")
def web_packages() -> str:
    """node, with tools/web's pinned packages installed (`npm ci` once if missing; skipped when npm cannot)."""
    node = _node()
    (ROOT / "build").mkdir(exist_ok=True)
    with FileLock(str(ROOT / "build" / "web-npm.lock")):
        if not all((WEB / "node_modules" / name / "package.json").is_file() for name in WEB_PACKAGES):
            npm = shutil.which("npm")
            if npm is None:
                pytest.skip("npm is not on PATH to install tools/web's packages")
            command = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]
            done = subprocess.run(command, cwd=WEB, capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                pytest.skip(f"npm ci in tools/web failed (no registry here?): {last}")
    return node


def test_run_model_refuses_a_bad_command_line() -> None:
    node = _node()
    done = subprocess.run(
        [node, str(WEB / "run_model.mjs"), "--backend", "webgl"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "run_model: --backend must be one of wasm, node"


def test_run_model_reports_a_model_it_cannot_load(web_packages: str, model_path: Path, tmp_path: Path) -> None:
    """A file that is not ONNX gets an error of its own; the good model beside it still runs and is timed."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    (tmp_path / "inputs").mkdir()
    x = np.random.default_rng(0).standard_normal((1, 3, HIDDEN)).astype(np.float32)
    (tmp_path / "inputs" / "x.bin").write_bytes(x.tobytes())
    manifest = {"samples": [{"x": {"dtype": "float32", "shape": [1, 3, HIDDEN], "file": "x.bin"}}]}
    (tmp_path / "inputs" / "inputs.json").write_text(json.dumps(manifest))
    command = [web_packages, str(WEB / "run_model.mjs"), "--backend", "wasm", "--repeat", "3"]
    command += ["--inputs", str(tmp_path / "inputs" / "inputs.json"), "--out", str(tmp_path / "out"), bad, model_path]
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    bad_result, good = json.loads((tmp_path / "out" / "result.json").read_text())["models"]
    assert bad_result["error"].startswith("failed to load")
    assert len(good["times_ms"]) == 3 and good["outputs"][0]["y"]["shape"] == [1, 3, HIDDEN]
    import onnxruntime

    expected = onnxruntime.InferenceSession(str(model_path)).run(None, {"x": x})[0]
    y = np.frombuffer((tmp_path / "out" / good["outputs"][0]["y"]["file"]).read_bytes(), np.float32)
    np.testing.assert_allclose(y.reshape(expected.shape), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("web_packages")
def test_web_runtimes_load_the_standard_ops_and_match(model_path: Path, tmp_path: Path) -> None:
    """The wasm backend and onnxruntime-node run the --target onnx output of the built model (both variants) and of
    the fp16 LLaMA (int64 in, float16 out), and the --target ort output of the built model at its own opset, and match
    the original run by Python's ONNX Runtime and by themselves."""
    report = tmp_path / "report.json"
    done = _tool("--web", *QUICK, model_path, LLAMA_FP16, "--keep", tmp_path, "--report", report)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(report)
    assert {row["runtime"] for row in rows} == {"wasm", "node"} and len(rows) == 6
    for row in rows:
        assert row["passed"] and row["vs_ort_original"]["passed"] and row["vs_original_here"]["passed"], row
        assert len(row["optimized_run"]["times_ms"]) == 2
    assert {op for row in rows for op in row["ops"]} == {"LayerNormalization", "RMSNormalization"}
    done = _tool("--web", *QUICK, "--target", "ort", "--upgrade-opset", "0", model_path, "--report", report)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(report)  # ONNX Runtime's own ops at the model's opset 18, in both
    assert len(rows) == 2 and all(row["passed"] for row in rows), rows
    assert all(row["ops"] == {"LayerNormalization": 1, "SimplifiedLayerNormalization": 1} for row in rows)
    versions = json.loads(report.read_text())["runtimes"]
    lock = json.loads((WEB / "package-lock.json").read_text())["packages"]
    assert versions["wasm"] == lock["node_modules/onnxruntime-web"]["version"]
    assert versions["node"] == lock["node_modules/onnxruntime-node"]["version"]
