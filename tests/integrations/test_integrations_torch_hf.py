"""`torch_export.export` on Hugging Face models (tiny configs, random weights), as the README shows it: their norms
are Python code (LlamaRMSNorm, Qwen2RMSNorm, GemmaRMSNorm, T5LayerNorm), never `aten.rms_norm`, so the translation
table cannot see them; the export must still come out with every norm fused (the rewrite after the export) and say
so. One subprocess (a user's script, tests/integrations/hf_torch_export.py) exports the four models; about a minute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from onnx_norm.library import library_available

pytestmark = pytest.mark.skipif(not library_available(), reason="the onnx-norm custom-op library is not built")

MODELS = ("llama", "qwen2", "gemma", "t5")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    directory = tmp_path_factory.mktemp("hf-export")
    script = Path(__file__).with_name("hf_torch_export.py")
    done = subprocess.run(
        [sys.executable, str(script), str(directory), *MODELS], check=False, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # the exporter prints its own progress lines first


@pytest.mark.parametrize("name", MODELS)
def test_hugging_face_norms_come_out_fused(exported: dict, name: str) -> None:
    result = exported[name]
    assert result["decomposed_left"] == 0
    assert result["fused"] == result["norm_calls"] > 0  # every norm module called in the forward pass
    assert result["max_abs_vs_torch"] < 1e-4
    said = " ".join(result["log"])
    assert f"0 norm(s) translated at export (aten.rms_norm / aten.layer_norm), {result['fused']} fused" in said
