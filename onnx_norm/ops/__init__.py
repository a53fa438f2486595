"""The fused norm ops: one record per op (signature, numpy reference, ONNX function body, the ONNX and ONNX Runtime
ops it maps to), listed in `schema.OPS` (semantics: docs/ops.md)."""

from __future__ import annotations

from onnx_norm.ops.schema import DOMAIN, OPS, OPSET_VERSION, NativeOp, NormAttributes, OpSignature

__all__ = ["DOMAIN", "OPS", "OPSET_VERSION", "NativeOp", "NormAttributes", "OpSignature"]
