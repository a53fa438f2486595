"""Ops ONNX Runtime has no float64 kernel for, written out in ops that have one, for the parity gate's float64 model.

The golden model runs such an op in float32 between Casts (parity/golden.py) where nothing better is known. For a
norm that is the wrong answer: the float32 island is the original's own rounding, so the original looks exact there
and a fused norm that rounds no worse looks "less accurate". A norm is a few primitive ops, each with a double
kernel: the family that reads a native norm op registers its expansion here (`register`), as it registers the op's
numpy evaluation for the proof (evaluate.register_op).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_norm.dtypes import is_onnx_domain

__all__ = ["EXPANSIONS", "Expansion", "constant", "expand", "reduce_mean", "register"]

#: expansion(node, unique name prefix, default-domain opset) -> the nodes computing the node's outputs in float64.
Expansion = Callable[[onnx.NodeProto, str, int], list[onnx.NodeProto]]


def constant(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def reduce_mean(data: str, out: str, axes: list[int], prefix: str, opset: int) -> list[onnx.NodeProto]:
    """ReduceMean over `axes`, dims kept (axes an input from opset 18, an attribute before)."""
    if opset >= 18:
        axes_value = constant(f"{prefix}axes", np.array(axes, np.int64))
        return [axes_value, helper.make_node("ReduceMean", [data, axes_value.output[0]], [out], keepdims=1)]
    return [helper.make_node("ReduceMean", [data], [out], axes=axes, keepdims=1)]


#: The registered expansions, by default-domain op type.
EXPANSIONS: dict[str, Expansion] = {}


def register(op_type: str, expansion: Expansion) -> None:
    """Registers the float64 expansion of the default-domain op `op_type` (one per op type)."""
    if op_type in EXPANSIONS and EXPANSIONS[op_type] is not expansion:
        raise ValueError(f"an expansion of {op_type} is already registered")
    EXPANSIONS[op_type] = expansion


def expand(model: onnx.ModelProto, op_type: str, opset: int) -> onnx.ModelProto:
    """A copy of the float64 `model` with every default-domain `op_type` node, in the main graph and in the model's
    functions, replaced by its expansion (EXPANSIONS[op_type])."""
    expansion = EXPANSIONS[op_type]
    patched = onnx.ModelProto()
    patched.CopyFrom(model)
    bodies = [("", patched.graph.node)] + [(f"{i}_", f.node) for i, f in enumerate(patched.functions)]
    for tag, body in bodies:
        nodes: list[onnx.NodeProto] = []
        for index, node in enumerate(body):
            if node.op_type == op_type and is_onnx_domain(node.domain):
                nodes += expansion(node, f"onnx_norm_f64_{op_type}_{tag}{index}_", opset)
            else:
                nodes.append(node)
        del body[:]
        body.extend(nodes)
    return patched
