"""The registry of the fused ops: every op record (`OpSignature`, ops/signature.py), listed here explicitly, one
line per op module (semantics: docs/ops.md). The records live with their references and function bodies: the
LayerNorm/RMSNorm/Skip ops in ops/norms.py, each other op in a module of its own."""

from __future__ import annotations

from onnx_norm.dtypes import FLOAT_TYPES, ONNX_DOMAINS
from onnx_norm.ops.gated_norm import GATED_RMS_NORM
from onnx_norm.ops.group_norm import GROUP_NORM
from onnx_norm.ops.l2_norm import L2_NORM
from onnx_norm.ops.modulated import MODULATED_OPS
from onnx_norm.ops.norms import LAYER_NORM, NORM_OPS, RMS_NORM, SKIP_LAYER_NORM, SKIP_RMS_NORM
from onnx_norm.ops.signature import (
    DOMAIN,
    MS_DOMAIN,
    OPSET_VERSION,
    NativeOp,
    NormAttributes,
    NormOpAttributes,
    OpSignature,
)

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
    "NormOpAttributes",
    "OpSignature",
    "native_norm_ops",
    "native_of",
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
        L2_NORM,
        GATED_RMS_NORM,
    )
}


def native_ops() -> list[tuple[OpSignature, NativeOp]]:
    """Every (op, native op computing the same) pair of the records: the one table of ONNX and ONNX Runtime norm
    ops that the targets, the take-over, the evaluator and the checks read."""
    return [(op, native) for op in OPS.values() for native in op.natives]


def native_norm_ops() -> frozenset[tuple[str, str]]:
    """The native norm ops by (domain, op type), as the take-over reads them ("" and "ai.onnx" are the standard
    domain, where ONNX Runtime registers its contrib norms too): for the tools that count or time norms."""
    return frozenset((domain, native.op_type) for _, native in native_ops() for domain in native.take_over)


def native_of(op_type: str, domain: str, opset: int) -> tuple[OpSignature, NativeOp] | None:
    """The op record and native op that a node of `op_type` in `domain` is, in a graph of default-domain `opset`
    (0: unknown), as the built-in take-over reads it: of the native ops it may be, the newest the opset allows,
    else the oldest (ONNX's LayerNormalization from opset 17, ONNX Runtime's contrib op of that name below)."""
    domain = "" if domain in ONNX_DOMAINS else domain
    found = sorted(
        ((op, n) for op, n in native_ops() if n.op_type == op_type and domain in n.take_over),
        key=lambda pair: pair[1].version,
    )
    allowed = [pair for pair in found if pair[1].version <= opset]
    return (allowed or found[:1] or [None])[-1]


def op_for(kind: str, skip: bool = False) -> OpSignature | None:
    """Our op fusing matches of `kind` (`NormSpec.kind`), with a residual input when `skip`; None if there is none."""
    return next((op for op in OPS.values() if op.kind == kind and op.skip == skip), None)
