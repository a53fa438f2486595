"""onnx-norm: find decomposed LayerNorm/RMSNorm subgraphs in ONNX models and run them as fused ops."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public names and the module that defines each; imported on first use so that `import onnx_norm`
# stays cheap and a CLI subcommand only pays for what it uses.
_EXPORTS = {
    "get_library_path": "onnx_norm.library",
    "session_options": "onnx_norm.library",
    "load": "onnx_norm.model_io",
    "save": "onnx_norm.model_io",
    "optimize": "onnx_norm.rewrite",
    "inspect": "onnx_norm.rewrite",
    "verify": "onnx_norm.parity",
    "ParityReport": "onnx_norm.parity",
    "bench": "onnx_norm.bench",
    "VerifyOptions": "onnx_norm.options",
    "BenchOptions": "onnx_norm.options",
    "InputOptions": "onnx_norm.options",
    "RuntimeOptions": "onnx_norm.options",
    "CompareOptions": "onnx_norm.options",
    "MeasureOptions": "onnx_norm.options",
    "ParityCheckOptions": "onnx_norm.options",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'onnx_norm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
