"""Element types and domains: the one table of which types the fused ops take and how messages spell them.

Every module that checks "is this a float type the kernels accept", names a type in a message or report, or asks
"is this node in the default ONNX domain" reads it here, so the spellings cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir

#: Element types the kernels accept for X, Skip, Scale, Bias and Y (TensorProto values; ir.DataType compares equal).
FLOAT_TYPES: tuple[int, ...] = (int(ir.DataType.FLOAT), int(ir.DataType.FLOAT16), int(ir.DataType.BFLOAT16))
#: The 16-bit float types: computed in float32 by every kernel, rounded on the way out.
NARROW_TYPES: tuple[int, ...] = (int(ir.DataType.FLOAT16), int(ir.DataType.BFLOAT16))
#: Float types a matched graph may compute in (float64 statistics are analysed, not emitted).
ANALYSED_FLOAT_TYPES: tuple[int, ...] = (*FLOAT_TYPES, int(ir.DataType.DOUBLE))
#: Float element types from the widest to the narrowest (bfloat16's 8-bit mantissa is narrower than float16's):
#: which type's tolerance and ulp apply to a value computed in several (onnx_norm/parity/precision.py).
BY_PRECISION: tuple[int, ...] = (
    int(ir.DataType.DOUBLE),
    int(ir.DataType.FLOAT),
    int(ir.DataType.FLOAT16),
    int(ir.DataType.BFLOAT16),
)

#: Short spellings used in messages, reports, tables and CLI choices.
_SHORT_NAMES: dict[int, str] = {
    int(ir.DataType.FLOAT): "fp32",
    int(ir.DataType.FLOAT16): "fp16",
    int(ir.DataType.BFLOAT16): "bf16",
    int(ir.DataType.DOUBLE): "fp64",
}

#: Domains that mean the default ONNX operator set.
ONNX_DOMAINS: frozenset[str] = frozenset({"", "ai.onnx"})


def type_name(dtype: int | ir.DataType | None) -> str:
    """The short spelling of an element type ("fp16"); "?" when unknown, "-" for 0 ("not set" in our attributes)."""
    if dtype is None:
        return "?"
    if int(dtype) == 0:
        return "-"
    return _SHORT_NAMES.get(int(dtype), ir.DataType(int(dtype)).name.lower())


def type_from_name(name: str) -> int:
    """The element type for a short spelling ("fp16") or an ONNX one ("float16"); ValueError names the choices."""
    for value, short in _SHORT_NAMES.items():
        if name.lower() in (short, ir.DataType(value).name.lower()):
            return value
    raise ValueError(f"unknown element type {name!r}; expected one of {', '.join(_SHORT_NAMES.values())}")


def is_onnx_domain(domain: str) -> bool:
    return domain in ONNX_DOMAINS


def onnx_opset(opset_imports: Mapping[str, int]) -> int | None:
    """The default-domain opset a graph or function imports (under "" or "ai.onnx"), or None when it imports none.
    Callers choose their own fallback: what an absent import means differs (a function inherits its model's)."""
    for domain in ("", "ai.onnx"):
        if domain in opset_imports:
            return int(opset_imports[domain])
    return None
