"""Optimum: a tiny LLaMA exported with Optimum's ONNX exporter, its folder optimized, then loaded by
ORTModelForCausalLM with our session options: the same greedy tokens and logits as the original export.

optimum-onnx 0.1.0 (the newest) needs transformers < 4.58 while this project's tests use transformers 5, so in
CI's environment the Optimum test skips; the folder rewrite itself is tested without Optimum."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from repo_paths import EXAMPLES
from tiny_llama import PROMPT, save_tiny_llama

from onnx_norm.integrations import optimum as integration
from onnx_norm.library import library_available
from onnx_norm.model_io import ModelLoadError

EXAMPLE = EXAMPLES / "llama-rmsnorm-fp32.onnx"


def _our_ops(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        if node.domain == "onnx_norm":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def test_folder_rewrite_keeps_the_other_files(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    shutil.copy(EXAMPLE, export / "model.onnx")
    (export / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (export / "sub").mkdir()
    (export / "sub" / "tokenizer.json").write_text("{}")
    reports = integration.optimize_folder(export, tmp_path / "opt")
    assert list(reports) == ["model.onnx"] and len(reports["model.onnx"].norms) == 5
    assert _our_ops(tmp_path / "opt" / "model.onnx") == {"RMSNorm": 1, "SkipRMSNorm": 4}
    assert json.loads((tmp_path / "opt" / "config.json").read_text()) == {"model_type": "llama"}
    assert (tmp_path / "opt" / "sub" / "tokenizer.json").is_file()


def test_a_folder_that_fails_half_way_leaves_no_output_and_no_staging(tmp_path: Path) -> None:
    """The shared folder writer (integrations/folder.py) stages next to the output and moves it into place only
    when every model is written: a model that does not load after one that did leaves nothing behind."""
    export = tmp_path / "export"
    export.mkdir()
    shutil.copy(EXAMPLE, export / "a_model.onnx")
    (export / "b_model.onnx").write_bytes(b"not a model")
    (export / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"b_model\.onnx"):
        integration.optimize_folder(export, tmp_path / "opt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_folder_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(integration.ExportFolderError, match=r"no \*\.onnx model"):
        integration.optimize_folder(tmp_path, tmp_path / "opt")
    shutil.copy(EXAMPLE, tmp_path / "model.onnx")
    (tmp_path / "opt").mkdir()
    with pytest.raises(integration.ExportFolderError, match="exists"):
        integration.optimize_folder(tmp_path, tmp_path / "opt")


def test_ort_model_generates_the_same_tokens(tmp_path: Path, monkeypatch, capsys) -> None:
    pytest.importorskip(
        "optimum.onnxruntime",
        reason="optimum-onnx is not installed: 0.1.0 needs transformers<4.58 and this project's tests use "
        "transformers 5 (checked in a separate environment, docs/integrations.md)",
    )
    if not library_available():
        pytest.skip("the onnx-norm custom-op library is not built")
    import onnxruntime as ort
    import torch
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTModelForCausalLM

    save_tiny_llama(tmp_path / "hf")
    main_export(str(tmp_path / "hf"), output=str(tmp_path / "export"), task="text-generation-with-past")
    reports = integration.optimize_folder(tmp_path / "export", tmp_path / "opt")
    assert sum(len(r.norms) for r in reports.values()) == 5

    monkeypatch.chdir(tmp_path)  # ORT writes the profile into the working directory
    profiled = ort.SessionOptions()
    profiled.enable_profiling = True
    original = ORTModelForCausalLM.from_pretrained(tmp_path / "export")
    fused = integration.from_pretrained(ORTModelForCausalLM, tmp_path / "opt", session_options=profiled)
    ids = torch.tensor([PROMPT])
    tokens = original.generate(ids, max_new_tokens=16, do_sample=False)
    fused_tokens = fused.generate(ids, max_new_tokens=16, do_sample=False)
    assert tokens.tolist() == fused_tokens.tolist() and tokens.shape[1] == len(PROMPT) + 16
    mask = torch.ones_like(ids)
    diff = np.abs(
        original(input_ids=ids, attention_mask=mask).logits - fused(input_ids=ids, attention_mask=mask).logits
    )
    with capsys.disabled():
        print(f"\nOptimum greedy: identical tokens; logits max abs difference {float(diff.max()):.3g}")
    assert float(diff.max()) < 1e-4
    del fused  # ends the session, which writes the profile
    gc.collect()
    profile = "".join(p.read_text() for p in tmp_path.glob("onnxruntime_profile_*.json"))
    assert '"op_name" : "SkipRMSNorm"' in profile
