"""ONNX Runtime GenAI: a tiny LLaMA built by GenAI's model builder, `onnx-norm optimize FOLDER`, then greedy
generation with onnxruntime_genai from both folders: the same tokens, and our kernels ran (ORT's profile)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_llama import PROMPT, save_tiny_llama

from onnx_norm.cli import main
from onnx_norm.library import LIBRARY_NAME, library_available

og = pytest.importorskip(
    "onnxruntime_genai",
    reason="onnxruntime-genai is not installed (tools/setup.sh installs it with --no-deps beside onnxruntime-gpu)",
)
pytest.importorskip("transformers")

pytestmark = pytest.mark.skipif(not library_available(), reason="the onnx-norm custom-op library is not built")


@pytest.fixture(scope="module")
def genai_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("genai")
    save_tiny_llama(root / "hf")
    command = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(root / "hf"),
        "-o",
        str(root / "model"),
    ]
    command += ["-p", "fp32", "-e", "cpu", "-c", str(root / "cache")]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr[-2000:]
    return root / "model"


def _generate(folder: Path) -> tuple[list[int], list[np.ndarray]]:
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=24, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([PROMPT], dtype=np.int32))
    logits = []
    while not generator.is_done():
        logits.append(np.array(generator.get_logits()))
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)], logits


def _ops(folder: Path) -> dict[str, int]:
    import onnx

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def test_optimized_folder_generates_the_same_tokens(genai_folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "opt"
    assert main(["optimize", str(genai_folder), "-o", str(out), "--take-over-native"]) == 0
    before, after = _ops(genai_folder), _ops(out)
    # The builder's own fused norms, all moved onto our ops.
    assert before["SimplifiedLayerNormalization"] == 1 and before["SkipSimplifiedLayerNormalization"] == 4
    assert after.get("RMSNorm") == 1 and after.get("SkipRMSNorm") == 4
    assert not any("LayerNormalization" in op for op in after)
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"]["custom_ops_library"] == LIBRARY_NAME
    assert (out / LIBRARY_NAME).is_file() and not (out / LIBRARY_NAME).is_symlink()
    assert (out / "model.onnx.data").is_file() and (out / "tokenizer.json").is_file()
    # Profiled, to see which kernels ran: our op names appear only when GenAI registered the library (without it
    # ORT would inline the model-local functions into standard ops).
    config["model"]["decoder"]["session_options"]["enable_profiling"] = str(tmp_path / "profile")
    (out / "genai_config.json").write_text(json.dumps(config))

    tokens, logits = _generate(genai_folder)
    opt_tokens, opt_logits = _generate(out)
    assert opt_tokens == tokens
    assert len(tokens) == 24
    max_diff = max(float(np.abs(a - b).max()) for a, b in zip(logits, opt_logits, strict=True))
    with capsys.disabled():
        print(f"\nGenAI greedy: {len(tokens)} identical tokens; logits max abs difference {max_diff:.3g}")
    assert max_diff < 1e-4
    profile = "".join(p.read_text() for p in tmp_path.glob("profile*.json"))
    assert '"op_name" : "SkipRMSNorm"' in profile or '"op_name":"SkipRMSNorm"' in profile


def test_folder_without_config_is_a_usage_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "in").mkdir()
    assert main(["optimize", str(tmp_path / "in"), "-o", str(tmp_path / "out")]) == 2
    assert "genai_config.json" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_force(genai_folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "opt"
    out.mkdir()
    assert main(["optimize", str(genai_folder), "-o", str(out), "--take-over-native"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["optimize", str(genai_folder), "-o", str(out), "--take-over-native", "--force"]) == 0
    assert (out / LIBRARY_NAME).is_file()
