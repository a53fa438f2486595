"""The norm fusions as onnxscript rewrite rules.

Each rule is an onnxscript `RewriteRule` whose matching is structural (match.py) rather than one fixed pattern:
the variety of exported spellings is too large to enumerate, so a rule recognises the structure from the norm's
last node, proves the candidate (prove.py) and builds the replacement with the target's emitter (targets.py).
The onnxscript driver does the rest: it visits every node of the graph, of If/Loop bodies and of model-local
functions, replaces the matched nodes, updates opset imports and tags each new node with the rule's name in
`metadata_props` (`pkg.onnxscript.rewriter.rule_name`).

Rules, tried in this order at each node:

- `skip_layer_norm`, `skip_rms_norm`: a norm whose input is a residual Add, fused with it.
- `layer_norm_channels_first`: LayerNorm over a non-trailing axis (ConvNeXt's NCHW), emitted between Transposes.
- `layer_norm`, `rms_norm`: everything else.

Disabling a Skip rule leaves the residual Add in the graph and fuses the norm alone.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._context import TapeBuilder
from onnxscript.rewriter._rewrite_rule import ReplacementSubgraph

from onnx_norm.ops.schema import DOMAIN
from onnx_norm.rewrite import targets
from onnx_norm.rewrite.match import ANCHOR_OPS, Candidate, find_norm
from onnx_norm.rewrite.prove import prove
from onnx_norm.rewrite.report import NearMissRecord, NormRecord
from onnx_norm.rewrite.skip import fold_residual
from onnx_norm.rewrite.spec import TARGETS
from onnx_norm.rewrite.structure import NearMiss

logger = logging.getLogger(__name__)

#: Seconds between progress lines (INFO) while matching.
PROGRESS_SECONDS = 10.0

RULE_NAMES = ("skip_layer_norm", "skip_rms_norm", "layer_norm_channels_first", "layer_norm", "rms_norm")
_RULE_KINDS = {
    "skip_layer_norm": "layer",
    "skip_rms_norm": "rms",
    "layer_norm_channels_first": "layer",
    "layer_norm": "layer",
    "rms_norm": "rms",
}


def _placeholder_pattern(op, x):  # the structural matcher replaces onnxscript's pattern matching
    return op.Identity(x)


def graph_label(graph: ir.Graph | ir.Function) -> str:
    if isinstance(graph, ir.Function):
        return f"function {graph.domain}::{graph.name}"
    return f"graph {graph.name!r}" if graph.name else "graph"


class Session:
    """State shared by the rules of one rule set: target, options, and what happened (records, near-misses)."""

    def __init__(self, target: str = "onnx-norm", *, verify_rewrites: bool = True, disabled: Iterable[str] = ()):
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
        self.target = target
        self.verify_rewrites = verify_rewrites
        self.disabled = frozenset(disabled)
        self.records: list[NormRecord] = []
        self._near_misses: dict[tuple[int, str], tuple[NearMissRecord, ir.Node]] = {}
        self._replaced: set[ir.Node] = set()  # nodes a fused op replaced
        self._last: tuple[ir.Node, Candidate | None] | None = None
        self._proven: dict[tuple, str | None] = {}
        self._main_graph: ir.Graph | None = None
        self._examined = 0
        self._reported = time.perf_counter()

    # -- matching, cached per node: the rules try the same node one after the other
    def candidate(self, node: ir.Node, graph: ir.Graph | ir.Function) -> Candidate | None:
        if self._last is not None and self._last[0] is node:
            return self._last[1]
        self._progress()
        result: Candidate | None = None
        kinds = frozenset(k for name, k in _RULE_KINDS.items() if name not in self.disabled)
        try:
            result = find_norm(node, kinds=kinds, channels_first="layer_norm_channels_first" not in self.disabled)
        except NearMiss as miss:
            self.near_miss(node, graph, miss)
        except Exception as err:  # a graph the matcher does not understand is left as it is, and reported
            logger.warning("matcher failed at %s: %s", node.name, err, exc_info=logger.isEnabledFor(logging.DEBUG))
            self.near_miss(node, graph, NearMiss(f"not analysed ({type(err).__name__}: {err})"))
        self._last = (node, result)
        return result

    def _progress(self) -> None:
        """An INFO line every few seconds while matching: how far it got (a large model takes minutes)."""
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

    def near_miss(self, node: ir.Node, graph: ir.Graph | ir.Function, miss: NearMiss) -> None:
        key = (id(graph), node.name or str(id(node)))
        if key in self._near_misses:
            return
        names = [v.name for v in miss.values if isinstance(v, ir.Node) and v.name]
        names += [v.producer().name for v in miss.values if isinstance(v, ir.Value) and v.producer() is not None]
        nodes = [node.name or node.op_type] + [n for n in names if n and n != node.name]
        record = NearMissRecord(nodes=nodes, reason=miss.reason, graph=graph_label(graph))
        self._near_misses[key] = (record, node)
        logger.info("not fused at %s: %s", node.name, miss.reason)

    def open_near_miss_nodes(self) -> list[ir.Node]:
        return [node for _record, node in self._near_misses.values() if node not in self._replaced]

    def replaced(self, nodes: Iterable[ir.Node]) -> None:
        self._replaced.update(nodes)

    def open_near_misses(self) -> list[NearMissRecord]:
        """Near-misses at nodes that no fused op replaced: a partial product of a norm fused later from a node
        further down (the distributed LayerNorm's `x * s`) is not worth reporting."""
        return [record for record, node in self._near_misses.values() if node not in self._replaced]

    def proven(self, candidate: Candidate) -> str | None:
        """None when the candidate is proven (or proofs are off), else the reason it failed."""
        if not self.verify_rewrites:
            return None
        key = _proof_key(candidate)
        if key not in self._proven:
            try:
                prove(candidate)
                self._proven[key] = None
            except NearMiss as miss:
                self._proven[key] = miss.reason
            except Exception as err:  # an unprovable candidate is never rewritten
                self._proven[key] = f"proof could not run ({type(err).__name__}: {err})"
        return self._proven[key]

    def invalidate(self) -> None:
        self._last = None
        self._proven.clear()


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
    layout = (candidate.perm, None if candidate.proof_shape is None else tuple(candidate.proof_shape))
    return (tuple(candidate.nodes), spec.kind, values, spec.attrs, layout, made)


def _after(graph: ir.Graph | ir.Function, anchor: ir.Node, readers: Iterable[ir.Node]) -> bool:
    """True when every reader comes after the anchor in the graph's node order (new nodes go right after it)."""
    pending = set(readers)
    if not pending:
        return True
    seen_anchor = False
    for node in graph:
        if node is anchor:
            seen_anchor = True
        elif node in pending:
            if not seen_anchor:
                return False
            pending.discard(node)
            if not pending:
                return True
    return not pending


def _outside_readers(value: ir.Value | None, nodes: set[ir.Node]) -> list[ir.Node]:
    if value is None:
        return []
    return [use.node for use in value.uses() if use.node not in nodes]


def _removal_problem(nodes: list[ir.Node], replaced: list[ir.Value]) -> str | None:
    """Why the matched nodes cannot be removed once `replaced` is rewired to the fused op's outputs (a value the
    rest of the graph still reads), or None. The matcher should never produce such a candidate; this check keeps
    a matcher mistake from leaving the graph half rewritten."""
    node_set = set(nodes)
    kept_values = set(replaced)
    for node in nodes:
        for output in node.outputs:
            if output in kept_values:
                continue
            if output.is_graph_output():
                return f"{output.name!r} is a graph output"
            outside = [use.node for use in output.uses() if use.node not in node_set]
            if outside:
                return f"{output.name!r} is also read by {outside[0].op_type} {outside[0].name!r}"
    return None


class NormFusionRule(pattern.RewriteRule):
    """One rule family; the structural matching is shared through the session."""

    def __init__(self, name: str, session: Session) -> None:
        super().__init__(_placeholder_pattern, lambda op, x: None, name=name)
        self.session = session
        self.kind = _RULE_KINDS[name]
        self.residual = name.startswith("skip_")
        self.channels_first = name == "layer_norm_channels_first"

    def commute(self) -> list[pattern.RewriteRule]:  # operand order is handled by the matcher
        return [self]

    def _select(self, node: ir.Node, graph: ir.Graph | ir.Function) -> Candidate | None:
        session = self.session
        candidate = session.candidate(node, graph)
        if candidate is None or candidate.spec.kind != self.kind:
            return None
        if (candidate.perm is not None) != self.channels_first:
            return None
        opsets = dict(graph.opset_imports)
        if self.residual:
            folded = fold_residual(candidate)
            if folded is None:
                return None
            if targets.unsupported_reason(folded.spec, session.target, opsets) is not None:
                return None
            node_set = set(folded.nodes)
            readers = _outside_readers(folded.spec.sum, node_set)
            for recast in folded.recast:
                readers += _outside_readers(recast.outputs[0], node_set)
            if not _after(graph, node, readers):
                return None
            if session.proven(folded) is not None:
                return None  # the plain rule proves (and reports) the norm without the residual
            candidate = folded
        else:
            reason = targets.unsupported_reason(candidate.spec, session.target, opsets)
            if reason is not None:
                session.near_miss(node, graph, NearMiss(f"target {session.target}: {reason}"))
                return None
            node_set = set(candidate.nodes)
            readers = _outside_readers(candidate.spec.mean, node_set) + _outside_readers(
                candidate.spec.inv_std, node_set
            )
            if not _after(graph, node, readers):
                session.near_miss(node, graph, NearMiss("a statistic of the norm is read before the norm ends"))
                return None
            failure = session.proven(candidate)
            if failure is not None:
                session.near_miss(node, graph, NearMiss(failure))
                return None
        return candidate

    def try_rewrite(
        self,
        model: ir.Model,
        graph_or_function: ir.Graph | ir.Function,
        node: ir.Node,
        *,
        verbose: int | None = None,
        tracer=None,
    ) -> ReplacementSubgraph | None:
        if node.op_type not in ANCHOR_OPS or node.domain not in ("", "ai.onnx"):
            return None
        if isinstance(graph_or_function, ir.Function) and graph_or_function.domain == DOMAIN:
            return None  # the body of one of our ops' model-local functions: fusing it would make it call itself
        try:
            return self._rewrite(model, graph_or_function, node)
        except Exception as err:  # a match that cannot be applied is skipped and reported, never fatal
            logger.warning("not fused at %s: %s", node.name, err, exc_info=logger.isEnabledFor(logging.DEBUG))
            self.session.near_miss(node, graph_or_function, NearMiss(f"not applied ({type(err).__name__}: {err})"))
            return None

    def _rewrite(
        self, model: ir.Model, graph_or_function: ir.Graph | ir.Function, node: ir.Node
    ) -> ReplacementSubgraph | None:
        candidate = self._select(node, graph_or_function)
        if candidate is None:
            return None
        spec = dataclasses.replace(candidate.spec, rule=self.name)
        tape = TapeBuilder()
        opset = graph_or_function.opset_imports.get("", model.graph.opset_imports.get("", 17))
        try:
            outputs = self._emit(tape, candidate, spec, opset, graph_or_function)
        except ValueError as err:  # the target cannot express this norm exactly
            self.session.near_miss(node, graph_or_function, NearMiss(f"target {self.session.target}: {err}"))
            return None
        old_values = [v for v in (spec.y, spec.sum, spec.mean, spec.inv_std) if v is not None]
        old_values += [n.outputs[0] for n in candidate.recast]
        problem = _removal_problem(candidate.nodes, old_values)
        if problem is not None:
            self.session.near_miss(node, graph_or_function, NearMiss(f"not applied: {problem}"))
            return None
        match = pattern.MatchResult()
        for matched in candidate.nodes:
            match.add_node(matched)
        match.outputs.extend(old_values)
        delta = ReplacementSubgraph(match, outputs, tape.nodes, tape.initializers, tape.used_opsets)
        for graph in (graph_or_function, model.graph):
            for domain, version in tape.used_opsets:
                if domain not in graph.opset_imports:
                    graph.opset_imports[domain] = version if version is not None else 1
        self._record(candidate, spec, graph_or_function, tape.nodes)
        self.session.replaced(candidate.nodes)
        self.session.invalidate()
        return delta

    def _emit(
        self, tape: TapeBuilder, candidate: Candidate, spec, opset: int, graph: ir.Graph | ir.Function
    ) -> list[ir.Value]:
        in_function = isinstance(graph, ir.Function)
        replacements = {}
        for key, array in candidate.new_constants.items():
            tensor = ir.tensor(array)
            if in_function:
                replacements[key] = tape.Constant(value=tensor)
            else:
                name = f"onnx_norm_{key}_{_unique_suffix()}"
                while name in graph.initializers:  # a model optimised before already has this name
                    name = f"onnx_norm_{key}_{_unique_suffix()}"
                tensor.name = name
                replacements[key] = tape.initializer(tensor, name=name)
        spec = dataclasses.replace(
            spec, scale=replacements.get("scale", spec.scale), bias=replacements.get("bias", spec.bias)
        )
        if candidate.perm is None:
            results = targets.emit(tape, spec, self.session.target, opset)
            if candidate.recast:
                made = {spec.sum: results[1]}
                for node in candidate.recast:
                    source = made[node.inputs[0]]
                    if node.op_type == "Cast":
                        new = tape.Cast(source, to=node.attributes["to"].value)
                    else:
                        new = tape.Identity(source)
                    made[node.outputs[0]] = new
                    results.append(new)
            return results
        perm = list(candidate.perm)
        inverse = [int(i) for i in np.argsort(perm)]
        x_t = tape.Transpose(spec.x, perm=perm)
        skip_t = None if spec.skip is None else tape.Transpose(spec.skip, perm=perm)
        if spec.x.dtype is not None:
            x_t.type = ir.TensorType(spec.x.dtype)
        y_t_spec = ir.Value(name=None, type=spec.y.type)
        transposed = dataclasses.replace(spec, x=x_t, skip=skip_t, y=y_t_spec)
        results = targets.emit(tape, transposed, self.session.target, opset)
        return [tape.Transpose(results[0], perm=inverse), *results[1:]]

    def _record(self, candidate: Candidate, spec, graph: ir.Graph | ir.Function, new_nodes) -> None:
        attrs = spec.attrs
        self.session.records.append(
            NormRecord(
                rule=self.name,
                kind=spec.kind,
                target=self.session.target,
                replaced_nodes=[n.name or n.op_type for n in candidate.nodes],
                new_nodes=[n.op_type for n in new_nodes],
                graph=graph_label(graph),
                dtype=_type_name(candidate.x_value.dtype),
                epsilon=float(attrs.epsilon),
                axes=list(candidate.axes),
                cast_placement=candidate.cast_placement,
                residual=spec.skip is not None,
                residual_sum_kept=spec.sum is not None,
                statistics=[k for k in ("mean", "inv_std") if getattr(spec, k) is not None],
                variant=candidate.variant,
                attributes=attrs.as_dict(),
            )
        )


_counter = [0]


def _unique_suffix() -> int:
    _counter[0] += 1
    return _counter[0]


def _type_name(dtype: ir.DataType | None) -> str:
    from onnx_norm.rewrite.casts import type_name

    return type_name(dtype)


def make_rules(session: Session) -> list[NormFusionRule]:
    unknown = sorted(set(session.disabled) - set(RULE_NAMES))
    if unknown:
        raise ValueError(f"unknown rule(s) {', '.join(unknown)}; the rules are {', '.join(RULE_NAMES)}")
    return [NormFusionRule(name, session) for name in RULE_NAMES if name not in session.disabled]


def rule_set(
    target: str = "onnx-norm", *, disable: Iterable[str] = (), verify_rewrites: bool = True
) -> pattern.RewriteRuleSet:
    """The fusions as an onnxscript `RewriteRuleSet` (run shape inference on the model first).

    `RewriteRuleSet.apply_to_model(model)` rewrites in place and returns the number of norms fused. Models for the
    `onnx-norm` target also need `onnx_norm.ops.functions.attach_functions(model)` afterwards to stay runnable
    without our library; `FuseNormsPass` does all of it.
    """
    session = Session(target, verify_rewrites=verify_rewrites, disabled=disable)
    rules = make_rules(session)
    if not rules:
        raise ValueError("every rule is disabled")
    rule_set = pattern.RewriteRuleSet(rules)
    rule_set.session = session  # type: ignore[attr-defined]
    return rule_set
