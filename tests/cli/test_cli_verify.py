"""`onnx-norm verify` on real exported models (the bundled examples) optimized by the rewrite passes: a correct
optimized model passes, corrupted ones fail with exit 1 and name the broken norm, bad inputs exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from repo_paths import EXAMPLES

from onnx_norm.ops.functions import attach_functions
from onnx_norm.rewrite import optimize

LLAMA = EXAMPLES / "llama-rmsnorm-fp32.onnx"
LLAMA_FP16 = EXAMPLES / "llama-rmsnorm-fp16.onnx"
SHAPE = ["--shape", "sequence:16"]


def _cli(argv: list[str]) -> int:
    from onnx_norm.cli import main

    return main(argv)


@pytest.fixture(scope="module")
def optimized_llama() -> onnx.ModelProto:
    optimized, report = optimize(onnx.load(LLAMA))
    assert report.fused == 5
    return optimized


def _norm_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if any(p.key == "onnx_norm.rule" for p in n.metadata_props)]


def _save_corrupted(model: onnx.ModelProto, path: Path, change) -> str:
    """Applies `change` to a copy, rebuilds the model-local functions (they bake the attributes in, and run
    when the kernel library is absent) and saves it; returns the name of the changed node."""
    corrupted = onnx.ModelProto()
    corrupted.CopyFrom(model)
    name = change(_norm_nodes(corrupted))
    ir_model = ir.serde.deserialize_model(corrupted)
    attach_functions(ir_model)
    onnx.save(ir.serde.serialize_model(ir_model), path)
    return name


def _set_attr(node: onnx.NodeProto, name: str, value: float | int) -> None:
    for attr in node.attribute:
        if attr.name == name:
            node.attribute.remove(attr)
            break
    node.attribute.append(onnx.helper.make_attribute(name, value))


def test_verify_passes_a_correctly_optimized_exported_model(tmp_path: Path, optimized_llama, capsys):
    onnx.save(optimized_llama, tmp_path / "opt.onnx")
    report = tmp_path / "parity.json"
    code = _cli(["verify", str(LLAMA), str(tmp_path / "opt.onnx"), *SHAPE, "--per-node", "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED | Output: 'last_hidden_state'" in out
    data = json.loads(report.read_text())
    assert data["status"] == "PASSED"
    assert data["golden"] == "ort"
    assert len(data["norms"]) == 5
    assert {n["status"] for n in data["norms"]} == {"ok"}
    assert data["outputs"][0]["metrics"]["mismatched"] == 0


def _second_norm(change_node):
    def change(nodes: list[onnx.NodeProto]) -> str:
        change_node(nodes)
        return nodes[1].name

    return change


def _swap_scales(nodes: list[onnx.NodeProto]) -> None:
    nodes[1].input[-1], nodes[2].input[-1] = nodes[2].input[-1], nodes[1].input[-1]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_second_norm(lambda nodes: _set_attr(nodes[1], "epsilon", 1.0)), id="epsilon-changed"),
        pytest.param(_second_norm(_swap_scales), id="scale-swapped"),
        # Rounding the normalised value to fp16 before the scale multiply: a cast moved into an fp32 norm.
        pytest.param(
            _second_norm(lambda nodes: _set_attr(nodes[1], "normalized_type", onnx.TensorProto.FLOAT16)),
            id="cast-order-changed",
        ),
    ],
)
def test_verify_fails_a_corrupted_model_and_names_the_broken_norm(tmp_path: Path, optimized_llama, capsys, change):
    broken = _save_corrupted(optimized_llama, tmp_path / "bad.onnx", change)
    report = tmp_path / "parity.json"
    code = _cli(["verify", str(LLAMA), str(tmp_path / "bad.onnx"), *SHAPE, "--per-node", "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "FAILED | Output: 'last_hidden_state'" in out
    assert f"first divergent norm: '{broken}'" in out
    data = json.loads(report.read_text())
    assert data["status"] == "FAILED"
    assert data["first_divergent_norm"] == broken
    statuses = {n["node"]: n["status"] for n in data["norms"]}
    assert statuses[broken] == "diverges"
    first = _norm_nodes(optimized_llama)[0].name
    assert statuses[first] == "ok"  # the norms before the broken one still agree


def test_verify_passes_the_fp16_model_against_the_original_or_the_exact_result(tmp_path: Path, capsys):
    optimized, _ = optimize(onnx.load(LLAMA_FP16))
    onnx.save(optimized, tmp_path / "opt16.onnx")
    code = _cli(["verify", str(LLAMA_FP16), str(tmp_path / "opt16.onnx"), *SHAPE, "--per-node", "--samples", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "golden: ort" in out


def _bad_inputs(tmp_path: Path) -> dict[str, list[str]]:
    ids = np.zeros((1, 8), np.int64)
    mask = np.ones((1, 8), np.int64)
    np.savez(tmp_path / "wrong_name.npz", input_idz=ids, attention_mask=mask)
    np.savez(tmp_path / "wrong_dtype.npz", input_ids=ids.astype(np.int32), attention_mask=mask)
    np.savez(tmp_path / "wrong_rank.npz", input_ids=ids[0], attention_mask=mask)
    np.savez(tmp_path / "wrong_shape.npz", input_ids=ids, attention_mask=mask[:, :5])
    return {
        "name": ["--inputs", str(tmp_path / "wrong_name.npz")],
        "dtype": ["--inputs", str(tmp_path / "wrong_dtype.npz")],
        "rank": ["--inputs", str(tmp_path / "wrong_rank.npz")],
        "shape": ["--inputs", str(tmp_path / "wrong_shape.npz")],
        "shape-flag": ["--shape", "input_ids:1,8,3"],
        "unknown-dim": ["--shape", "tokens:8"],
        "missing-file": ["--inputs", str(tmp_path / "nope.npz")],
        "atol": ["--atol", "last_hidden_state:abc"],
        "samples": ["--samples", "0"],
    }


EXPECTED_MESSAGES = {
    "name": "'input_idz' not an input of the model",
    "dtype": "input 'input_ids' has dtype int32, the model expects",
    "rank": "(rank 1), the model expects",
    "shape": "dim 'sequence' is 5 in input 'attention_mask' but 8 in input 'input_ids'",
    "shape-flag": "rank 3 given",
    "unknown-dim": "'tokens', which is neither an input nor a symbolic dim",
    "missing-file": "input file not found",
    "atol": "is not a valid value",
    "samples": "samples must be an integer >= 1, got 0",
}


@pytest.mark.parametrize("case", list(EXPECTED_MESSAGES))
def test_verify_input_errors_exit_2_with_a_clear_message(tmp_path: Path, optimized_llama, capsys, case):
    onnx.save(optimized_llama, tmp_path / "opt.onnx")
    code = _cli(["verify", str(LLAMA), str(tmp_path / "opt.onnx"), *_bad_inputs(tmp_path)[case]])
    captured = capsys.readouterr()
    assert code == 2
    assert EXPECTED_MESSAGES[case] in captured.err
    assert "Traceback" not in captured.err


def test_verify_with_a_missing_model_exits_2(tmp_path: Path, capsys):
    assert _cli(["verify", str(LLAMA), str(tmp_path / "missing.onnx")]) == 2
    assert "optimized model not found" in capsys.readouterr().err


def test_verify_with_real_inputs_from_files(tmp_path: Path, optimized_llama, capsys):
    onnx.save(optimized_llama, tmp_path / "opt.onnx")
    rng = np.random.default_rng(5)
    np.savez(tmp_path / "s0.npz", input_ids=rng.integers(0, 128, (2, 12)), attention_mask=np.ones((2, 12), np.int64))
    np.save(tmp_path / "ids.npy", rng.integers(0, 128, (1, 7)))
    np.save(tmp_path / "mask.npy", np.ones((1, 7), np.int64))
    files = [str(tmp_path / "s0.npz")]
    code = _cli(
        [
            "verify",
            str(LLAMA),
            str(tmp_path / "opt.onnx"),
            "--inputs",
            *files,
            f"input_ids:{tmp_path / 'ids.npy'}",
            f"attention_mask:{tmp_path / 'mask.npy'}",
            "--report",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 0, capsys.readouterr().out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["samples"] == 2
    assert data["shapes"]["input_ids"] == [2, 12]


def test_optimize_verify_keeps_a_model_that_passes(tmp_path: Path, capsys):
    out = tmp_path / "opt.onnx"
    code = _cli(["optimize", str(LLAMA), "-o", str(out), "--verify"])
    assert code == 0, capsys.readouterr().out
    assert out.is_file()


def test_optimize_verify_exits_1_and_leaves_no_bad_output(tmp_path: Path, monkeypatch, capsys):
    import onnx_norm.rewrite

    real_optimize = onnx_norm.rewrite.optimize

    def broken_optimize(model, **kwargs):
        # Fault injection: a rewrite that gets one epsilon wrong, as a buggy rule would.
        optimized, report = real_optimize(model, **kwargs)
        proto = optimized if isinstance(optimized, onnx.ModelProto) else ir.serde.serialize_model(optimized)
        _set_attr(_norm_nodes(proto)[1], "epsilon", 1.0)
        ir_model = ir.serde.deserialize_model(proto)
        attach_functions(ir_model)
        return (ir_model if not isinstance(optimized, onnx.ModelProto) else ir.serde.serialize_model(ir_model)), report

    monkeypatch.setattr(onnx_norm.rewrite, "optimize", broken_optimize)
    out = tmp_path / "opt.onnx"
    code = _cli(["optimize", str(LLAMA), "-o", str(out), "--verify"])
    assert code == 1, capsys.readouterr().out
    assert not out.exists()
    assert not Path(f"{out}.data").exists()


def test_demo_runs_the_whole_flow_on_a_bundled_model(tmp_path: Path, capsys):
    code = _cli(["demo", "--model", "llama-rmsnorm-fp32", "--warmup", "0", "--repeat", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    for step in ("onnx-norm inspect", "onnx-norm optimize", "onnx-norm verify", "onnx-norm bench"):
        assert f"$ {step}" in out
    assert "PASSED | Output: 'last_hidden_state'" in out
    assert (tmp_path / "llama-rmsnorm-fp32.optimized.onnx").is_file()


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.onnx")))
def test_every_bundled_example_passes_the_gate_after_optimize(tmp_path: Path, capsys, example):
    out = tmp_path / "opt.onnx"
    assert _cli(["optimize", str(EXAMPLES / example), "-o", str(out)]) == 0
    code = _cli(["verify", str(EXAMPLES / example), str(out), "--per-node", "--shape", "sequence:32"])
    assert code == 0, capsys.readouterr().out


def _cuda_runs() -> bool:
    import onnxruntime as ort

    from onnx_norm.sessions import RuntimeConfig, SessionError, create_session

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    try:
        create_session(onnx.load(LLAMA), RuntimeConfig("cuda"), custom_ops=False)
    except SessionError:
        return False
    return True


@pytest.mark.skipif(_cuda_runs(), reason="CUDA works here: nothing falls back")
def test_a_cuda_run_that_falls_back_to_the_cpu_is_refused(tmp_path: Path, optimized_llama, capsys):
    onnx.save(optimized_llama, tmp_path / "opt.onnx")
    code = _cli(["verify", str(LLAMA), str(tmp_path / "opt.onnx"), "--provider", "cuda", *SHAPE])
    assert code == 2
    assert "runs the model on ['CPUExecutionProvider']" in capsys.readouterr().err
