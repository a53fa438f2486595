"""What one run of the rewrite knows and collects: target and options, the norms fused, the near-misses, proofs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import onnx_ir as ir

from onnx_norm.rewrite.match import Candidate
from onnx_norm.rewrite.prove import prove
from onnx_norm.rewrite.report import NearMissRecord, NormRecord
from onnx_norm.rewrite.structure import NearMiss, internal_error
from onnx_norm.rewrite.targets import TARGETS

logger = logging.getLogger(__name__)

#: Seconds between progress lines (INFO) while matching.
PROGRESS_SECONDS = 10.0

GraphLike = ir.Graph | ir.Function


def graph_label(graph: GraphLike) -> str:
    if isinstance(graph, ir.Function):
        return f"function {graph.domain}::{graph.name}"
    return f"graph {graph.name!r}" if graph.name else "graph"


class Session:
    """State of one rewrite run, shared by its rules: target, options, records, near-misses and proofs."""

    def __init__(self, target: str = "onnx-norm", *, verify_rewrites: bool = True, disabled: Iterable[str] = ()):
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
        self.target = target
        self.verify_rewrites = verify_rewrites
        self.disabled = frozenset(disabled)
        self.records: list[NormRecord] = []
        # One near-miss per node of a graph (the graph object itself is the key: ids of freed graphs are reused).
        self._near_misses: dict[tuple[GraphLike, object], tuple[NearMissRecord, ir.Node]] = {}
        self._replaced: set[ir.Node] = set()  # nodes a fused op replaced
        self._proven: dict[tuple, NearMiss | None] = {}
        self._examined = 0
        self._reported = time.perf_counter()

    def progress(self) -> None:
        """Counts an examined node; an INFO line every few seconds (a large model takes minutes)."""
        self._examined += 1
        now = time.perf_counter()
        if now - self._reported >= PROGRESS_SECONDS:
            self._reported = now
            logger.info(
                "matching: %d candidate end node(s) examined, %d norm(s) fused, %d near-miss(es) so far",
                self._examined,
                len(self.records),
                len(self._near_misses),
            )

    def near_miss(self, node: ir.Node, graph: GraphLike, miss: NearMiss) -> None:
        key = (graph, node.name or node)
        if key in self._near_misses:
            return
        names = [v.name for v in miss.values if isinstance(v, ir.Node) and v.name]
        names += [v.producer().name for v in miss.values if isinstance(v, ir.Value) and v.producer() is not None]
        nodes = [node.name or node.op_type] + [n for n in names if n and n != node.name]
        record = NearMissRecord(nodes=nodes, reason=miss.reason, graph=graph_label(graph), error=miss.error)
        self._near_misses[key] = (record, node)
        logger.info("not fused at %s: %s", node.name, miss.reason)

    def replaced(self, nodes: Iterable[ir.Node]) -> None:
        self._replaced.update(nodes)
        self._proven.clear()  # the graph changed: a proof's nodes may be gone

    def open_near_miss_nodes(self) -> list[ir.Node]:
        return [node for _record, node in self._near_misses.values() if node not in self._replaced]

    def open_near_misses(self) -> list[NearMissRecord]:
        """Near-misses at nodes that no fused op replaced: a partial product of a norm fused later from a node
        further down (the distributed LayerNorm's `x * s`) is not worth reporting."""
        return [record for record, node in self._near_misses.values() if node not in self._replaced]

    def proven(self, candidate: Candidate) -> str | None:
        """None when the candidate is proven (or proofs are off), else the reason it failed."""
        failure = self.proof_failure(candidate)
        return None if failure is None else failure.reason

    def proof_failure(self, candidate: Candidate) -> NearMiss | None:
        """None when the candidate is proven (or proofs are off), else the near-miss saying why it is not."""
        if not self.verify_rewrites:
            return None
        key = _proof_key(candidate)
        if key not in self._proven:
            try:
                prove(candidate)
                self._proven[key] = None
            except NearMiss as miss:
                self._proven[key] = miss
            except Exception as err:  # an unprovable candidate is never rewritten
                logger.debug("the proof failed with an exception", exc_info=True)
                self._proven[key] = internal_error("proof could not run", err)
        return self._proven[key]


def _proof_key(candidate: Candidate) -> tuple:
    """What a proof depends on: the nodes, the values the fused op reads and replaces, its attributes, layout and
    new constants. Graph objects stand for themselves (the key holds them, so their identities cannot be reused
    while it lives); constants made for this candidate count by content."""
    spec = candidate.spec
    made = tuple(
        sorted((key, array.dtype.str, array.shape, array.tobytes()) for key, array in candidate.new_constants.items())
    )
    scale = None if "scale" in candidate.new_constants else spec.scale
    bias = None if "bias" in candidate.new_constants else spec.bias
    values = (spec.x, spec.skip, spec.y, spec.sum, spec.mean, spec.inv_std, scale, bias)
    extra = tuple(sorted(spec.extra_inputs.items(), key=lambda item: item[0]))
    layout = (candidate.perm, None if candidate.proof_shape is None else tuple(candidate.proof_shape))
    return (tuple(candidate.nodes), spec.kind, values, extra, spec.attrs, layout, made)
