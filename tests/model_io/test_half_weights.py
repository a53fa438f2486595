"""Half-precision weights on ONNX Runtime's CPU provider (issue 20): ORT folds an fp32 copy of every fp16 weight of a
node without an fp16 kernel into each session at load. `RuntimeConfig.half_weights_at_run` keeps the weights in
their type (a Cast at run time, right before the node): the values must be those of the folded copies (bit for bit,
pre-packing aside), and verify and the bench use it, alike for every model, when the copies would not fit the memory
budget.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from memory_tools import memory_check

from onnx_norm import inputs, model_io, sessions, weights
from onnx_norm.cli import main
from onnx_norm.sessions import RuntimeConfig


@pytest.fixture
def fp16_model(tmp_path: Path) -> Path:
    """A tiny LLaMA-shaped fp16 model with external data (decomposed RMSNorms between Casts, attention, SwiGLU)."""
    path = tmp_path / "m.onnx"
    args = {"shape": "llama", "layers": 2, "hidden": 64, "intermediate": 128, "dtype": "float16"}
    memory_check.build(path, argparse.Namespace(**args, layout="onnx", data_dir=None))
    return path


def _feeds(path: Path) -> dict[str, np.ndarray]:
    return inputs.prepare(model_io.load_proto(path), shapes={"sequence": 8}, seed=0)[0]


def test_ort_keeps_the_half_precision_weights_and_casts_them_at_run(fp16_model: Path, tmp_path: Path) -> None:
    """The transformer named in `disabled_optimizers` is the one that makes the fp32 copies: with it off the model ORT
    would run holds no fp32 copy of a weight (FusedBack_*) and still its fp16 weights; with it on it holds copies.
    Fails if ONNX Runtime renames it (the option would then silently do nothing)."""

    def optimized(half_at_run: bool) -> onnx.ModelProto:
        config = RuntimeConfig("cpu", 1, half_weights_at_run=half_at_run)
        options = sessions.session_options(config, custom_ops=False)
        options.optimized_model_filepath = str(tmp_path / f"ort_{half_at_run}.onnx")
        disabled = sessions.disabled_optimizers(config)
        ort.InferenceSession(str(fp16_model), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
        return onnx.load(options.optimized_model_filepath)

    folded, kept = optimized(False), optimized(True)
    assert any(t.name.startswith("FusedBack_") for t in folded.graph.initializer)
    assert not any(t.name.startswith("FusedBack_") for t in kept.graph.initializer)
    half = [t for t in kept.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16 and len(t.dims) == 2]
    assert len(half) == 2 * 7  # q, k, v, o, gate, up, down of both layers


def test_casting_half_weights_at_run_changes_no_value(tmp_path: Path) -> None:
    """Cast at run time, a weight gives what ORT's folded fp32 copy gives, bit for bit, once ORT's pre-packing of the
    folded copy is off (as in every session with the weights handed over): from the path and with the weights handed
    over. A pre-packed MatMul sums in another order (at K = 512 already: up to an fp16 ulp in a few elements), which
    is why verify and the bench run every model alike."""
    path = tmp_path / "m.onnx"
    args = {"shape": "llama", "layers": 1, "hidden": 512, "intermediate": 1024, "dtype": "float16"}
    memory_check.build(path, argparse.Namespace(**args, layout="onnx", data_dir=None))
    feeds = _feeds(path)
    proto = model_io.load_proto(path, resolve_external=True)
    at_run = RuntimeConfig("cpu", 1, half_weights_at_run=True)
    folded = sessions.run_model(sessions.create_session(proto, RuntimeConfig("cpu", 1)), feeds)  # not pre-packed
    for model in (path, proto):
        result = sessions.run_model(sessions.create_session(model, at_run), feeds)
        for name, value in folded.items():
            assert value.dtype == np.float16
            np.testing.assert_array_equal(result[name].view(np.uint16), value.view(np.uint16))


def test_verify_casting_at_run_reports_the_same_numbers(fp16_model: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """verify casts the weights where used once the fp32 copies pass HALF_COPIES_LIMIT; its report (every error
    statistic, per node too) is the same as with ORT's folded copies, and it says which way the sessions ran (the
    text report and the JSON), as the bench's weights policy does."""
    out = tmp_path / "opt.onnx"
    assert main(["optimize", str(fp16_model), "-o", str(out), "--external-data", "always"]) == 0
    argv = ["verify", str(fp16_model), str(out), "--per-node", "--shape", "sequence:8", "--report"]
    capsys.readouterr()
    assert main([*argv, str(tmp_path / "folded.json")]) == 0
    assert "FuseFp16InitializerToFp32NodeTransformer" not in capsys.readouterr().out
    monkeypatch.setattr(weights, "HALF_COPIES_LIMIT", 0)
    seen: list[bool] = []
    create = sessions.create_session

    def spy(model, config, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(config.half_weights_at_run)
        return create(model, config, **kwargs)

    monkeypatch.setattr("onnx_norm.parity.gate.create_session", spy)
    assert main([*argv, str(tmp_path / "at_run.json")]) == 0
    assert seen == [True, True]  # the original and the optimized model
    text = capsys.readouterr().out
    folded, at_run = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("folded", "at_run"))
    for key in ("outputs", "norms", "passed"):
        assert folded[key] == at_run[key]
    assert (folded["half_weights_at_run"], folded["weights_policy"]) == (False, "")
    assert at_run["half_weights_at_run"] is True
    policy = at_run["weights_policy"]
    assert "cast to fp32 where used" in policy and "FuseFp16InitializerToFp32NodeTransformer" in policy
    assert "in both models alike" in policy
    # One line of the text report, before the verdict (140 columns may wrap it: compare without the line breaks).
    assert policy in " ".join(text.split()), text


def test_bench_casts_half_weights_at_run_in_every_variant(fp16_model: Path, tmp_path: Path, monkeypatch) -> None:
    """Where the fp32 copies of three sessions per variant would not fit, the bench casts at run in every variant
    alike, keeps three sessions per variant sharing one copy of the weights, and says so in its policy."""
    from onnx_norm import bench

    proto = model_io.load_proto(fp16_model, resolve_external=True)
    size, per_session = weights.weight_bytes(proto), weights.session_copies(proto, "cpu")
    monkeypatch.setattr(weights, "HALF_COPIES_LIMIT", 0)
    # Room for the shared copy and the fp32 copies of one session of each variant, not of three.
    monkeypatch.setattr(weights, "available_memory", lambda: weights.HEADROOM + size + int(3.5 * per_session))
    configs: list[RuntimeConfig] = []
    create = sessions.create_session

    def spy(model, config, **kwargs):  # type: ignore[no-untyped-def]
        configs.append(config)
        return create(model, config, **kwargs)

    monkeypatch.setattr(bench, "create_session", spy)
    argv = ["bench", str(fp16_model), "--shape", "sequence:4", "--repeat", "2", "--warmup", "0"]
    assert main([*argv, "--report", str(tmp_path / "b.json")]) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["sessions_per_variant"] == 3
    assert "cast to fp32 where used" in report["weights_policy"]
    assert "shared by all 9 sessions" in report["weights_policy"]
    assert len(configs) == 9 and all(config.half_weights_at_run for config in configs)
