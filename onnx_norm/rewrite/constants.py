"""Constants inside a norm: epsilon, exponents, divisors, axes, and scale/bias folded from constant expressions.

A value is constant when it is an initializer that is not also a graph input (an input can be overridden at run
time), the output of a `Constant` node, or computed from such values only (Gemma's `1 + w`, `Cast(w)`,
`Flatten(scale)`), in which case it is folded with the numpy interpreter. A `Shape` counts as constant input to
such a computation when the result does not depend on its symbolic dims (TorchScript's `x.shape[-1]` as the
divisor of a mean, the last dim being static).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx_ir as ir

from onnx_norm.rewrite.evaluate import SUPPORTED_OPS, EvaluationError, evaluate, static_shape

#: Constant expressions larger than this are not folded (a scale or bias is one row of the normalised dims).
MAX_FOLD_ELEMENTS = 1 << 24
_MAX_FOLD_NODES = 32
_FILLS = (1_000_003, 2_000_029)  # sizes no static dim has


def is_direct_constant(value: ir.Value) -> bool:
    if value.const_value is not None and not value.is_graph_input():
        return True
    node = value.producer()
    return node is not None and node.op_type == "Constant" and node.domain in ("", "ai.onnx")


def is_constant(value: ir.Value | None) -> bool:
    """True when `value` depends on constants only (no graph input, no runtime value)."""
    if value is None:
        return False
    nodes = _constant_nodes(value)
    if nodes is None:
        return False
    if any(n.op_type == "Shape" and static_shape(n) is None for n in nodes):
        return constant_array(value) is not None
    return True


def _constant_nodes(value: ir.Value) -> list[ir.Node] | None:
    """The nodes computing `value` from constants, or None when it depends on anything else."""
    nodes: list[ir.Node] = []
    seen: set[ir.Value] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.const_value is not None and not current.is_graph_input():
            if current.const_value.size > MAX_FOLD_ELEMENTS:
                return None
            continue
        node = current.producer()
        if node is None or node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPS:
            return None
        nodes.append(node)
        if len(nodes) > _MAX_FOLD_NODES:
            return None
        if node.op_type == "Constant" or (node.op_type == "Shape" and static_shape(node, fill=1) is not None):
            continue
        stack.extend(v for v in node.inputs if v is not None)
    return nodes


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The value of a constant or constant expression, or None when it is not constant."""
    if value is None:
        return None
    nodes = _constant_nodes(value)
    if nodes is None:
        return None
    symbolic = any(n.op_type == "Shape" and static_shape(n) is None for n in nodes)
    try:
        (array,) = evaluate([value], {}, symbolic_fill=_FILLS[0] if symbolic else None)
        if symbolic:
            # Read symbolic dims as two different sizes: a value that depends on them is not a constant.
            (other,) = evaluate([value], {}, symbolic_fill=_FILLS[1])
            if other.shape != array.shape or not np.array_equal(other, array):
                return None
    except (EvaluationError, ValueError, TypeError, IndexError):
        return None
    return array


def scalar(value: ir.Value | None) -> float | None:
    """A one-element constant as a Python float (any shape with one element), else None."""
    array = constant_array(value)
    if array is None or array.size != 1:
        return None
    return float(np.asarray(array, dtype=np.float64).reshape(()))


def int_list(value: ir.Value | None) -> list[int] | None:
    array = constant_array(value)
    if array is None or array.dtype.kind not in "iu":
        return None
    return [int(v) for v in array.reshape(-1)]


def fold_product(factors: list[tuple[ir.Value, Fraction]]) -> np.ndarray | None:
    """The product of constant powers in float64, None when there is none; ValueError when one is not constant."""
    result: np.ndarray | None = None
    for value, exponent in factors:
        array = constant_array(value)
        if array is None:
            raise ValueError(f"cannot fold constant {value.name!r}")
        term = np.power(array.astype(np.float64), float(exponent))
        result = term if result is None else result * term
    return result
