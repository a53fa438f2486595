"""Takes over norms that are already single ops, so that our kernels (or another target's ops) run them.

Converted, each with the semantics of its definition:
- ONNX `LayerNormalization` (opset >= 17) and `RMSNormalization` (opset >= 23): their function bodies compute the
  statistics in float32 (stash_type 1), round the normalised value to X's type T and multiply (and add the bias)
  in T; ONNX Runtime's kernel rounds once, and so does the converted op (never less accurate, docs/accuracy.md).
- ONNX Runtime's `LayerNormalization` below opset 17 and `SimplifiedLayerNormalization` (default domain, or
  com.microsoft as some tools write them): Y takes the scale's type and is rounded once, `output_type = type(Scale)`.
- com.microsoft `SkipLayerNormalization` / `SkipSimplifiedLayerNormalization`: the residual sum rounded to X's type
  as Sum, the norm rounded once. For float16/bfloat16 both ONNX Runtime's CPU kernel and ours normalise the unrounded
  float32 sum, both CUDA kernels the rounded one (docs/ops.md).

The ops and their semantics are the op records' native ops (`OpSignature.natives`, ops/norms.py). Families add
their own native ops (family.NormFamily.native), read by the family.

Skipped, with the reason in the record: statistics stashed in another type than float32, double inputs, the
extra `bias` input of the Skip ops, their mean/inv_std_var outputs when used (our Skip ops have none), a residual
that broadcasts, RMSNormalization with a scale of another type than X (its ONNX function is ill-typed then), and
unknown element types or ranks.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import onnx_ir as ir

from onnx_norm.dtypes import FLOAT_TYPES, is_onnx_domain, onnx_opset, type_name
from onnx_norm.ops import functions
from onnx_norm.ops.schema import DOMAIN, MS_DOMAIN, NormAttributes, native_of, native_ops
from onnx_norm.rewrite import family, skip, targets
from onnx_norm.rewrite.builder import Builder
from onnx_norm.rewrite.spec import NormSpec, elem_type

logger = logging.getLogger(__name__)

#: The rule name recorded on nodes made by the take-over.
RULE = "take-over"

_FLOAT = int(ir.DataType.FLOAT)
_MS = MS_DOMAIN
#: (domain group, op) -> (kind, skip): the native ops of the op records that the built-in take-over reads.
_NATIVE = {
    ("onnx" if is_onnx_domain(domain) else "ms", native.op_type): (op.kind, op.skip)
    for op, native in native_ops()
    for domain in native.take_over
}

#: The native norm ops as `report.op_counts` names them (`domain::op` outside ONNX), for counting them in a report.
NATIVE_OP_NAMES = frozenset(op if group == "onnx" else f"{_MS}::{op}" for group, op in _NATIVE)


class _Skip(Exception):
    """A node that cannot be taken over; the message is the reason."""


def _group(domain: str) -> str | None:
    if is_onnx_domain(domain):
        return "onnx"
    if domain == _MS:
        return "ms"
    return None


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _output(node: ir.Node, index: int) -> ir.Value | None:
    """The output if anything reads it (a consumer or a graph output); unused outputs are dropped."""
    if index >= len(node.outputs):
        return None
    value = node.outputs[index]
    return value if value.uses() or value.is_graph_output() else None


def _attr(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _negative_axis(node: ir.Node, x: ir.Value, axis: int) -> int:
    if axis < 0:
        return axis
    if x.shape is None:
        raise _Skip(f"axis {axis} is not negative and the rank of the input is unknown")
    rank = len(x.shape)
    if axis >= rank:
        raise _Skip(f"axis {axis} is out of range for rank {rank}")
    return axis - rank


def _family_reader(node: ir.Node) -> Any:
    """The reader a registered family gives for `node`'s op (family.NormFamily.native), or None."""
    if not is_onnx_domain(node.domain):
        return None
    return next((f.native[node.op_type] for f in family.families() if node.op_type in f.native), None)


def _read(node: ir.Node, opset: int) -> tuple[NormSpec, tuple[int, ...] | None]:
    """The spec of `node` and, for a family's norm over non-trailing axes, the Transpose that moves them last."""
    key = (_group(node.domain), node.op_type)
    reader = _family_reader(node) if key not in _NATIVE else None
    if reader is None:
        return _spec(node, opset), None
    try:
        read = reader(node, opset)
    except ValueError as error:
        raise _Skip(str(error)) from None
    spec, perm = read if isinstance(read, tuple) else (read, None)
    return dataclasses.replace(spec, rule=RULE), perm


def _spec(node: ir.Node, opset: int) -> NormSpec:
    key = (_group(node.domain), node.op_type)
    if key not in _NATIVE and _family_reader(node) is not None:
        spec, perm = _read(node, opset)
        if perm is not None:
            raise _Skip("it normalises non-trailing axes (only the take-over writes it, between Transposes)")
        return spec
    kind, skip = _NATIVE[key]  # type: ignore[index]
    x = _input(node, 0)
    if x is None:
        raise _Skip("it has no input")
    x_type = elem_type(x)
    if x_type == 0:
        raise _Skip("the element type of its input is unknown (run shape inference first)")
    if x_type not in FLOAT_TYPES:
        raise _Skip(f"input element type {type_name(x_type)} is not {targets.FLOAT_TYPE_LIST}")
    spec = _skip_spec(node, kind, x) if skip else _plain_spec(node, kind, x, opset)
    for name, value in (("scale", spec.scale), ("bias", spec.bias)):
        if value is not None and elem_type(value) not in FLOAT_TYPES:
            raise _Skip(f"its {name} element type is unknown or not {targets.FLOAT_TYPE_LIST}")
    return spec


def _skip_spec(node: ir.Node, kind: str, x: ir.Value) -> NormSpec:
    """com.microsoft's Skip ops: the residual sum in X's type, then the norm rounded once."""
    if _input(node, 4 if kind == "layer" else 3) is not None:
        raise _Skip("its bias input (added into the residual sum) has no counterpart in our Skip ops")
    if _output(node, 1) is not None or _output(node, 2) is not None:
        raise _Skip("its mean/inv_std_var outputs are used and our Skip ops have no statistics outputs")
    residual = _input(node, 1)
    if residual is None:
        raise _Skip("it has no skip input")
    # The contrib ops constrain input and skip to one type T: an unknown skip type is the input's.
    if elem_type(residual) not in (0, elem_type(x)):
        raise _Skip("its skip input has another element type than its input")
    if x.shape is None or residual.shape is None:
        unknown = "its input's" if x.shape is None else "its skip input's"
        raise _Skip(f"{unknown} shape is unknown (shape inference did not reach it), so the skip may broadcast")
    if x.shape != residual.shape:
        raise _Skip("its skip input may broadcast (shapes differ); our Skip ops need equal shapes")
    attrs = NormAttributes(axis=-1, epsilon=float(_attr(node, "epsilon", 1e-12)))
    bias = _input(node, 3) if kind == "layer" else None
    return NormSpec(kind, x, residual, _input(node, 2), bias, attrs, node.outputs[0], _output(node, 3), rule=RULE)


def _plain_spec(node: ir.Node, kind: str, x: ir.Value, opset: int) -> NormSpec:
    """ONNX's LayerNormalization/RMSNormalization, or ORT's contrib LayerNormalization/SimplifiedLayerNormalization."""
    stash = int(_attr(node, "stash_type", 1))
    if stash != _FLOAT:
        raise _Skip(f"stash_type {stash} computes the statistics in another type than float32")
    axis = _negative_axis(node, x, int(_attr(node, "axis", -1)))
    epsilon = float(_attr(node, "epsilon", 1e-5))
    scale = _input(node, 1)
    layer = kind == "layer"
    if node.op_type == "RMSNormalization" and len(node.outputs) > 1:
        raise _Skip("RMSNormalization has a single output")
    x_type = elem_type(x)
    # The ONNX-standard ops (one type for X, scale and Y) exist from their opsets; below them the default-domain
    # names are ORT's contrib ops (the op records' native ops say which).
    found = native_of(node.op_type, node.domain, opset)
    if found is not None and found[1].single_type:
        if scale is not None and elem_type(scale) != x_type:
            raise _Skip("its scale has another element type than its input (the ONNX function is ill-typed)")
        rounding = 0 if x_type == _FLOAT else x_type
        # The function body rounds after each step; ONNX Runtime's kernel (what ran before) and our op round once,
        # which is never less accurate (casts.op_rounding). A family whose match contains the node reads the body's
        # rounding (`graph_attrs`).
        graph_attrs = NormAttributes(axis=axis, epsilon=epsilon, normalized_type=rounding, multiply_type=rounding)
        attrs = NormAttributes(axis=axis, epsilon=epsilon)
    else:
        # ORT's contrib ops: Y has the scale's type, rounded once.
        y_type = elem_type(scale) if scale is not None else x_type
        if y_type == 0:
            raise _Skip("the element type of its scale is unknown")
        attrs = graph_attrs = NormAttributes(axis=axis, epsilon=epsilon, output_type=0 if y_type == x_type else y_type)
    mean = _output(node, 1) if layer else None
    inv_std = _output(node, 2 if layer else 1)
    bias = _input(node, 2) if layer else None
    spec = NormSpec(kind, x, None, scale, bias, attrs, node.outputs[0], None, mean, inv_std, RULE)
    spec.graph_attrs = graph_attrs if graph_attrs != attrs else None
    return spec


def native_kind(node: ir.Node) -> tuple[str, bool] | None:
    """(kind, whether it adds a residual) of a native norm op; None when `node` is none."""
    return _NATIVE.get((_group(node.domain), node.op_type))  # type: ignore[arg-type]


def native_spec(node: ir.Node, opset: int) -> NormSpec | str:
    """What the native norm op `node` computes, as the take-over reads it (`opset`: its graph's default-domain
    opset), or why it cannot be read that way. For recognisers that fuse more than the node (a norm and what
    follows it), so that they read the ops with the take-over's semantics."""
    try:
        return _spec(node, opset)
    except _Skip as skipped:
        return str(skipped)


def _owners(model: ir.Model) -> list[tuple[ir.Graph | ir.Function, ir.Node]]:
    found = []
    graphs: list[ir.Graph | ir.Function] = [model.graph]
    graphs += [f for f in model.functions.values() if f.domain != DOMAIN]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            if (_group(node.domain), node.op_type) in _NATIVE or _family_reader(node) is not None:
                found.append((graph, node))
    return found


def take_over(model: ir.Model, target: str = "onnx-norm", *, attach_functions: bool = True) -> list[dict[str, Any]]:
    """Replaces native norm ops with `target`'s ops, in place. Returns one record per native norm node:
    {"name", "from", "to", "converted", "reason"}; "to" lists the emitted ops, "reason" says why a node stayed.

    `attach_functions`: add the model-local functions the target's ops need (FuseNormsPass does it once itself)."""
    chosen = targets.get(target)
    records = [_take_over_one(model, owner, node, chosen) for owner, node in _owners(model)]
    if attach_functions and chosen.attaches_functions and any(r["converted"] for r in records):
        functions.attach_functions(model)
    return records


def _take_over_one(model: ir.Model, owner: ir.Graph | ir.Function, node: ir.Node, target: targets.Target) -> dict:
    graph = node.graph
    assert graph is not None
    source = f"{node.domain or 'ai.onnx'}::{node.op_type}"
    record: dict[str, Any] = {"name": node.name, "from": source, "to": None, "converted": False, "reason": None}
    record["residual"] = False  # True when a residual Add was folded in (the Skip op)
    opset = onnx_opset(owner.opset_imports) or onnx_opset(model.opset_imports) or 0
    try:
        if (_group(node.domain), node.op_type) in target.native_ops:
            raise _Skip(f"it is already an op of the {target.name!r} target")
        spec, add, prepared, perm = _prepared(node, opset, target)
    except _Skip as skipped:
        record["reason"] = str(skipped)
        logger.info("not taking over %s %r: %s", source, node.name, skipped)
        return record
    op = Builder()
    if perm is None:
        new_values = targets.emit(op, spec, target.name, opset, prepared=prepared)
    else:
        new_values = targets.emit_transposed(op, perm, spec, target.name, prepared=prepared)
    new_nodes = list(op.nodes)
    for index, new in enumerate(new_nodes):
        new.name = f"{node.name}_{target.name}_{index}" if node.name else None
    old_nodes = [node] if add is None else [add, node]
    ir.convenience.replace_nodes_and_values(graph, node, old_nodes, new_nodes, spec.replaced(), new_values)
    for domain, version in op.used_opsets:
        if domain and version is not None:
            owner.opset_imports.setdefault(domain, version)
            model.opset_imports.setdefault(domain, version)
    record["to"] = ", ".join(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in new_nodes if n.op_type != "Constant")
    record["converted"] = True
    record["residual"] = add is not None
    return record


def _prepared(
    node: ir.Node, opset: int, target: targets.Target
) -> tuple[NormSpec, ir.Node | None, Any, tuple[int, ...] | None]:
    """The spec to emit for `node`, the residual Add folded into it (or None), the target's preparation and the
    Transpose moving the normalised axes last (None: they are). A plain native norm of a residual sum `Add(a, b)`
    becomes the target's Skip op, as the rewrite does for decomposed norms (ONNX Runtime fuses BERT's Add +
    LayerNormalization into SkipLayerNormalization itself); when the target cannot express the folded norm, the
    norm alone is taken over."""
    spec, perm = _read(node, opset)
    folded = _fold_residual(spec, node) if perm is None else None
    if folded is not None:
        prepared = targets.prepare(folded[0], target.name, opset)
        if not isinstance(prepared, str):
            return folded[0], folded[1], prepared, None
    prepared = targets.prepare(spec, target.name, opset)
    if isinstance(prepared, str):
        raise _Skip(prepared)
    return spec, None, prepared, perm


def _fold_residual(spec: NormSpec, node: ir.Node) -> tuple[NormSpec, ir.Node] | None:
    if spec.skip is not None or spec.mean is not None or spec.inv_std is not None:
        return None  # already a Skip op, or statistics outputs our Skip ops do not have
    addends = skip.residual_addends(spec.x)
    if addends is None or addends[0].graph is not node.graph:
        return None
    add, a, b = addends
    return skip.fold_spec(spec, a, b, {add, node}), add
