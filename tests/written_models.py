"""Whether ONNX Runtime loads a model file at ORT_ENABLE_ALL, with and without our library (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort

import onnx_norm
from onnx_norm import errors, model_io, sessions

#: Larger files (with their external data) are not loaded twice more: the check must stay cheap.
MAX_CHECKED_BYTES = 64 << 20


def onnx_runtime_refusals(path: Path) -> list[str]:
    """One line for each way ONNX Runtime refuses the model at `path` (none when it loads every way)."""
    data = model_io.data_file(path)
    size = path.stat().st_size + (data.stat().st_size if data.exists() else 0)
    if size > MAX_CHECKED_BYTES:
        return []
    proto = onnx.load(str(path), load_external_data=False)
    ways = [("with the onnx-norm library", onnx_norm.session_options())]
    if not sessions.uses_custom_ops(proto) or sessions.has_local_functions(proto):
        ways.append(("without the library", ort.SessionOptions()))
    refusals = []
    for label, options in ways:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 4
        try:
            ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # ORT's exception types share no base class
            refusals.append(f"{path} ({label}, ORT_ENABLE_ALL): {errors.ort_message(err)}")
    return refusals
