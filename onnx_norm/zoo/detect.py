"""Find norms in an ONNX graph by their op types: fused ones (ours, ONNX's, ONNX Runtime's) and decomposed ones
that are still there. A deliberately simple detector, independent of the rewrite's matchers, so that a test
built on it can catch what the matchers miss.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_norm.dtypes import is_onnx_domain
from onnx_norm.model_io import graph_nodes
from onnx_norm.ops.schema import DOMAIN, OPS, native_norm_ops

# Native norm ops by (domain, op_type): the op records' (ops/schema.py).
NATIVE_NORM_OPS = native_norm_ops()
# GlobalAveragePool: tf2onnx's row mean of a rank-3 tensor (it averages every axis after the second).
_REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "GlobalAveragePool"})
# Ops allowed between a reduction and the square root of a decomposed norm (epsilon Add, Casts, the division
# by N after a ReduceSum, the E[x^2] - E[x]^2 form).
_PASS_THROUGH = frozenset({"Add", "Cast", "Div", "Mul", "Sub", "Identity", "Max", "Clip"})
_SEARCH_DEPTH = 4
# Steps that change no value and do not count towards the depth (paddle2onnx writes an Identity after most ops).
_FREE_STEPS = frozenset({"Identity", "Cast"})


def _domain(node: onnx.NodeProto) -> str:
    return "" if is_onnx_domain(node.domain) else node.domain


def model_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """The nodes that run: the main graph with its subgraphs, and the model-local functions other than ours
    (our ops' functions are the decomposed fallback bodies of the fused ops, not leftovers)."""
    yield from graph_nodes(model.graph)
    for function in model.functions:
        if function.domain != DOMAIN:
            yield from function.node


def fused_norms(model: onnx.ModelProto) -> collections.Counter[str]:
    """Our fused ops in the model, by op type."""
    return collections.Counter(n.op_type for n in model_nodes(model) if n.domain == DOMAIN and n.op_type in OPS)


def native_norms(model: onnx.ModelProto) -> collections.Counter[str]:
    """Standard and ONNX Runtime norm ops in the model, by op type (domain-qualified outside ONNX's)."""
    counts: collections.Counter[str] = collections.Counter()
    for node in model_nodes(model):
        key = (_domain(node), node.op_type)
        if key in NATIVE_NORM_OPS:
            counts[node.op_type if not key[0] else f"{key[0]}.{node.op_type}"] += 1
    return counts


def _is_inverse_sqrt(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    if node.op_type in ("Sqrt", "Rsqrt"):
        return True
    if node.op_type == "Pow" and len(node.input) > 1 and node.input[1] in constants:
        exponent = constants[node.input[1]]
        return exponent.size == 1 and float(exponent.reshape(-1)[0]) in (0.5, -0.5)
    return False


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model_nodes(model):
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _successors(
    frontier: list[str], consumers: dict[str, list[onnx.NodeProto]], seen: set[int]
) -> list[onnx.NodeProto]:
    """The unseen consumers of `frontier`, looking through value-preserving steps (which are returned too)."""
    found: list[onnx.NodeProto] = []
    pending = list(frontier)
    while pending:
        for consumer in consumers.get(pending.pop(), []):
            if id(consumer) in seen:
                continue
            seen.add(id(consumer))
            found.append(consumer)
            if consumer.op_type in _FREE_STEPS:
                pending.extend(consumer.output)
    return found


def decomposed_norms(model: onnx.ModelProto) -> list[str]:
    """One name per decomposed norm still in the graph: the first reduction (ReduceMean/ReduceSum, its name or
    output name) whose result reaches a square root (Sqrt, Pow 0.5 or -0.5) within a few element-wise steps.
    Reductions that reach the same square root are one norm (`E[x^2] - E[x]^2` has two)."""
    consumers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
    nodes = list(model_nodes(model))
    for node in nodes:
        for name in node.input:
            consumers[name].append(node)
    constants = _constants(model)
    found: dict[int, str] = {}  # square-root node -> the first reduction reaching it
    for node in nodes:
        if node.op_type not in _REDUCTIONS:
            continue
        frontier, seen = list(node.output), set()
        for _ in range(_SEARCH_DEPTH):
            successors = _successors(frontier, consumers, seen)
            roots = [c for c in successors if _is_inverse_sqrt(c, constants)]
            if roots:
                found.setdefault(id(roots[0]), node.name or node.output[0])
                break
            frontier = [out for c in successors if c.op_type in _PASS_THROUGH for out in c.output]
            if not frontier:
                break
    return list(found.values())
