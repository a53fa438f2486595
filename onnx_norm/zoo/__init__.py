"""Tiny Hugging Face models exported to ONNX with real exporters: the evidence that the rewrite catches what
exporters produce. Used by tests/rewrite/test_zoo.py, tools/coverage.py and tools/make_examples.py; needs torch and
transformers, which the library itself does not.
"""

from __future__ import annotations

from onnx_norm.zoo.export import (
    DTYPES,
    EXPORTERS,
    ZooExport,
    ZooExportError,
    default_cache_dir,
    export,
)
from onnx_norm.zoo.models import DEFAULT_SUBSET, ZOO, ZooModel, build_model, example_inputs
from onnx_norm.zoo.norms import NormUsage, count_norm_calls

__all__ = [
    "DEFAULT_SUBSET",
    "DTYPES",
    "EXPORTERS",
    "ZOO",
    "NormUsage",
    "ZooExport",
    "ZooExportError",
    "ZooModel",
    "build_model",
    "count_norm_calls",
    "default_cache_dir",
    "example_inputs",
    "export",
]
