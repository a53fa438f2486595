"""Segmented verification: both models cut into the same N segments at points of the graph where few tensors are
live, so that `verify` holds one segment's weights at a time (a model larger than the machine can be verified).

The cuts are found in the original's graph, never from layer names: in topological order, after each node, the
values produced so far that a later node still reads (subgraphs' reads of outer values included) are what crosses
that point; a point qualifies when the optimized model computes every crossing value too (by name: the rewrite keeps
the names of the values it does not replace, and the residual stream between two decoder layers is such a value).
The N - 1 points are chosen near equal shares of the weights, the fewest crossing values first.

Each model is then split alike: a segment is the nodes that compute its cut's values from the previous cut's (and
from graph inputs and weights, which every segment reads as it needs them: KV-cache inputs, tied embeddings), plus
every node all of whose inputs that segment has (KV-cache outputs, side outputs), so that a graph output is fetched
where it is made. A plan that the optimized model does not fit (a fused op reading across a cut) is refused with
the reason, and verify runs the whole model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np
import onnx

from onnx_norm import weights
from onnx_norm.model_io import outer_names, subgraphs, topological_nodes


@dataclasses.dataclass
class Segment:
    """One segment of one model: its nodes (in order), the carried values it reads, what it gives (the next cut's
    values and the graph outputs it makes), and the bytes of the weights it reads."""

    nodes: list[onnx.NodeProto]
    carried_in: list[str]
    outputs: list[str]
    weight_bytes: int


@dataclasses.dataclass
class Plan:
    cuts: list[list[str]]  # the values carried across each cut, N - 1 lists
    original: list[Segment]
    optimized: list[Segment]

    @property
    def largest_weights(self) -> int:
        return max(s.weight_bytes for s in [*self.original, *self.optimized])


class PlanError(Exception):
    """The models cannot be cut as asked; the message says why, `cut` which cut (None when not one)."""

    cut: int | None = None


def reads(node: onnx.NodeProto) -> set[str]:
    """Every value a node reads: its inputs and what its subgraphs read from outside."""
    names = {name for name in node.input if name}
    for sub in subgraphs(node):
        names |= outer_names(sub)
    return names


def _crossings(nodes: Sequence[onnx.NodeProto]) -> list[set[str]]:
    """After each node, the values made so far that a later node reads."""
    last_read: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in reads(node):
            last_read[name] = index
    live: set[str] = set()
    crossing = []
    for index, node in enumerate(nodes):
        live |= {name for name in node.output if name and last_read.get(name, -1) > index}
        live = {name for name in live if last_read.get(name, -1) > index}
        crossing.append(set(live))
    return crossing


def _weights_read(nodes: Iterable[onnx.NodeProto], sizes: dict[str, int]) -> int:
    return sum(sizes[name] for name in set().union(*(reads(node) for node in nodes)) if name in sizes)


def _cumulative_weights(nodes: Sequence[onnx.NodeProto], sizes: dict[str, int]) -> list[int]:
    """After each node, the bytes of the weights read so far (each weight once)."""
    seen: set[str] = set()
    cumulative, total = [], 0
    for node in nodes:
        new = (reads(node) & sizes.keys()) - seen
        seen |= new
        total += sum(sizes[name] for name in new)
        cumulative.append(total)
    return cumulative


def _choose_cuts(crossing: Sequence[set[str]], cumulative: Sequence[int], count: int, usable: set[int]) -> list[int]:
    """The node indices (in topological order) after which to cut, among the `usable` points: near equal shares of
    the weights (`cumulative`), the fewest crossing values first."""
    total = cumulative[-1] if cumulative else 0
    cuts: list[int] = []
    for share in range(1, count):
        target, window = total * share / count, max(total / (2 * count), 1)
        near = [i for i in sorted(usable) if abs(cumulative[i] - target) <= window and (not cuts or i > cuts[-1])]
        if not near:
            raise PlanError(f"no point near {share}/{count} of the weights where the two models can be cut")
        cuts.append(min(near, key=lambda i: (len(crossing[i]), abs(cumulative[i] - target))))
    return cuts


def _slices(nodes: Sequence[onnx.NodeProto], points: Sequence[int]) -> dict[str, int]:
    """The segment of each value the original's nodes make, cut after the nodes at `points` (topological order)."""
    where: dict[str, int] = {}
    segment = 0
    for index, node in enumerate(nodes):
        for name in node.output:
            if name:
                where[name] = segment
        if segment < len(points) and index == points[segment]:
            segment += 1
    return where


def _split(model: onnx.ModelProto, cuts: Sequence[list[str]], home: dict[str, int]) -> list[Segment]:
    """`model` cut at `cuts` (the values carried across each): a node runs in the segment where the original makes
    the values it makes (`home`: the rewrite keeps the names of what it does not replace), a node of the rewrite's
    own in the latest segment of what it reads. PlanError (with `cut` where one is at fault) when a node would make
    values of two segments (a fused op across a cut) or reads a value its segment does not have."""
    graph = model.graph
    nodes = topological_nodes(graph.node)
    given = {value.name for value in graph.input} | {init.name for init in graph.initializer} | {""}
    made_in: dict[str, int] = {}
    owner: dict[int, int] = {}
    for node in nodes:
        homes = {home[name] for name in node.output if name in home}
        if len(homes) > 1:
            raise _at_cut(f"{node.name or node.op_type} makes values on both sides of a cut", min(homes))
        reads_in = [made_in[name] for name in reads(node) - given if name in made_in]
        segment = homes.pop() if homes else max(reads_in, default=0)
        for name in reads(node) - given:
            source = made_in.get(name)
            carried = source is not None and source + 1 == segment and name in cuts[source]
            if source is None or (source != segment and not carried):
                raise _at_cut(f"{node.name or node.op_type} reads {name} across a cut", source)
        owner[id(node)] = segment
        made_in.update((name, segment) for name in node.output if name)
    bounds = [set(), *map(set, cuts)]
    sizes = {init.name: weights.tensor_bytes(init) for init in graph.initializer}
    return [_segment(graph, nodes, (owner, sizes), index, bounds, cuts) for index in range(len(bounds))]


def _at_cut(message: str, cut: int | None) -> PlanError:
    error = PlanError(message)
    error.cut = cut
    return error


def _segment(
    graph: onnx.GraphProto,
    nodes: Sequence[onnx.NodeProto],
    placed: tuple[dict[int, int], dict[str, int]],
    index: int,
    bounds: Sequence[set[str]],
    cuts: Sequence[list[str]],
) -> Segment:
    owner, sizes = placed  # the segment of each node, the bytes of each weight
    order = [node for node in nodes if owner.get(id(node)) == index]
    made = {name for node in order for name in node.output if name}
    read = set().union(*(reads(node) for node in order)) if order else set()
    outputs = [v.name for v in graph.output if v.name in made]
    outputs += list(cuts[index]) if index < len(cuts) else []
    return Segment(order, sorted(bounds[index] & read), list(dict.fromkeys(outputs)), _weights_read(order, sizes))


def plan(original: onnx.ModelProto, optimized: onnx.ModelProto, count: int) -> Plan:
    """The two models cut into `count` segments at the same values; PlanError saying why they cannot be. A point
    where the optimized model cannot be cut (a fused op that makes a crossing value and one read after it) is left
    out and the next best one tried."""
    if count < 2:
        raise PlanError("a plan needs at least two segments")
    optimized_values = {name for node in optimized.graph.node for name in node.output if name}
    nodes = topological_nodes(original.graph.node)
    crossing = _crossings(nodes)
    cumulative = _cumulative_weights(nodes, {i.name: weights.tensor_bytes(i) for i in original.graph.initializer})
    usable = {i for i in range(len(nodes) - 1) if crossing[i] and crossing[i] <= optimized_values}
    # Each failed try leaves one point out, so as many tries as points: a fixed count (64) ran out on an 89-layer
    # LLaMA, whose fused Skip ops make most points inside a layer unusable, before the layer boundaries were tried.
    for _ in range(len(usable) + 1):
        points = _choose_cuts(crossing, cumulative, count, usable)
        cuts = [sorted(crossing[i]) for i in points]
        home = _slices(nodes, points)
        try:
            return Plan(cuts, _split(original, cuts, home), _split(optimized, cuts, home))
        except PlanError as err:
            if err.cut is None or err.cut >= len(points):
                raise
            usable.discard(points[err.cut])
    raise PlanError(f"no {count - 1} points found where both models can be cut")


def segment_model(
    model: onnx.ModelProto, segment: Segment, carried: dict[str, np.ndarray], fetch: Sequence[str]
) -> onnx.ModelProto:
    """A runnable model of one segment: its nodes, the graph inputs and weights it reads, the carried values as
    inputs (typed from the arrays carried), `fetch` as outputs; functions and opsets as the model's."""
    graph = model.graph
    read = set().union(*(reads(node) for node in segment.nodes)) if segment.nodes else set()
    declared = {v.name: v for v in [*graph.input, *graph.value_info, *graph.output]}
    inputs = [value for value in graph.input if value.name in read and value.name not in carried]
    initializers = {init.name for init in graph.initializer}
    inputs = [value for value in inputs if value.name not in initializers]
    for name in segment.carried_in:
        array = carried[name]
        elem = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
        inputs.append(onnx.helper.make_tensor_value_info(name, elem, list(array.shape)))
    outputs = [declared[name] if name in declared else onnx.ValueInfoProto(name=name) for name in fetch]
    sub = onnx.helper.make_graph(
        segment.nodes, f"{graph.name}_segment", inputs, outputs, [i for i in graph.initializer if i.name in read]
    )
    sub.value_info.extend(v for v in graph.value_info if v.name in read or v.name in fetch)
    result = onnx.helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    result.functions.extend(model.functions)
    return result
