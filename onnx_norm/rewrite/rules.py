"""The rules: which matched norms a rule takes, and the checks a candidate passes before it is rewritten.

A rule (`family.FusionRule`) is configured by its arguments: the family kind it fuses, `residual` (fold the
residual Add into a Skip op) and `channels_first` (a norm over non-trailing axes, between Transposes). The
families register their rules; at one node they are tried in `family.rules()` order:

- `skip_layer_norm`, `skip_rms_norm`: a norm whose input is a residual Add, fused with it.
- `layer_norm_channels_first`, `rms_norm_channels_first` (and a family's own channels-first rule): a norm over a
  non-trailing axis (ConvNeXt's NCHW LayerNorm, ConvNeXt-V2/diffusion code's
  `x * rsqrt(x.pow(2).mean(1, keepdim=True) + eps)`), emitted between Transposes.
- `layer_norm`, `rms_norm`: everything else.

Disabling a residual rule leaves the residual Add in the graph and fuses the norm alone. A residual rule that
cannot take a candidate passes in silence (the plain rule reports the norm); a plain rule says why in a near-miss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import onnx_ir as ir

from onnx_norm.dtypes import is_onnx_domain

# The families package registers the built-in families; RULE_NAMES below is the first read of the registry.
from onnx_norm.rewrite import families as _families  # noqa: F401
from onnx_norm.rewrite import family, targets
from onnx_norm.rewrite.family import Emitter, FusionRule
from onnx_norm.rewrite.match import Candidate
from onnx_norm.rewrite.session import GraphLike, Session
from onnx_norm.rewrite.skip import fold_residual
from onnx_norm.rewrite.structure import NearMiss

#: Every rule's name, in the order they are tried (the choices of `--disable`).
RULE_NAMES: tuple[str, ...] = tuple(rule.name for rule in family.rules())


def enabled_rules(disabled: Iterable[str]) -> list[FusionRule]:
    """The rules that are not disabled; ValueError for a name that is no rule."""
    disabled = set(disabled)
    names = [rule.name for rule in family.rules()]
    unknown = sorted(disabled - set(names))
    if unknown:
        raise ValueError(f"unknown rule(s) {', '.join(unknown)}; the rules are {', '.join(names)}")
    return [rule for rule in family.rules() if rule.name not in disabled]


@dataclasses.dataclass
class Selected:
    """A candidate a rule takes, with the target's checked emitter for it."""

    candidate: Candidate
    emitter: Emitter


def select(
    rule: FusionRule, candidate: Candidate, node: ir.Node, graph: GraphLike, opset: int, session: Session
) -> Selected | None:
    """What `rule` rewrites of `candidate` at its anchor `node` (the residual variant for a residual rule), or
    None; `opset` is the graph's default-domain opset."""
    if candidate.spec.kind != rule.kind or (candidate.perm is not None) != rule.channels_first:
        return None
    if rule.residual:
        return _select_residual(candidate, node, graph, opset, session)
    return _select_plain(candidate, node, graph, opset, session)


def _select_residual(
    candidate: Candidate, node: ir.Node, graph: GraphLike, opset: int, session: Session
) -> Selected | None:
    folded = fold_residual(candidate)
    if folded is None:
        return None
    emitter = targets.prepare(folded.spec, session.target, opset)
    if isinstance(emitter, str):
        return None
    node_set = set(folded.nodes)
    readers = _outside_readers(folded.spec.sum, node_set)
    for recast in folded.recast:
        readers += _outside_readers(recast.outputs[0], node_set)
    if not _after(graph, node, readers):
        return None
    if session.proven(folded) is not None:
        return None  # the plain rule proves (and reports) the norm without the residual
    return Selected(folded, emitter)


def _select_plain(
    candidate: Candidate, node: ir.Node, graph: GraphLike, opset: int, session: Session
) -> Selected | None:
    emitter = targets.prepare(candidate.spec, session.target, opset)
    if isinstance(emitter, str):
        session.near_miss(node, graph, NearMiss(f"target {session.target}: {emitter}"))
        return None
    node_set = set(candidate.nodes)
    spec = candidate.spec
    readers = _outside_readers(spec.mean, node_set) + _outside_readers(spec.inv_std, node_set)
    if not _after(graph, node, readers):
        session.near_miss(node, graph, NearMiss("a statistic of the norm is read before the norm ends"))
        return None
    failure = session.proof_failure(candidate)
    if failure is not None:
        session.near_miss(node, graph, failure)
        return None
    return Selected(candidate, emitter)


def _after(graph: GraphLike, anchor: ir.Node, readers: Iterable[ir.Node]) -> bool:
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


def reread_shapes(candidate: Candidate) -> None:
    """Lets each `Shape` outside the match that reads a replaced value read instead the value of the same shape
    that the fused op reads (`candidate.same_shape`): the value it read goes, its shape stays, and the model
    computes the same shapes from it."""
    inside = set(candidate.nodes)
    for value, source in candidate.same_shape.items():
        for use in list(value.uses()):
            node = use.node
            if node not in inside and node.op_type == "Shape" and is_onnx_domain(node.domain) and use.idx == 0:
                node.replace_input_with(0, source)


def removal_problem(nodes: list[ir.Node], replaced: list[ir.Value]) -> str | None:
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
