"""Where the graph rounds: the rounding attributes that make a fused op reproduce its Casts (docs/ops.md).

The ops between the normalised value and the output ("the tail") are Casts, the scale multiply and the bias add.
Walking the tail from the normalised value up, the value is rounded to the narrow type it was last computed in or
cast to: that rounding, seen when the scale multiply happens, is `normalized_type`; the rounding of the product
and of the sum is `multiply_type`; the type of the last value is `output_type` when it is not the input's.

- LLaMA/Mistral/Qwen/Phi-3/T5: fp32 normalise, Cast to fp16, `w * h` in fp16 -> normalized = multiply = fp16.
- Gemma / GPT-OSS: fp32 normalise, `* w` in fp32, Cast to fp16 at the end -> output_type = fp16 only.
- fp16/bf16 with no Casts: everything in fp16 -> normalized = multiply = fp16.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from onnx_norm.dtypes import type_name
from onnx_norm.rewrite.structure import narrow


@dataclasses.dataclass(frozen=True)
class TailStep:
    """One op of the tail, from the normalised value up: "cast", "scale" or "bias", and its output type."""

    role: str
    dtype: ir.DataType | None


@dataclasses.dataclass(frozen=True)
class Rounding:
    normalized_type: int
    multiply_type: int
    output_type: int


def infer_rounding(
    x_type: ir.DataType,
    normalized_dtype: ir.DataType | None,
    tail: list[TailStep],
    y_type: ir.DataType,
    *,
    scale_inside: bool,
) -> Rounding:
    """Rounding attributes for a tail (listed from the normalised value up to the output).

    `scale_inside`: the scale multiplies before the division (`d * w / sqrt(v)`), so there is no separate
    normalised value to round; the product is rounded like the value the division produced.
    """
    rounding = narrow(normalized_dtype)
    normalized_type: int | None = None
    product_roundings: list[int] = []
    if scale_inside:
        normalized_type = 0
        product_roundings.append(rounding)
    for step in tail:
        if step.role == "cast":
            target = narrow(step.dtype)
            if target:
                rounding = target
        elif step.role == "scale":
            if normalized_type is None:
                normalized_type = rounding
            rounding = narrow(step.dtype)
            product_roundings.append(rounding)
        elif step.role == "bias":
            if normalized_type is None:
                normalized_type = rounding
            else:
                product_roundings.append(rounding)
            rounding = narrow(step.dtype)
            product_roundings.append(rounding)
    if normalized_type is None:
        # No scale, no bias: the last rounding only matters when the output is wider than it.
        normalized_type = rounding if rounding and rounding != narrow(y_type) else 0
    narrow_products = [r for r in product_roundings if r]
    multiply_type = narrow_products[-1] if narrow_products else 0
    output_type = int(y_type) if y_type != x_type else 0
    return Rounding(normalized_type, multiply_type, output_type)


def op_rounding(graph: Rounding) -> Rounding:
    """The fused op's rounding for a graph that rounds as `graph` says: once, to Y's type, at the end.

    The graph's intermediate roundings (LLaMA's `.to(fp16)` before `w * h`, every step of an fp16 graph) are not
    reproduced: the float64 result has none of them, and neither has ONNX Runtime's CPU run of an fp16 graph (its
    ops without fp16 kernels run in fp32, and the casts between them are removed), so reproducing them made the
    fused op up to an ulp farther from the exact result than the subgraph it replaced (docs/ops.md). That holds
    for the graph's last rounding too when it is to X's narrow type before a wider output (an fp16 result Cast to
    fp32, the last norm of an fp16-converted model with fp32 outputs): ONNX Runtime drops it with the Cast pair,
    and keeping it made the dynamo LLaMA's output 1.38x farther from float64 in mean (docs/accuracy.md). Y is
    then the wider type, which every target writes without rounding (targets.py).
    """
    return Rounding(0, 0, graph.output_type)


def describe(x_type: ir.DataType, compute_type: ir.DataType | None, rounding: Rounding) -> str:
    """A short human description of the cast placement, e.g. "fp16 in, fp32 compute, fp16 before scale"."""
    parts = [f"{type_name(x_type)} in"]
    if compute_type is not None and compute_type != x_type:
        parts.append(f"{type_name(compute_type)} compute")
    if rounding.normalized_type:
        parts.append(f"{type_name(rounding.normalized_type)} before scale")
    if rounding.multiply_type:
        parts.append(f"{type_name(rounding.multiply_type)} multiply")
    if rounding.output_type:
        parts.append(f"{type_name(rounding.output_type)} out")
    return ", ".join(parts)
