"""Every model file of onnx's own backend test data (shipped in the onnx wheel: real CNNs, PyTorch-converted
operators, sequence and string models) through `optimize --verify`, as a CI job would run it: each file that ONNX
Runtime loads ends in exit 0, or in exit 2 with one line naming the input the user must set (an input that is a
shape or a count, or a string); never exit 1 (a parity failure on a model nothing was wrong with) or a traceback.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from onnx_norm.cli import main

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
MODELS = sorted(DATA.rglob("*.onnx"))


def _loads(path: Path) -> str | None:
    """Why ONNX Runtime refuses the file, or None."""
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # ORT raises its own exception types, and RuntimeError for a failed locale
        return str(err).splitlines()[0][:200]
    return None


@pytest.mark.parametrize("path", MODELS, ids=lambda p: str(p.relative_to(DATA).parent))
def test_optimize_verify_passes_or_names_the_input_to_set(path: Path, tmp_path: Path, capfd) -> None:
    refused = _loads(path)
    if refused is not None:
        pytest.skip(f"ONNX Runtime refuses it: {refused}")
    capfd.readouterr()
    code = main(["-q", "optimize", str(path), "-o", str(tmp_path / "out.onnx"), "--verify"])
    err = capfd.readouterr().err
    assert "Traceback" not in err
    if code == 2:
        lines = [line for line in err.splitlines() if line.startswith("onnx-norm")]
        assert len(lines) == 1, err
        assert "--input" in lines[0] or "cannot be generated" in lines[0], lines[0]
        return
    assert code == 0, err
    ort.InferenceSession(str(tmp_path / "out.onnx"), providers=["CPUExecutionProvider"])


def test_the_corpus_is_there() -> None:
    assert len(MODELS) > 100  # the onnx wheel ships it; a test that found nothing would pass on nothing
