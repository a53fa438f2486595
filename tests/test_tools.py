"""The tools/ scripts still run against the package (a smoke run each, tiny sizes; their numbers are not checked)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import onnxruntime
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_bench_models_runs_on_a_tiny_configuration(tmp_path: Path) -> None:
    done = _run(
        "tools/bench_models.py",
        *("--hidden", "64", "--layers", "1", "--heads", "2", "--sequence", "16"),
        *("--dtype", "fp32", "--exporter", "dynamo", "--warmup", "0", "--repeat", "2", "--keep", str(tmp_path)),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "speedup" in done.stdout
    assert list(tmp_path.glob("*.onnx")), "the exported model was not kept"
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers() or not _has_gpu():
        # The kept model again, on a provider this machine cannot run: one line and exit 2, not a traceback.
        done = _run(
            "tools/bench_models.py",
            *("--hidden", "64", "--layers", "1", "--heads", "2", "--sequence", "16", "--dtype", "fp32"),
            *("--exporter", "dynamo", "--repeat", "1", "--keep", str(tmp_path), "--provider", "cuda"),
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr and "bench_models: asked for CUDAExecutionProvider" in done.stderr


def _has_gpu() -> bool:
    return Path("/dev/nvidia0").exists()


def test_bench_models_with_a_vocabulary_smaller_than_the_zoo_default(tmp_path: Path) -> None:
    """The trace's token ids come from the configured vocabulary (they once came from the zoo's and overflowed)."""
    done = _run(
        "tools/bench_models.py",
        *("--hidden", "32", "--layers", "1", "--heads", "2", "--sequence", "8", "--vocab", "40"),
        *("--dtype", "fp32", "--warmup", "0", "--repeat", "1", "--keep", str(tmp_path)),
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--vocab", "2"], "--vocab must be at least 3"),
        (["--hidden", "100", "--heads", "16"], "multiple of --heads"),
        (["--cuda-graph"], "--cuda-graph needs --provider cuda"),
    ],
)
def test_bench_models_rejects_bad_sizes_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The script's main() in this process: a bad flag is refused before anything is built (a process per case
    would pay ~2 CPU-s of imports for an argparse error; the smoke runs above run the script as typed)."""
    with pytest.raises(SystemExit) as exited:
        _script("bench_models").main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_ort_fusion_cases_counts_every_positive_case() -> None:
    done = _run("tools/ort_fusion_cases.py")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith(f"{len(lines) - 1} positive cases; onnx-norm fuses all"), lines[-1]
    assert all("extended=" in line and "all=" in line for line in lines[:-1])


def _fp16_accuracy():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fp16_accuracy", ROOT / "tools" / "fp16_accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bf16_conversion_runs_every_op_onnx_runtime_cannot_run_in_bf16_in_fp32() -> None:
    """tools/fp16_accuracy.py's bf16 conversion: weights rounded from fp32 to bf16, ops without a bf16 CPU kernel
    in fp32 between Casts, a ConstantOfShape valid at opset 14; its LayerNorm fused on a bf16 X and no farther
    from float64 than the original (which rounds every op's result to bf16)."""
    import ml_dtypes
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import onnx_norm
    from onnx_norm.accuracy import ulp

    rng = np.random.default_rng(0)
    d = 32
    steps = [
        ("Shape", ["x"], "shape"),
        ("ConstantOfShape", ["shape"], "quarter"),
        ("Add", ["x", "quarter"], "h"),
        ("MatMul", ["h", "w"], "m"),
        ("ReduceMean", ["m"], "mu"),
        ("Sub", ["m", "mu"], "d"),
        ("Pow", ["d", "two"], "sq"),
        ("ReduceMean", ["sq"], "var"),
        ("Add", ["var", "eps"], "ve"),
        ("Sqrt", ["ve"], "s"),
        ("Div", ["d", "s"], "n"),
        ("Mul", ["n", "g"], "y"),
    ]
    nodes = [helper.make_node(op, ins, [out]) for op, ins, out in steps]
    nodes[1].attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.array([0.25], np.float32))))
    for node in nodes:
        if node.op_type == "ReduceMean":
            node.attribute.append(helper.make_attribute("axes", [-1]))
    weights = {"w": rng.standard_normal((d, d)) / 4, "two": np.array(2.0), "eps": np.array(1e-5), "g": rng.random(d)}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8, d]) for n in ("x", "y")]
    fp32 = helper.make_model(
        helper.make_graph(nodes, "g", io[:1], io[1:], inits), opset_imports=[helper.make_opsetid("", 14)]
    )
    fp32.ir_version = 8

    model, ran = _fp16_accuracy().to_bf16(fp32)
    onnx.checker.check_model(model, full_check=True)  # ConstantOfShape takes no bf16 value at opset 14
    assert "Cast" in ran and not {"MatMul", "ReduceMean", "Add", "Sqrt"} & set(ran), ran
    stored = {t.name: t for t in model.graph.initializer}
    assert stored["w"].data_type == TensorProto.BFLOAT16
    expected = weights["w"].astype(np.float32).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(numpy_helper.to_array(stored["w"]), expected)

    optimized, report = onnx_norm.optimize(model)
    norms = [n for n in optimized.graph.node if n.domain == "onnx_norm"]
    assert [n.op_type for n in norms] == ["LayerNorm"], report.near_misses
    feeds = {"x": rng.standard_normal((2, 8, d)).astype(np.float32)}
    # fp32 outputs of a model computing in bf16: bf16's tolerance.
    parity = onnx_norm.verify(model, optimized, inputs=[feeds], atol=5e-2, rtol=5e-2)
    assert parity.passed, [o.message for o in parity.outputs]
    golden = parity.outputs[0].golden
    assert golden is not None
    assert golden.optimized_mean_abs <= golden.original_mean_abs + ulp(ml_dtypes.bfloat16, 1.0), golden


def test_bench_group_norm_nhwc_prints_one_row_per_export(tmp_path: Path) -> None:
    """tools/bench_group_norm_nhwc.py on two of the committed channels-last fixtures (a Keras and a flax export) in
    the folder layout tools/group_norm_nhwc_fixtures.py --bench writes; without a manifest, one line and exit 2."""
    import json
    import shutil

    fixtures = ROOT / "tests" / "data" / "group_norm"
    entries = json.loads((fixtures / "manifest-channels-last.json").read_text())
    chosen = [e for e in entries if e["file"] in ("keras-group-norm-g4-swish.onnx", "flax-nnx-group-norm-g1.onnx")]
    for entry in chosen:
        shutil.copy(fixtures / entry["file"], tmp_path / entry["file"])
    (tmp_path / "manifest-bench.json").write_text(json.dumps(chosen))
    done = _run("tools/bench_group_norm_nhwc.py", str(tmp_path), "--warmup", "0", "--repeat", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| keras-", "| flax-"))]
    assert [r.split(" | ")[0] for r in rows] == ["| keras-group-norm-g4-swish", "| flax-nnx-group-norm-g1"]
    assert all("x (" in r for r in rows), rows
    missing = _run("tools/bench_group_norm_nhwc.py", str(tmp_path / "none"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr


@pytest.mark.parametrize("shape", ["blocks", "llama"])
def test_memory_check_ort_baseline_runs_both_models(shape: str) -> None:
    # issue 34's time baseline: ONNX Runtime loads and runs the original and the optimized model, one at a time.
    done = _run(
        "tools/memory_check.py", "ort", "--shape", shape, "--layers", "2", "--hidden", "64", "--intermediate", "96"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [line for line in done.stdout.splitlines() if ": load " in line]
    assert [Path(line.split(":")[0].strip()).name for line in runs] == ["big.onnx", "opt.onnx"], done.stdout
    assert "both models, one session at a time" in done.stdout
