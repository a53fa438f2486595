"""The driver: one walk over a model that matches, checks and replaces norms, rule by rule.

For each sweep (family.NormFamily.sweep; composites before the norms inside them) it visits, in graph order, every
node of the main graph, of the If/Loop/Scan bodies below it (after the node holding them) and of the model-local
functions (not our own domain's, whose bodies are our ops' definitions). At each node the recognisers run once:
the shared matcher (match.find_norm, for the families with a statistic recogniser) and each family's own `find`
when the node is one of its anchor ops. Each candidate is offered to its family's rules in order; the first rule
that selects it (rules.select: target support, statistics read in order, the proof) rewrites it:

1. the target's lowering emits new nodes with a builder (builder.Builder over onnx-ir's Tape), constants made
   for the candidate becoming initializers (Constant nodes inside functions), Transposes around a channels-first
   norm and kept Casts re-made from a residual sum;
2. the matched nodes must be removable once their outputs are rewired (rules.removal_problem);
3. onnx-ir replaces the nodes and values, the new nodes going right after the anchor; the graph (and the model)
   import the opsets the new nodes use; the emitter tags each norm node with its rule (targets.RULE_METADATA_KEY).

A match that fails at any step is skipped with a near-miss, never fatal: the graph is only changed in step 3.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxscript.optimizer

from onnx_norm.dtypes import is_onnx_domain, onnx_opset, type_name
from onnx_norm.ops.schema import DOMAIN
from onnx_norm.rewrite import family, rules, targets
from onnx_norm.rewrite.builder import Builder
from onnx_norm.rewrite.family import Emitter, FusionRule
from onnx_norm.rewrite.match import Candidate, find_norm
from onnx_norm.rewrite.report import NormRecord
from onnx_norm.rewrite.session import GraphLike, Session, graph_label
from onnx_norm.rewrite.spec import NormSpec
from onnx_norm.rewrite.structure import NearMiss, internal_error

logger = logging.getLogger(__name__)


def fuse(model: ir.Model, session: Session, enabled: list[FusionRule]) -> int:
    """Rewrites every norm the `enabled` rules match, in place; returns how many were fused."""
    sweeps = sorted({family.get(rule.kind).sweep for rule in enabled})
    functions = [f for f in model.functions.values() if f.domain != DOMAIN]
    count = 0
    for sweep in sweeps:
        walk = _Walk(model, session, [r for r in enabled if family.get(r.kind).sweep == sweep])
        # Constant nodes' outputs carry their tensor (const_value), as under onnxscript's driver before: the
        # matchers' constant tests and the values the rewrite rewires see it (onnxscript's public API).
        onnxscript.optimizer.basic_constant_propagation(model.graph)
        count += walk.graph(model.graph)
        for function in functions:
            onnxscript.optimizer.basic_constant_propagation(function)
            count += walk.graph(function)
    if count:
        common_passes.NameFixPass()(model)  # names of new values may clash with existing ones
    return count


class _Walk:
    """One sweep: the rules of its families, tried at every node."""

    def __init__(self, model: ir.Model, session: Session, sweep_rules: list[FusionRule]) -> None:
        self.model = model
        self.session = session
        self.rules = sweep_rules
        kinds = {rule.kind for rule in sweep_rules}
        families = [family.get(kind) for kind in dict.fromkeys(rule.kind for rule in sweep_rules)]
        self.statistic_kinds = frozenset(f.kind for f in families if f.statistic is not None)
        self.finders = [f for f in families if f.find is not None and f.kind in kinds]
        self.channels_first = any(rule.channels_first for rule in sweep_rules)

    def graph(self, graph: GraphLike) -> int:
        count = 0
        for node in graph:
            count += self._node(node, graph)
            for subgraph in _subgraphs(node):
                count += self.graph(subgraph)
        return count

    def _node(self, node: ir.Node, graph: GraphLike) -> int:
        for candidate in self._candidates(node, graph):
            for rule in self.rules:
                if rule.kind == candidate.spec.kind and self._apply(rule, candidate, node, graph):
                    return 1
        return 0

    def _candidates(self, node: ir.Node, graph: GraphLike) -> Iterator[Candidate]:
        recognisers = []
        if self.statistic_kinds:
            recognisers.append(lambda: find_norm(node, kinds=self.statistic_kinds, channels_first=self.channels_first))
        for finder in self.finders:
            if node.op_type in finder.anchor_ops and is_onnx_domain(node.domain):
                recognisers.append(lambda finder=finder: finder.find(node))
        if recognisers:
            self.session.progress()
        for recognise in recognisers:
            try:
                found = recognise()
            except NearMiss as miss:
                self.session.near_miss(node, graph, miss)
                continue
            except Exception as err:  # a matcher bug: the node is left as it is and reported, the rewrite goes on
                _log_internal_error("the matcher failed", node, err)
                self.session.near_miss(node, graph, internal_error("not analysed", err))
                continue
            if found is not None:
                yield found

    def _apply(self, rule: FusionRule, candidate: Candidate, node: ir.Node, graph: GraphLike) -> bool:
        """Rewrites `candidate` with `rule` if it selects it; False (and a near-miss) when it does not apply."""
        try:
            selected = rules.select(rule, candidate, node, graph, self._opset(graph), self.session)
            return selected is not None and self._replace(rule, selected, node, graph)
        except Exception as err:  # a match that cannot be applied is skipped and reported, never fatal
            _log_internal_error("rewriting failed", node, err)
            self.session.near_miss(node, graph, internal_error("not applied", err))
            return False

    def _opset(self, graph: GraphLike) -> int:
        """The default-domain opset of `graph`; a function without its own import inherits the model's."""
        return onnx_opset(graph.opset_imports) or onnx_opset(self.model.graph.opset_imports) or 0

    def _replace(self, rule: FusionRule, selected: rules.Selected, node: ir.Node, graph: GraphLike) -> bool:
        candidate = selected.candidate
        spec = dataclasses.replace(candidate.spec, rule=rule.name)
        op = Builder()
        try:
            outputs = _emit(op, candidate, spec, selected.emitter, graph, self.session.target)
        except ValueError as err:  # the target cannot express this norm exactly
            self.session.near_miss(node, graph, NearMiss(f"target {self.session.target}: {err}"))
            return False
        old_values = spec.replaced() + [n.outputs[0] for n in candidate.recast]
        rules.reread_shapes(candidate)
        problem = rules.removal_problem(candidate.nodes, old_values)
        if problem is not None:
            self.session.near_miss(node, graph, NearMiss(f"not applied: {problem}"))
            return False
        for initializer in op.initializers:
            assert isinstance(graph, ir.Graph)  # functions get Constant nodes instead (_constants)
            graph.register_initializer(initializer)
        onnxscript.optimizer.basic_constant_propagation(op.nodes)
        ir.convenience.replace_nodes_and_values(graph, node, candidate.nodes, op.nodes, old_values, outputs)
        for owner in (graph, self.model.graph):
            for domain, version in op.used_opsets:
                owner.opset_imports.setdefault(domain, version if version is not None else 1)
        self.session.records.append(_record(candidate, spec, self.session.target, graph, op.nodes))
        self.session.replaced(candidate.nodes)
        return True


def _log_internal_error(what: str, node: ir.Node, err: Exception) -> None:
    """An exception of onnx-norm's own at `node`: one line at WARNING, the traceback at DEBUG (`-vv`)."""
    where = node.name or node.op_type
    logger.warning("%s at %s (%s: %s); the node is left as it is", what, where, type(err).__name__, err)
    logger.debug("traceback of the failure at %s", where, exc_info=err)


def _subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.value
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.value


def _emit(op: Builder, candidate: Candidate, spec: NormSpec, emitter: Emitter, graph: GraphLike, target: str):
    """The new values replacing `spec.replaced()` and then the outputs of `candidate.recast`."""
    spec = _with_constants(op, candidate, spec, graph)
    if candidate.perm is not None:
        return targets.emit_transposed(op, candidate.perm, spec, target, prepared=emitter)
    results = targets.emit(op, spec, "", prepared=emitter)
    if candidate.recast:
        made = {spec.sum: results[1]}
        for node in candidate.recast:
            source = made[node.inputs[0]]
            new = op.Cast(source, to=node.attributes["to"].value) if node.op_type == "Cast" else op.Identity(source)
            made[node.outputs[0]] = new
            results.append(new)
    return results


def _with_constants(op: Builder, candidate: Candidate, spec: NormSpec, graph: GraphLike) -> NormSpec:
    """`spec` reading the constants made for the candidate: initializers, or Constant nodes inside a function."""
    made = {}
    for key, array in candidate.new_constants.items():
        tensor = ir.tensor(array)
        if isinstance(graph, ir.Function):
            made[key] = op.Constant(value=tensor)
            continue
        name = f"onnx_norm_{key}_{_unique_suffix()}"
        while name in graph.initializers:  # a model optimised before already has this name
            name = f"onnx_norm_{key}_{_unique_suffix()}"
        tensor.name = name
        made[key] = op.initializer(tensor, name=name)
    return dataclasses.replace(spec, scale=made.get("scale", spec.scale), bias=made.get("bias", spec.bias))


_counter = [0]


def _unique_suffix() -> int:
    _counter[0] += 1
    return _counter[0]


def _record(candidate: Candidate, spec: NormSpec, target: str, graph: GraphLike, new_nodes) -> NormRecord:
    attrs = spec.attrs
    return NormRecord(
        rule=spec.rule,
        kind=spec.kind,
        target=target,
        replaced_nodes=[n.name or n.op_type for n in candidate.nodes],
        new_nodes=[n.op_type for n in new_nodes],
        graph=graph_label(graph),
        dtype=type_name(candidate.x_value.dtype),
        epsilon=float(attrs.epsilon),
        axes=list(candidate.axes),
        cast_placement=candidate.cast_placement,
        residual=spec.skip is not None,
        residual_sum_kept=spec.sum is not None,
        statistics=[k for k in ("mean", "inv_std") if getattr(spec, k) is not None],
        variant=candidate.variant,
        attributes=attrs.as_dict(),
    )
