"""The fused norm ops: schemas, numpy references and ONNX function bodies (semantics: docs/ops.md)."""

from __future__ import annotations

from onnx_norm.ops.schema import DOMAIN, MODULATED_OPS, OPS, OPSET_VERSION, NormAttributes, OpSignature

__all__ = ["DOMAIN", "MODULATED_OPS", "OPS", "OPSET_VERSION", "NormAttributes", "OpSignature"]
