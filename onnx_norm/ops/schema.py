"""The registry of the fused ops: every op record (`OpSignature`, ops/signature.py), listed here explicitly, one
line per op module (semantics: docs/ops.md). The records live with their references and function bodies: the
LayerNorm/RMSNorm/Skip ops in ops/norms.py, each other op in a module of its own."""

from __future__ import annotations

from onnx_norm.dtypes import FLOAT_TYPES
from onnx_norm.ops.group_norm import GROUP_NORM
from onnx_norm.ops.modulated import MODULATED_OPS
from onnx_norm.ops.norms import LAYER_NORM, NORM_OPS, RMS_NORM, SKIP_LAYER_NORM, SKIP_RMS_NORM
from onnx_norm.ops.signature import DOMAIN, MS_DOMAIN, OPSET_VERSION, NativeOp, NormAttributes, OpSignature

__all__ = [
    "DOMAIN",
    "FLOAT_TYPES",
    "LAYER_NORM",
    "MS_DOMAIN",
    "OPS",
    "OPSET_VERSION",
    "RMS_NORM",
    "SKIP_LAYER_NORM",
    "SKIP_RMS_NORM",
    "NativeOp",
    "NormAttributes",
    "OpSignature",
    "native_ops",
    "op_for",
]

#: Every op of the domain, by name.
OPS: dict[str, OpSignature] = {
    op.name: op
    for op in (
        *NORM_OPS,
        *MODULATED_OPS.values(),
        GROUP_NORM,
    )
}


def native_ops() -> list[tuple[OpSignature, NativeOp]]:
    """Every (op, native op computing the same) pair of the records: the one table of ONNX and ONNX Runtime norm
    ops that the targets, the take-over, the evaluator and the checks read."""
    return [(op, native) for op in OPS.values() for native in op.natives]


def op_for(kind: str, skip: bool = False) -> OpSignature | None:
    """Our op fusing matches of `kind` (`NormSpec.kind`), with a residual input when `skip`; None if there is none."""
    return next((op for op in OPS.values() if op.kind == kind and op.skip == skip), None)
