"""Mapping the fused norms of an optimized model back to the values of the original they replaced, so that a
parity failure can name the first norm whose inputs still agree but whose output does not."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable

import onnx

from onnx_norm.ops.schema import DOMAIN, OPS
from onnx_norm.rewrite.targets import RULE_METADATA_KEY as RULE_KEY  # the key the rewrite tags its nodes with


@dataclasses.dataclass
class FusedNorm:
    """A fused norm node of the optimized model and the original values its output and inputs correspond to."""

    node: str
    op_type: str
    rule: str
    y: str
    original_y: str | None
    inputs: list[tuple[str, str | None]]  # (optimized name, original name) for X and Skip


def _metadata(node: onnx.NodeProto) -> dict[str, str]:
    return {prop.key: prop.value for prop in getattr(node, "metadata_props", ())}


class _ValueMap:
    """Finds the value of the original model that a value of the optimized model stands for."""

    def __init__(self, original: onnx.ModelProto, optimized: onnx.ModelProto) -> None:
        self.values = {name for node in original.graph.node for name in node.output if name}
        self.values |= {value.name for value in original.graph.input}
        self.nodes = {node.name: node for node in original.graph.node if node.name}
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        for node in optimized.graph.node:
            for index, name in enumerate(node.input):
                self.consumers.setdefault(name, []).append((node, index))
        self.original_outputs = [value.name for value in original.graph.output]
        # An op the rewrite re-created (the residual Add a Skip rule keeps before a standard norm op, renamed): the
        # original's node of the same type on the same inputs (in any order: Add and Mul commute).
        self.twins = {(n.op_type, tuple(sorted(n.input))): list(n.output) for n in original.graph.node}
        self.producers = {name: node for node in optimized.graph.node for name in node.output}
        self.output_index = {value.name: i for i, value in enumerate(optimized.graph.output)}

    def __call__(self, name: str) -> str | None:
        if name in self.values:
            return name
        index = self.output_index.get(name)
        if index is not None and index < len(self.original_outputs):
            return self.original_outputs[index]
        # Untouched consumers keep their node names: the value they read in the original is the one replaced.
        for consumer, position in self.consumers.get(name, ()):
            twin = self.nodes.get(consumer.name)
            if twin is not None and twin.op_type == consumer.op_type and position < len(twin.input):
                return twin.input[position]
        producer = self.producers.get(name)
        if (
            producer is not None
            and producer.op_type in ("Add", "Mul")
            and all(i in self.values for i in producer.input)
        ):
            outputs = self.twins.get((producer.op_type, tuple(sorted(producer.input))), [])
            index = list(producer.output).index(name)
            return outputs[index] if index < len(outputs) else None
        return None


def _data_inputs(node: onnx.NodeProto) -> list[str]:
    """X (and Skip) of a fused norm: the required inputs of our ops' signatures. A native op that a target emits
    (ONNX's or ONNX Runtime's norm) takes X first, and Skip second in its Skip variants."""
    signature = OPS.get(node.op_type) if node.domain == DOMAIN else None
    if signature is not None:
        required = [i for i, name in enumerate(signature.inputs) if name not in signature.optional_inputs]
        return [node.input[i] for i in required if i < len(node.input)]
    return list(node.input[: 2 if node.op_type.startswith("Skip") else 1])


def _y_index(node: onnx.NodeProto) -> int:
    signature = OPS.get(node.op_type) if node.domain == DOMAIN else None
    return signature.outputs.index("Y") if signature is not None else 0


def _is_cast(node: onnx.NodeProto) -> bool:
    return node.op_type == "Cast" and node.domain in ("", "ai.onnx")


def _narrowing_casts(tagged: list[onnx.NodeProto]) -> dict[str, str]:
    """{an op's output: the output of the tagged Cast that narrows it back}: a standard norm op run in float32 on a
    widened fp16 X (`--target onnx`) is followed by a Cast to the original's type, whose output is the value the
    original computed; the op's own output has no twin in the original."""
    produced_by_op = {name for node in tagged if not _is_cast(node) for name in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in tagged:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    # A Cast whose output a tagged node reads widens the next op's X: not this op's result narrowed back.
    return {
        name: nodes[0].output[0]
        for name, nodes in readers.items()
        if name in produced_by_op and len(nodes) == 1 and _is_cast(nodes[0]) and nodes[0].output[0] not in readers
    }


def find_fused_norms(original: onnx.ModelProto, optimized: onnx.ModelProto) -> list[FusedNorm]:
    """Fused norm nodes of `optimized` (tagged `onnx_norm.rule`, or any norm op in our domain), in graph order, with
    the names of the corresponding values in `original`."""
    map_value = _ValueMap(original, optimized)
    norms: list[FusedNorm] = []
    mapped_y: dict[str, str | None] = {}
    tagged = [n for n in optimized.graph.node if RULE_KEY in _metadata(n) or (n.domain == DOMAIN and n.op_type in OPS)]
    read_by_tagged = {name for node in tagged for name in node.input}
    narrowing = _narrowing_casts(tagged)
    for node in tagged:
        meta = _metadata(node)
        if _is_cast(node) and node.output[0] in read_by_tagged:
            # A Cast the rewrite put in front of the op (X widened to fp32, exactly) is no norm: its output
            # stands for the value it casts, so that the op's X still maps to the original's.
            mapped_y[node.output[0]] = mapped_y.get(node.input[0]) or map_value(node.input[0])
            continue
        if _is_cast(node) and node.input[0] in narrowing:
            continue  # the op's result narrowed back to the original's type: the op's Y is this Cast's output
        y = node.output[_y_index(node)]
        y = narrowing.get(y, y)
        original_y = mapped_y[y] = map_value(y)
        inputs = [(name, mapped_y.get(name) or map_value(name)) for name in _data_inputs(node) if name]
        norms.append(FusedNorm(node.name or y, node.op_type, meta.get(RULE_KEY, ""), y, original_y, inputs))
    return norms


def with_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of `model` that also outputs the values `names` (a fused norm's output and inputs)."""
    exposed = copy.deepcopy(model)
    present = {value.name for value in exposed.graph.output}
    for name in names:
        if name not in present:
            # ONNX Runtime infers the type of an output declared by name only.
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return exposed
