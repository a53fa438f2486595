"""What a rewrite did: the norms fused, the near-misses and why, counts per rule and op counts."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import onnx_ir as ir

from onnx_norm.dtypes import is_onnx_domain


@dataclasses.dataclass
class NormRecord:
    """One fused norm."""

    rule: str
    kind: str  # "layer" or "rms"
    target: str
    replaced_nodes: list[str]  # names of the nodes the fused op replaced
    new_nodes: list[str]  # op types of the nodes that replaced them
    graph: str  # "main graph", "function <domain>::<name>" or "subgraph <name>"
    dtype: str  # element type of the input
    epsilon: float
    axes: list[int]  # normalised axes of the input (non-negative)
    cast_placement: str
    residual: bool  # a residual Add was fused (Skip variant)
    residual_sum_kept: bool  # the sum is also an output of the fused op
    statistics: list[str]  # statistics the graph used and the fused op provides ("mean", "inv_std")
    variant: str
    attributes: dict[str, Any]


@dataclasses.dataclass
class NearMissRecord:
    """A subgraph that looks like a norm and was left as it was."""

    nodes: list[str]
    reason: str
    graph: str
    # The exception's type when onnx-norm failed on this subgraph (a bug to report, not something the graph does);
    # empty for a near-miss the graph causes.
    error: str = ""


@dataclasses.dataclass
class OptimizeReport:
    target: str
    norms: list[NormRecord] = dataclasses.field(default_factory=list)
    near_misses: list[NearMissRecord] = dataclasses.field(default_factory=list)
    rule_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    ops_before: dict[str, int] = dataclasses.field(default_factory=dict)
    ops_after: dict[str, int] = dataclasses.field(default_factory=dict)
    native_taken_over: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    dry_run: bool = False
    #: {"from": A, "to": N} when the default opset was raised before the rewrite (`opset=`), else None.
    opset_raised: dict[str, int] | None = None

    @property
    def fused(self) -> int:
        return len(self.norms)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (the `--report` file)."""
        data = dataclasses.asdict(self)
        data["fused"] = self.fused
        return data


def op_counts(model: ir.Model) -> dict[str, int]:
    """Op types in the model (main graph, subgraphs and model-local functions), as `domain::op` outside ONNX."""
    from onnx_norm.ops.schema import DOMAIN

    counts: collections.Counter[str] = collections.Counter()
    # The bodies of our ops' model-local functions are their implementation, not part of the model's ops.
    graphs: list[ir.Graph | ir.Function] = [model.graph, *(f for f in model.functions.values() if f.domain != DOMAIN)]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            name = node.op_type if is_onnx_domain(node.domain) else f"{node.domain}::{node.op_type}"
            counts[name] += 1
    return dict(sorted(counts.items()))
