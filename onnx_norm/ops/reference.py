"""numpy reference of the fused norm ops, float64 statistics (semantics: docs/ops.md).

The kernels and the ONNX function bodies are tested against it. Each op's reference lives with its record
(`OpSignature.reference`: ops/norms.py, and a module per other op); `REFERENCES` maps every op name to it, and
the LayerNorm/RMSNorm references and the numerics they share are importable from here."""

from __future__ import annotations

from onnx_norm.ops.norms import layer_norm, rms_norm, skip_layer_norm, skip_rms_norm
from onnx_norm.ops.numerics import elem_type, normalize, normalized, np_dtype, output, round_to
from onnx_norm.ops.schema import OPS
from onnx_norm.ops.signature import Reference

__all__ = [
    "REFERENCES",
    "elem_type",
    "layer_norm",
    "normalize",
    "normalized",
    "np_dtype",
    "output",
    "rms_norm",
    "round_to",
    "skip_layer_norm",
    "skip_rms_norm",
]

#: Every op's reference, by op name: `REFERENCES[op](*inputs in schema order, **attributes)`.
REFERENCES: dict[str, Reference] = {name: op.reference for name, op in OPS.items()}
