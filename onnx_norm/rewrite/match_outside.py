"""Step 4 of the matcher (match.py): the nodes the fused op replaces, and every matched value something outside
the match reads. The input's own Casts and shape arithmetic stay in the graph, a mean or an inverse std the fused op
also produces becomes its output, anything else makes the match a near-miss."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import is_onnx_domain
from onnx_norm.rewrite import constants, family
from onnx_norm.rewrite.match_state import Layout, fold_product
from onnx_norm.rewrite.reductions import is_float_cast, rank_of, row_mean
from onnx_norm.rewrite.spec import Statistic
from onnx_norm.rewrite.structure import NearMiss, flatten, same_data, strip_casts

#: The most nodes one match may replace: a larger subgraph is reported as a near-miss, not walked further.
_MAX_MATCH_NODES = 96


def _collect_nodes(y: ir.Value, stops: set[ir.Value]) -> list[ir.Node]:
    """Every node on a path from the stop values (the input) up to `y`, not counting constant expressions."""
    nodes: list[ir.Node] = []
    seen_nodes: set[ir.Node] = set()
    folded: list[ir.Value] = []
    stack = [y]
    for value in constants.each_once(stack):
        if value in stops:
            continue
        if constants.is_constant(value):
            if not constants.is_direct_constant(value):
                folded.append(value)
            continue
        node = value.producer()
        if node is None:
            raise NearMiss(f"the subgraph also reads {value.name!r}, which is not the normalised input", value)
        if node not in seen_nodes:
            seen_nodes.add(node)
            nodes.append(node)
            if len(nodes) > _MAX_MATCH_NODES:
                raise NearMiss("subgraph too large")
        stack.extend(v for v in node.inputs if v is not None)
    for value in folded:  # constants that read the norm's own values for their type go with the norm
        for node in constants.type_readers(value, seen_nodes):
            if node not in seen_nodes:
                seen_nodes.add(node)
                nodes.append(node)
    return nodes


def _is_input_cast(node: ir.Node, x: ir.Value) -> bool:
    """A Cast/Identity chain computed from the input alone: kept when something else reads it."""
    current = node
    while True:
        if not (is_float_cast(current) or current.op_type == "Identity"):
            return False
        source = current.inputs[0]
        if source is None:
            return False
        if source is x:
            return True
        producer = source.producer()
        if producer is None:
            return False
        current = producer


def twin_casts(x: ir.Value) -> list[ir.Value]:
    """Other Casts of what `x` is a Cast of, to the same type: the same values under other names (onnxconverter's
    float16 conversion with `keep_io_types` casts an input once per reader)."""
    node = x.producer()
    if node is None or not is_float_cast(node) or node.inputs[0] is None:
        return []
    to = node.attributes["to"].value
    return [
        use.node.outputs[0]
        for use in node.inputs[0].uses()
        if use.node is not node and is_float_cast(use.node) and use.node.attributes["to"].value == to
    ]


def _is_input_shape(node: ir.Node, x: ir.Value, depth: int = 0) -> bool:
    """Shape arithmetic on the input alone (`Shape(x)`, then Gather/Slice/Concat/... of integers): it stays valid
    after the rewrite, so it is kept when something else reads it too (dynamo shares `Shape(x)` widely)."""
    if depth > 8 or not is_onnx_domain(node.domain):
        return False
    if any(v.dtype is None or v.dtype.is_floating_point() for v in node.outputs):
        return False
    if node.op_type == "Shape":
        return node.inputs[0] is x
    for value in node.inputs:
        if value is None or constants.is_constant(value):
            continue
        producer = value.producer()
        if producer is None or not _is_input_shape(producer, x, depth + 1):
            return False
    return True


def _is_inv_std(value: ir.Value, eps_sum: ir.Value) -> bool:
    if value.dtype != ir.DataType.FLOAT:
        return False

    def classify(v: ir.Value) -> str | None:
        return "stat" if v is eps_sum else None

    try:
        factors = flatten(value, classify)
    except NearMiss:
        return False
    if factors.leaves != {"stat": Fraction(-1, 2)}:
        return False
    product = fold_product(factors.constants)
    return product is None or bool(np.all(product == 1))


@dataclasses.dataclass
class Replaced:
    """The nodes the fused op replaces, and what around them stays: the input's Casts that something else reads
    (`kept`, input first), twin Casts of the input's source read by the match (`aliases`), and the statistics the
    graph exposes that the fused op also provides (`mean`, `inv_std`)."""

    nodes: list[ir.Node]
    kept: list[ir.Node]
    aliases: list[ir.Value]
    mean: ir.Value | None = None
    inv_std: ir.Value | None = None


def replaced(
    y: ir.Value, x: ir.Value, statistic: Statistic, layout: Layout, eps_sum: ir.Value, runtime: set[ir.Value]
) -> Replaced:
    """The nodes between the input and `y`, less what must stay because something else reads it; `runtime`: the
    scale and bias the model takes at run time, which the fused op reads like the input."""
    strip_all = strip_casts(statistic.x)
    twins = twin_casts(x)
    nodes = _collect_nodes(y, {x, strip_all, *twins, *runtime})
    if strip_all is not x and any(strip_all in node.inputs for node in nodes):
        raise NearMiss("the subgraph reads the input both before and after a narrowing Cast", x)
    readers = _OutsideReaders(nodes, y, x, statistic, layout, eps_sum)
    readers.settle()
    kept_order = [n for n in nodes if n in readers.kept]
    kept_order.reverse()  # nodes were collected from the output down; the input's Casts come first this way
    return Replaced(
        nodes=[n for n in readers.nodes if n not in readers.kept and n not in readers.shape_kept],
        kept=kept_order,
        aliases=[t for t in twins if any(t in node.inputs for node in nodes)],
        mean=readers.mean,
        inv_std=readers.inv_std,
    )


class _OutsideReaders:
    """Settles every matched value that something outside the match reads: the input's own Casts and shape
    arithmetic stay in the graph, a mean or inverse std becomes an output of the fused op, anything else makes
    the match a near-miss."""

    def __init__(
        self, nodes: list[ir.Node], y: ir.Value, x: ir.Value, statistic: Statistic, layout: Layout, eps_sum: ir.Value
    ) -> None:
        self.nodes = list(nodes)
        self.node_set = set(nodes)
        self.y, self.x, self.statistic, self.layout, self.eps_sum = y, x, statistic, layout, eps_sum
        self.kept: set[ir.Node] = set()
        self.shape_kept: set[ir.Node] = set()
        self.mean: ir.Value | None = None
        self.inv_std: ir.Value | None = None

    def settle(self) -> None:
        changed = True
        while changed:
            changed = False
            for node in list(self.nodes):
                if node in self.kept or node in self.shape_kept:
                    continue
                for output in node.outputs:
                    if output is self.y or output is self.mean or output is self.inv_std:
                        continue
                    outside = [use.node for use in output.uses() if use.node not in self.node_set]
                    if not outside and not output.is_graph_output():
                        continue
                    settled = self._settle(node, output, outside)
                    changed = changed or settled
                    if settled and node not in self.node_set:
                        break  # the node left the match: look at what it reads again

    def _settle(self, node: ir.Node, output: ir.Value, outside: list[ir.Node]) -> bool:
        """Handles one value read from outside; True when the match changed (a node left or joined it)."""
        for keep, kept in ((_is_input_cast, self.kept), (_is_input_shape, self.shape_kept)):
            if keep(node, self.x):
                kept.add(node)
                # What it reads is now read from outside the match too (Mamba's `hidden.to(float32)` twice, the
                # residual reading the second; dynamo sharing `Shape(x)` widely).
                self.node_set.discard(node)
                return True
        if self._is_mean(output):
            self.mean = output
            return False
        joined = self._inv_std(output, outside)
        if joined is not None:
            return joined
        where = "a graph output" if output.is_graph_output() else f"also read by {outside[0].op_type}"
        where += "" if output.is_graph_output() else f" {outside[0].name!r}"
        raise NearMiss(f"intermediate {output.name!r} is {where}", output)

    def _inv_std(self, output: ir.Value, outside: list[ir.Node]) -> bool | None:
        """The inverse std the graph computes from the match (one reader, or a graph output), which the fused op
        provides: whether the match changed, None when `output` is not one."""
        if not self._plain() or self.inv_std is not None:
            return None
        if not output.is_graph_output():
            readers = [n for n in outside if len(n.outputs) == 1 and _is_inv_std(n.outputs[0], self.eps_sum)]
            if len(readers) == len(outside) == 1 and rank_of(readers[0].outputs[0]) == self.layout.rank:
                self.inv_std = readers[0].outputs[0]
                self.nodes.append(readers[0])
                self.node_set.add(readers[0])
                return True
            return None
        if not outside and _is_inv_std(output, self.eps_sum) and rank_of(output) == self.layout.rank:
            self.inv_std = output
            return False
        return None

    def _plain(self) -> bool:
        return self.layout.rank is not None and self.layout.perm is None

    def _is_mean(self, output: ir.Value) -> bool:
        """The graph's mean of the input, which a family whose op returns a mean provides (float32, kept dims)."""
        if not self._plain() or self.mean is not None or "mean" not in family.get(self.statistic.kind).outputs:
            return False
        if output.dtype != ir.DataType.FLOAT or rank_of(output) != self.layout.rank:
            return False
        found = row_mean(output)
        return (
            found is not None
            and not found.squared
            and same_data(found.input, self.statistic.x)
            and found.axes == self.layout.from_end
        )
