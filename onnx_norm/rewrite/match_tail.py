"""Step 1 of the matcher (match.py): the tail, from the anchor's output down through Casts, one bias Add and
multiplies or divides by constants (or run-time weights) to the junction, the first Mul/Div whose operands are both
computed; and whether the anchor's single consumer would extend it (then the anchor is not the norm's end)."""

from __future__ import annotations

import onnx_ir as ir

from onnx_norm.dtypes import is_onnx_domain
from onnx_norm.rewrite import constants
from onnx_norm.rewrite.match_state import TailOp
from onnx_norm.rewrite.reductions import is_float_cast

#: The longest tail walked: Casts, scales and a bias, each at most a few times.
MAX_TAIL = 12


def _other_parameter(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The scale or bias operand (`_parameter`) of a binary node whose other operand is `value`, if any."""
    a, b = node.inputs[0], node.inputs[1]
    other = b if a is value else a
    if other is value or other is None:
        return None
    return other if _parameter(other) else None


def _parameter(value: ir.Value) -> bool:
    """A scale or bias operand: a constant, or a weight the model takes at run time."""
    return constants.is_constant(value) or constants.is_runtime_parameter(value)


def walk_tail(y: ir.Value) -> tuple[ir.Value, list[TailOp]] | None:
    """Down from `y` to the junction; the tail ops are returned from the top (y) down."""
    tail: list[TailOp] = []
    value = y
    seen_scale = False
    seen_bias = False
    for _ in range(MAX_TAIL):
        node = value.producer()
        if node is None or not is_onnx_domain(node.domain) or len(node.outputs) != 1:
            return None
        op = node.op_type
        if is_float_cast(node) or op == "Identity":
            tail.append(TailOp(node, "cast", None))
            value = node.inputs[0]  # type: ignore[assignment]
            continue
        if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
            return None
        a, b = node.inputs
        if op == "Sub":
            return (value, tail) if not (seen_bias or seen_scale) else None
        if op == "Add":
            if seen_bias or seen_scale:
                return None
            if not _parameter(a) and not _parameter(b):
                return value, tail  # a sum of two computed values: only the distributed LayerNorm ends here
            if _parameter(b):
                tail.append(TailOp(node, "bias", b))
                value = a
            else:
                tail.append(TailOp(node, "bias", a))
                value = b
            seen_bias = True
            continue
        if op == "Mul":
            if _parameter(b) and not _parameter(a):
                tail.append(TailOp(node, "scale", b))
                value = a
                seen_scale = True
                continue
            if _parameter(a) and not _parameter(b):
                tail.append(TailOp(node, "scale", a))
                value = b
                seen_scale = True
                continue
            return value, tail
        if op == "Div":
            if constants.is_constant(b) and not constants.is_constant(a):
                tail.append(TailOp(node, "scale", b, exponent=-1))
                value = a
                seen_scale = True
                continue
            return value, tail
        return None
    return None


def extends(y: ir.Value, tail: list[TailOp]) -> bool:
    """True when the single consumer of `y` would continue the tail (so `y` is not the norm's end)."""
    if y.is_graph_output():
        return False
    consumers = {use.node for use in y.uses()}
    if len(consumers) != 1:
        return False
    (node,) = consumers
    if not is_onnx_domain(node.domain):
        return False
    if is_float_cast(node):
        return True
    has_bias = any(op.role == "bias" for op in tail)
    if has_bias or len(node.inputs) != 2:
        return False
    if node.op_type in ("Add", "Mul"):
        return _other_parameter(node, y) is not None
    if node.op_type == "Div":
        return node.inputs[0] is y and node.inputs[1] is not y and constants.is_constant(node.inputs[1])
    return False
