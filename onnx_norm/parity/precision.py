"""The narrowest floating-point type each output of a model is computed in: the type whose tolerance and ulp apply
to it. A float16 model whose last op casts to float32 gives a float32 output that is only as exact as float16; a
float32 model that holds float16 weights and casts them up at once computes in float32.

Read from the graph's declarations, never from tensor data (external data stays unread): walking back from an
output, a value counts when a node computes in its type, which is
- the `to` of a Cast (a narrowing Cast is where the precision is lost),
- a declared type (value_info, graph inputs and outputs) of a value that a node other than a Cast produces,
- the type of an initializer, Constant or graph input that a node other than a Cast or a shape op consumes (ONNX's
  arithmetic ops take their inputs in their output's type), and
- anything of those inside the subgraphs of a node on the path (If, Loop, Scan bodies).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from onnx_norm.dtypes import BY_PRECISION as _FLOATS
from onnx_norm.model_io import outer_names, subgraphs
from onnx_norm.ops.reference import np_dtype

#: Ops whose float inputs are not computed on (only their shape or a count is read).
_SHAPE_OPS = frozenset({"Shape", "Size", "EyeLike", "ConstantOfShape"})


def _declared(graph: onnx.GraphProto) -> dict[str, int]:
    values = [*graph.input, *graph.output, *graph.value_info]
    types = {value.name: value.type.tensor_type.elem_type for value in values if value.type.HasField("tensor_type")}
    types.update({init.name: init.data_type for init in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    types[node.output[0]] = attr.t.data_type
    return types


def _node_types(node: onnx.NodeProto, declared: dict[str, int], producers: dict[str, onnx.NodeProto]) -> set[int]:
    """The element types `node` computes in, as far as the declarations tell."""
    if node.op_type == "Cast":
        return {attr.i for attr in node.attribute if attr.name == "to"}
    if node.op_type == "Constant":
        return set()  # its type counts where a node computes on it (below), not where a Cast widens it
    found = {declared[name] for name in node.output if name in declared}
    if node.op_type not in _SHAPE_OPS:
        # An input no node produces (an initializer, a graph input) or a Constant: its type is this node's.
        constant = {name for name in node.input if name in producers and producers[name].op_type == "Constant"}
        sources = [name for name in node.input if name and (name not in producers or name in constant)]
        found |= {declared[name] for name in sources if name in declared}
    for graph in subgraphs(node):
        found |= _graph_types(graph)
    return found


def _graph_types(graph: onnx.GraphProto) -> set[int]:
    """Every type a subgraph computes in (all of its nodes are on the path of the node that holds it)."""
    declared = _declared(graph)
    producers = {name: node for node in graph.node for name in node.output}
    found: set[int] = set()
    for node in graph.node:
        found |= _node_types(node, declared, producers)
    return found


def narrowest_on_path(model: onnx.ModelProto, outputs: Sequence[str]) -> dict[str, np.dtype | None]:
    """For each output, the narrowest float type on its path (None when the path declares none)."""
    graph = model.graph
    declared = _declared(graph)
    producers = {name: node for node in graph.node for name in node.output}
    result: dict[str, np.dtype | None] = {}
    for output in outputs:
        seen: set[int] = set()
        types: set[int] = {declared[output]} if output in declared else set()
        frontier = [output]
        while frontier:
            node = producers.get(frontier.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            types |= _node_types(node, declared, producers)
            frontier.extend(name for name in node.input if name)
            for sub in subgraphs(node):
                frontier.extend(outer_names(sub))
        floats = [code for code in _FLOATS if code in types]
        result[output] = np_dtype(floats[-1]) if floats else None
    return result


def narrower(path_type: np.dtype | None, own: np.dtype) -> np.dtype | None:
    """`path_type` when it is a float type narrower than the output's own `own` type, else None."""
    order = [np_dtype(code) for code in _FLOATS]
    if path_type is None or own not in order or path_type not in order:
        return None
    return path_type if order.index(path_type) > order.index(own) else None
