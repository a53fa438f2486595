"""No silent miss: every reduction that looks like a norm's statistic is either fused or reported.

A `ReduceMean`/`ReduceSum`/`ReduceSumSquare`/`GlobalAveragePool` of a square (or of a centred value) whose result
reaches a square root, a reciprocal or a divisor is what a norm's statistic looks like. After the rewrite, each
such reduction still in the graph must be explained: either a near-miss was reported at a node below it (the
matcher found the norm and said why it did not fuse it), or it gets a near-miss of its own here, with the most
specific reason that can be read off the reduction (axes computed at run time, rank unknown, dims not static),
else that no norm ending below it was recognised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import onnx_ir as ir

from onnx_norm.dtypes import is_onnx_domain
from onnx_norm.ops.schema import DOMAIN
from onnx_norm.rewrite import constants
from onnx_norm.rewrite.reductions import REDUCTIONS, rank_of, reduction_axes
from onnx_norm.rewrite.structure import NearMiss, centred, squared

#: Ops a statistic passes through on its way to the square root (epsilon, casts, layout, clamps, scaling).
_ON_THE_WAY = frozenset(
    {"Add", "Sub", "Mul", "Div", "Cast", "Identity", "Unsqueeze", "Reshape", "Expand", "Max", "Clip", "Relu"}
)
_DEPTH = 8
_REPORTED_DEPTH = 24


def _is_statistic_like(node: ir.Node) -> bool:
    if node.op_type not in REDUCTIONS or not is_onnx_domain(node.domain) or not node.inputs:
        return False
    source = node.inputs[0]
    if source is None:
        return False
    return node.op_type == "ReduceSumSquare" or squared(source) is not None or centred(source) is not None


def _search_readers(
    values: Iterable[ir.Value], max_depth: int, found: Callable[[ir.Usage], bool], follow: Callable[[ir.Node], bool]
) -> bool:
    """True when some use of `values`, or of what the readers `follow` accepts compute (at most `max_depth` ops
    down), is `found`."""
    frontier = [(v, 0) for v in values]
    seen: set[ir.Value] = set()
    while frontier:
        current, depth = frontier.pop()
        if current in seen or depth > max_depth:
            continue
        seen.add(current)
        for use in current.uses():
            if found(use):
                return True
            if follow(use.node):
                frontier.extend((out, depth + 1) for out in use.node.outputs)
    return False


def _is_rsqrt_use(use: ir.Usage) -> bool:
    """A Sqrt, a Reciprocal, a negative Pow of the value, or a Div by it."""
    node = use.node
    if not is_onnx_domain(node.domain):
        return False
    op = node.op_type
    if op in ("Sqrt", "Reciprocal") or (op == "Div" and use.idx == 1):
        return True
    if op == "Pow" and use.idx == 0:
        exponent = constants.scalar(node.inputs[1] if len(node.inputs) > 1 else None)
        return exponent is not None and exponent < 0
    return False


def _reaches_rsqrt(value: ir.Value) -> bool:
    """True when `value` reaches a Sqrt, a Reciprocal, a negative Pow or a Div's divisor within a few ops."""
    return _search_readers(
        [value], _DEPTH, _is_rsqrt_use, lambda node: is_onnx_domain(node.domain) and node.op_type in _ON_THE_WAY
    )


def _below(node: ir.Node, targets: set[ir.Node]) -> bool:
    """True when one of `targets` reads, directly or within a few ops, what `node` computes."""
    return _search_readers(node.outputs, _REPORTED_DEPTH, lambda use: use.node in targets, lambda _node: True)


def diagnose(node: ir.Node) -> str:
    """The most specific reason a statistic-like reduction could not be read as a norm's statistic."""
    source = node.inputs[0]
    assert source is not None
    what = f"{node.op_type} of a square feeding a square root or a division"
    rank = rank_of(source)
    if node.op_type != "GlobalAveragePool":
        has_axes_input = len(node.inputs) > 1 and node.inputs[1] is not None
        if has_axes_input and constants.int_list(node.inputs[1]) is None:
            return f"{what}: its axes are computed at run time, not from constants or static shapes"
    if rank is None:
        return f"{what}: the rank of its input {source.name!r} is unknown (shape inference gave up)"
    axes = reduction_axes(node, rank)
    if axes is None:
        return f"{what}: its axes cannot be read"
    dims = [source.shape[rank + a] for a in axes]  # type: ignore[index]
    if not all(isinstance(d, int) for d in dims):
        return f"{what}: the reduced dims {[str(d) for d in dims]} are not static"
    return f"{what}: no norm ending below it was recognised (not input * (statistic + eps)^-1/2 times constants)"


def _nodes(model: ir.Model) -> Iterator[tuple[ir.Node, ir.Graph | ir.Function]]:
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        yield node, node.graph if node.graph is not None else model.graph
    # Our own domain's functions are the bodies of our ops (an already optimized model carries them), not the
    # model's: the driver does not rewrite them either.
    for function in model.functions.values():
        if function.domain == DOMAIN:
            continue
        for node in ir.traversal.RecursiveGraphIterator(function):
            yield node, function


def silent_misses(
    model: ir.Model, reported: Iterable[ir.Node]
) -> list[tuple[ir.Node, ir.Graph | ir.Function, NearMiss]]:
    """Statistic-like reductions left in `model` with no near-miss reported below them, each with a reason."""
    targets = set(reported)
    found = []
    for node, graph in _nodes(model):
        if not _is_statistic_like(node) or not _reaches_rsqrt(node.outputs[0]):
            continue
        if node in targets or _below(node, targets):
            continue
        found.append((node, graph, NearMiss(diagnose(node), node)))
    return found
