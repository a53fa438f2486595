"""Every model onnx-norm writes during the tests must load in ONNX Runtime at its highest optimisation level, with
our library registered (`onnx_norm.session_options()`) and without it (where the model needs none of our ops, or
carries them as model-local functions): the check runs on each `model_io.save` (the CLI, the integrations and
`onnx_norm.save` all write through it), and the test that wrote an unloadable model fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from written_models import onnx_runtime_refusals

from onnx_norm import model_io


@pytest.fixture(autouse=True)
def written_models_load_in_onnx_runtime(monkeypatch: pytest.MonkeyPatch):
    refusals: list[str] = []
    save = model_io.save

    def checked_save(model, path, **kwargs) -> None:
        save(model, path, **kwargs)
        refusals.extend(onnx_runtime_refusals(Path(path)))

    monkeypatch.setattr(model_io, "save", checked_save)
    yield
    if refusals:
        pytest.fail("ONNX Runtime refuses a model onnx-norm wrote:\n" + "\n".join(refusals))
