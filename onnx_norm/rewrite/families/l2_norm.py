"""L2 normalisation, fused into `onnx_norm::L2Norm`: `y = x * scale / max(||x||_2, eps)` (docs/ops.md).

Recognised, anchored at any Mul or Div of the product (the match extends forward over the Muls and Divs by
constants that follow, so that a constant factor written after the division is part of it), as a product
`x^1 * D^-1 * constants` (`structure.flatten`: Div, Mul(Reciprocal), Pow(., -1), the factors in any order) where D
is the row's Euclidean norm:

    ReduceL2(x, axes, keepdims=1)                  TorchScript's and dynamo's `x.norm(dim=-1, keepdim=True)`
    Sqrt(ReduceSum(Pow(x, 2) or Mul(x, x)))        the norm spelled out
    Sqrt(ReduceSumSquare(x))
    Max(N, eps) or Clip(N, min=eps)                F.normalize's clamp_min(eps) (either op, either operand order)
    Expand(D, Shape(x))                            F.normalize's expand_as form
    Unsqueeze/Reshape of a keepdims=0 reduction    `x.norm(dim=-1)[..., None]` (before or after the clamp)

or `x^1 * S^-1/2` with S the sum of squares (optionally Max(S, eps^2): the clamp under the square root). The
constants (ScaleNorm's g, x-transformers' sqrt(d) and gamma, in any order and on either side of the division) are
folded into one Scale, which must be constant along every axis that is not normalised; a weight the model takes
at run time (`constants.is_runtime_parameter`) is read as the Scale as it is, by the LayerNorm families' reading
(`match.runtime_rows`). Without a clamp the match has epsilon 0 (`x / x.norm(...)`, CLIP's embeddings): a zero row
is 0/0 = NaN in the graph and in the op alike. Epsilon added instead of clamped (`||x|| + eps`, SSD's L2Norm, or
`sqrt(S + eps)`) is no L2Norm but exactly an RMSNorm (AddedEpsilonAttributes), emitted by the RMSNorm family's
lowerings.

A norm over a non-trailing block of axes (`F.normalize(x, dim=1)` on [N, C, H, W]) is laid out by the shared
channels-first reading (`match.norm_layout`), fused by the rule `l2_norm_channels_first` and written between two
Transposes (`targets.emit_transposed`), a per-channel weight [1, C, 1, 1] becoming the Scale row [C].

The native ONNX LpNormalization (p = 2) over any one axis is taken over with `--take-over-native` (`read_native`,
epsilon 0; another axis than the last between the same Transposes).

Targets: `onnx-norm` (our op), `onnx` (LpNormalization, then Mul by the scale: only when the match has no epsilon,
as LpNormalization has none, and normalises one axis, which for a channels-first norm is X's own: no Transposes),
`ort`: a reason (ONNX Runtime has no L2 op with an epsilon).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import NARROW_TYPES, is_onnx_domain, type_name
from onnx_norm.ops.l2_norm import L2_NORM, LP_NORMALIZATION, l2_normalized
from onnx_norm.ops.numerics import np_dtype
from onnx_norm.ops.schema import DOMAIN, OPSET_VERSION, NormAttributes, NormOpAttributes
from onnx_norm.rewrite import constants, evaluate, match, structure, targets
from onnx_norm.rewrite.family import FusionRule, Lowering, NormFamily
from onnx_norm.rewrite.family import get as get_family
from onnx_norm.rewrite.match_state import Layout
from onnx_norm.rewrite.reductions import reduction_axes
from onnx_norm.rewrite.spec import NormSpec
from onnx_norm.rewrite.structure import NearMiss

KIND = L2_NORM.kind
_RMS = "rms"  # the family that computes an L2 norm with its epsilon added (AddedEpsilonAttributes)
_FLOAT = int(ir.DataType.FLOAT)
_ONNX_OP = LP_NORMALIZATION.op_type
#: Ops the walk from the end of the product back to the norm looks through (those `structure.flatten` does).
_PRODUCT_OPS = frozenset({"Mul", "Div", "Sqrt", "Reciprocal", "Pow", "Identity", "Cast", *structure.LAYOUT_OPS})
_MAX_NODES = 40


@dataclasses.dataclass(frozen=True)
class _Stat:
    """A row statistic of the product: the norm ("norm", exponent -1) or the sum of squares ("sum", -1/2)."""

    kind: str
    x: ir.Value  # what is squared
    axes: tuple[int, ...]  # from the end
    eps: float  # the clamp on the norm (0: none), or the epsilon added to it when `added`
    variant: str
    added: bool = False  # ||x|| + eps or S + eps: epsilon added, not a clamp (AddedEpsilonAttributes)


@dataclasses.dataclass(frozen=True)
class AddedEpsilonAttributes(NormOpAttributes):
    """The attributes of an L2 norm whose epsilon is added instead of clamped: `x / (||x|| + eps)` (SSD's L2Norm,
    epsilon_outside 1) or `x / sqrt(S + eps)` (0). That is no L2Norm (which clamps: `max(||x||, eps)` differs for
    rows whose norm is near eps) but exactly an RMSNorm over the same N elements, ||x|| + eps = sqrt(N) *
    (sqrt(mean(x^2)) + eps / sqrt(N)) and S + eps = N * (mean(x^2) + eps / N): these attributes are that RMSNorm's
    (epsilon eps / sqrt(N) or eps / N), the spec's Scale is the weight / sqrt(N), and the family's reference and
    lowerings hand the spec to the RMSNorm family's (`_rms_spec`)."""


def _onnx(node: ir.Node | None, *ops: str) -> bool:
    return node is not None and node.op_type in ops and is_onnx_domain(node.domain)


def _keepdims(node: ir.Node) -> bool:
    attr = node.attributes.get("keepdims")
    return attr is None or bool(attr.value)


def _sum_of_squares(value: ir.Value, dropped: bool = False) -> tuple[ir.Value, tuple[int, ...], str] | None:
    """(x, axes, spelling) of ReduceSum(x^2) or ReduceSumSquare(x), keepdims (or not, when `dropped`: a layout op
    restores the dims, and the proof checks where)."""
    node = value.producer()
    if not _onnx(node, "ReduceSum", "ReduceSumSquare") or not node.inputs or node.inputs[0] is None:
        return None
    if not (dropped or _keepdims(node)):
        return None
    base = node.inputs[0] if node.op_type == "ReduceSumSquare" else structure.squared(node.inputs[0])
    if base is None:
        return None
    axes = reduction_axes(node, len(base.shape) if base.shape is not None else None)
    spelling = "ReduceSumSquare" if node.op_type == "ReduceSumSquare" else "ReduceSum of squares"
    return (base, axes, spelling) if axes else None


def _raw(value: ir.Value, dropped: bool = False) -> _Stat | None:
    """The norm or sum of squares `value` is, unclamped (its dims dropped too, when `dropped`)."""
    node = value.producer()
    if _onnx(node, "ReduceL2") and node.inputs and node.inputs[0] is not None and (dropped or _keepdims(node)):
        x = node.inputs[0]
        axes = reduction_axes(node, len(x.shape) if x.shape is not None else None)
        return _Stat("norm", x, axes, 0.0, "ReduceL2") if axes else None
    if _onnx(node, "Sqrt") and node.inputs[0] is not None:
        found = _sum_of_squares(node.inputs[0], dropped)
        return None if found is None else _Stat("norm", found[0], found[1], 0.0, f"Sqrt({found[2]})")
    found = _sum_of_squares(value, dropped)
    return None if found is None else _Stat("sum", found[0], found[1], 0.0, found[2])


def _lower_bound(node: ir.Node) -> tuple[ir.Value, float] | None:
    """(the clamped value, the bound) of Max(v, c) / Max(c, v) / Clip(v, min=c) with no upper bound, c >= 0."""
    if _onnx(node, "Max") and len(node.inputs) == 2 and None not in node.inputs:
        a, b = node.inputs
        for data, bound in ((a, b), (b, a)):
            limit = constants.scalar(bound)
            if limit is not None and limit >= 0 and not constants.is_constant(data):
                return data, limit  # type: ignore[return-value]
    if _onnx(node, "Clip") and node.inputs and node.inputs[0] is not None:
        low_value = node.inputs[1] if len(node.inputs) > 1 else None
        high_value = node.inputs[2] if len(node.inputs) > 2 else None
        low = constants.scalar(low_value) if low_value is not None else _float_attr(node, "min")
        high = constants.scalar(high_value) if high_value is not None else _float_attr(node, "max")
        if low is not None and low >= 0 and (high is None or high >= 3.0e38):
            return node.inputs[0], low
    return None


def _float_attr(node: ir.Node, name: str) -> float | None:
    attr = node.attributes.get(name)
    return None if attr is None else float(attr.value)


def _stat(value: ir.Value, dropped: bool = False) -> _Stat | None:
    """`value` as a (clamped) norm or sum of squares; a clamp of the sum is eps^2: sqrt(max(S, e^2)) = max(||x||, e).
    A reduction with its dims dropped may be restored by an Unsqueeze or Reshape, before or after the clamp
    (`x / x.norm(dim=-1)[..., None]`); the proof checks that the dims come back where they were."""
    node = value.producer()
    if _onnx(node, "Unsqueeze", "Reshape") and node.inputs and node.inputs[0] is not None:
        inner = _stat(node.inputs[0], dropped=True)
        return None if inner is None else dataclasses.replace(inner, variant=f"{inner.variant}, {node.op_type}")
    clamp = _lower_bound(node) if node is not None else None
    if clamp is None:
        added = _added_epsilon(node, dropped)
        return added if added is not None else _raw(value, dropped)
    inner = _stat(clamp[0], dropped)
    if inner is None or inner.eps != 0:
        return None
    eps = clamp[1] if inner.kind == "norm" else math.sqrt(clamp[1])
    return dataclasses.replace(inner, eps=eps, variant=f"{inner.variant} clamped by {node.op_type}")  # type:
    # ignore[union-attr]


def _added_epsilon(node: ir.Node | None, dropped: bool) -> _Stat | None:
    """`||x|| + eps` (SSD's `x.pow(2).sum(1, keepdim=True).sqrt() + eps`) or `S + eps`, eps a constant scalar >= 0:
    the statistic with its epsilon added (`AddedEpsilonAttributes`)."""
    if not _onnx(node, "Add") or len(node.inputs) != 2 or None in node.inputs:  # type: ignore[union-attr]
        return None
    a, b = node.inputs  # type: ignore[union-attr]
    for data, eps_value in ((a, b), (b, a)):
        eps = constants.scalar(eps_value)
        if eps is None or not math.isfinite(eps) or eps < 0 or constants.is_constant(data):
            continue
        inner = _raw(data, dropped)  # type: ignore[arg-type]
        if inner is not None:
            return dataclasses.replace(inner, eps=eps, added=True, variant=f"{inner.variant} + eps")
    return None


def _find_stat(end: ir.Value) -> tuple[ir.Value, _Stat] | None:
    """The nearest statistic the product ending at `end` divides by (walking back through the product's ops)."""
    frontier, seen = [end], set()
    while frontier and len(seen) < _MAX_NODES:
        value = frontier.pop(0)
        if value in seen:
            continue
        seen.add(value)
        found = _stat(value)
        if found is not None:
            return value, found
        node = value.producer()
        if _onnx(node, *_PRODUCT_OPS):
            frontier += [v for v in node.inputs[:2] if v is not None and not constants.is_constant(v)]  # type:
            # ignore[union-attr]
    return None


def _ends(anchor: ir.Node) -> list[ir.Value]:
    """The anchor's output, then each Mul or Div by a constant, Mul by a weight taken at run time
    (`constants.is_runtime_parameter`) or float Cast that is its only reader, in turn: the candidates' ends, longest
    last."""
    ends = [anchor.outputs[0]]
    while len(ends) < 8:
        value = ends[-1]
        uses = list(value.uses())
        if value.is_graph_output() or len(uses) != 1:
            break
        node = uses[0].node
        if structure.is_widening_cast(node) or (_onnx(node, "Cast") and node.attributes["to"].value in NARROW_TYPES):
            ends.append(node.outputs[0])
            continue
        if not _onnx(node, "Mul", "Div") or len(node.inputs) != 2:
            break
        other = node.inputs[1] if node.inputs[0] is value else node.inputs[0]
        runtime = node.op_type == "Mul" and constants.is_runtime_parameter(other)
        if other is None or not (runtime or constants.is_constant(other)):
            break
        if node.op_type == "Div" and other is node.inputs[0]:
            break
        ends.append(node.outputs[0])
    return ends


def _region(y: ir.Value, x: ir.Value, weights: Sequence[ir.Value] = ()) -> list[ir.Node]:
    """Every node between `x` (and constants, and the run-time `weights`, computed in front of it) and `y`;
    NearMiss when one of them reads something else or is read from outside."""
    nodes: list[ir.Node] = []
    stack = [y]
    while stack:
        value = stack.pop()
        if value is x or value in weights or constants.is_constant(value):
            continue
        node = value.producer()
        if node is None or len(nodes) > _MAX_NODES:
            raise NearMiss(f"the L2 norm reads {value.name!r}, which is neither its input nor a constant", value)
        if node not in nodes:
            nodes.append(node)
            stack += [v for v in node.inputs if v is not None]
    for node in nodes:
        for out in node.outputs:
            if out is y:
                continue
            if out.is_graph_output() or any(use.node not in nodes for use in out.uses()):
                raise NearMiss(f"{out.name!r} inside the L2 norm is read outside it", out)
    return _in_order(nodes)


def _in_order(nodes: list[ir.Node]) -> list[ir.Node]:
    graph = nodes[0].graph if nodes else None
    if graph is None:
        return nodes
    position = {node: i for i, node in enumerate(graph)}
    return sorted(nodes, key=lambda n: position.get(n, 0))


def _scale_row(factors: structure.Factors, layout: Layout) -> np.ndarray | None:
    """The product's constants as one row over the normalised dims (float32; moved last like X, `layout.perm`),
    None when they are all 1; NearMiss when they vary along an axis that is not normalised."""
    array = constants.fold_product(factors.constants)
    if array is None:
        return None
    assert layout.rank is not None
    rank = layout.rank
    if array.ndim > rank:
        raise NearMiss(f"the scale of shape {list(array.shape)} has more dims than the input (rank {rank})")
    padded = array.reshape((1,) * (rank - array.ndim) + array.shape)
    varying = [a - rank for a, d in enumerate(padded.shape) if d != 1 and a not in layout.axes]
    if varying:
        raise NearMiss(
            f"the scale (shape {list(array.shape)}) varies along axes {varying}, not only along the normalised "
            f"axes {[a - rank for a in layout.axes]}"
        )
    if layout.perm is not None:
        padded = np.transpose(padded, layout.perm)  # the per-channel weight [1, C, 1, 1] becomes a row [C]
    row = padded.reshape(padded.shape[rank - len(layout.axes) :])
    while row.ndim > 1 and row.shape[0] == 1:
        row = row.reshape(row.shape[1:])
    if np.all(row == 1.0):
        return None
    return np.ascontiguousarray(row.astype(np.float32))


def _runtime_scale(
    factors: structure.Factors, weights: list[ir.Value], layout: Layout, name: str
) -> tuple[ir.Value | None, np.ndarray | None]:
    """(Scale, the constant row to make or None): the run-time weight read as it is by the shared reading of
    run-time rows (match.runtime_rows: one row over trailing axes, the only factor but constant ones), or the
    product's constants folded into one row."""
    if not weights:
        row = _scale_row(factors, layout)
        return (None, None) if row is None else (_detached(row, f"{name}_scale"), row)
    if len(weights) > 1:
        raise NearMiss("the L2 norm is multiplied by more than one run-time weight", weights[1])
    others = [(v, e) for v, e in factors.constants if not np.all(constants.fold_product([(v, e)]) == 1.0)]
    affine = match.runtime_rows(
        match.AffineInputs(
            scale_terms=[(weights[0], Fraction(1)), *others], bias=None, correction=1.0, layout=layout, name=name
        )
    )
    return affine.scale, None


def _detached(array: np.ndarray, name: str) -> ir.Value:
    """A constant value not yet in any graph; the driver makes it an initializer (or a Constant in a function)."""
    tensor = ir.tensor(array, name=name)
    return ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)


def _candidate(end: ir.Value) -> match.Candidate | None:
    """The L2 norm ending at `end`, or None; NearMiss when the product divides by a norm but is not one. A norm
    over non-trailing axes (`F.normalize(x, dim=1)` on [N, C, H, W]) is laid out by the shared channels-first
    reading (match.norm_layout) and written between Transposes."""
    found = _find_stat(end)
    if found is None:
        return None
    stat_value, stat = found
    x = structure.strip_lossless_steps(stat.x)
    if x.shape is None:
        raise NearMiss("the rank of the L2 norm's input is unknown", x)
    layout = match.norm_layout(x, end, tuple(stat.axes), stat_value, channels_first=True)
    factors, weights = _product(end, x, stat_value, stat)
    scale, row = _runtime_scale(factors, weights, layout, end.name or "l2")
    nodes = _region(end, x, weights)
    attrs = NormAttributes(axis=-len(layout.axes), epsilon=stat.eps, output_type=_output_type(x, end))
    if stat.added:
        attrs, row = _added_epsilon_form(stat, layout, row, weights, attrs)
        scale = _detached(row, f"{end.name or 'l2'}_scale")
    spec = NormSpec(KIND, x, None, scale, None, attrs, end)
    t = int(x.dtype) if x.dtype is not None else 0
    if t in NARROW_TYPES:  # the graph rounds each step; the op rounds once (casts.op_rounding, the proof checks)
        spec.graph_attrs = dataclasses.replace(attrs, normalized_type=t, multiply_type=t)
    variant = stat.variant + (" x scale" if scale is not None else "") + (" at run time" if weights else "")
    return match.Candidate(
        spec=spec,
        nodes=nodes,
        axes=layout.axes,
        perm=layout.perm,
        new_constants={} if row is None else {"scale": row},
        variant=variant + ("" if layout.perm is None else ", channels first"),
        cast_placement=f"{type_name(x.dtype)} in",
        x_value=x,
    )


def _added_epsilon_form(
    stat: _Stat, layout: Layout, row: np.ndarray | None, weights: list[ir.Value], attrs: NormAttributes
) -> tuple[AddedEpsilonAttributes, np.ndarray]:
    """The RMSNorm an L2 norm with its epsilon added is (AddedEpsilonAttributes): its attributes and its Scale row,
    the weight (or 1) over sqrt(N); N must be static, and a run-time weight cannot take the 1/sqrt(N)."""
    if weights:
        raise NearMiss(
            "an L2 norm with epsilon added is an RMSNorm whose Scale is the weight / sqrt(N): not a "
            "weight taken at run time",
            weights[0],
        )
    assert layout.x_shape is not None
    dims = [layout.x_shape[a] for a in layout.axes]
    if not all(isinstance(d, int) for d in dims):
        raise NearMiss(f"an L2 norm with epsilon added over symbolic dims {dims}: its RMSNorm needs the row size")
    n = math.prod(dims)
    full = np.broadcast_to(np.float64(1.0) if row is None else row.astype(np.float64), tuple(dims))
    outside = stat.kind == "norm"
    eps = stat.eps / math.sqrt(n) if outside else stat.eps / n
    added = AddedEpsilonAttributes(
        axis=attrs.axis, epsilon=eps, output_type=attrs.output_type, epsilon_outside=int(outside)
    )
    return added, np.ascontiguousarray((full / math.sqrt(n)).astype(np.float32))


def _product(end: ir.Value, x: ir.Value, stat_value: ir.Value, stat: _Stat) -> tuple[structure.Factors, list[ir.Value]]:
    """`end` flattened: exactly x^1 * D^-1 (S^-1/2) times constants and at most the run-time weights (each to the
    power 1) returned beside the factors; NearMiss otherwise."""
    weights: list[ir.Value] = []

    def classify(value: ir.Value) -> str | None:
        if value is stat_value:
            return "stat"
        if value is x or structure.same_data(value, x):
            return "data"
        if constants.is_runtime_parameter(value):
            weights.append(value)
            return "weight"
        return None

    factors = structure.flatten(end, classify)
    distinct = list(dict.fromkeys(weights))
    wanted = {"data": 1, "stat": -1 if stat.kind == "norm" else Fraction(-1, 2)}
    if distinct:
        wanted["weight"] = len(distinct)  # each weight once, to the power 1 (w * w is no Scale)
    if factors.leaves != wanted:
        powers = ", ".join(f"{k}^{v}" for k, v in factors.leaves.items())
        raise NearMiss(f"the product is {powers}, not x / ||x|| times a scale", end)
    return factors, distinct


def _output_type(x: ir.Value, y: ir.Value) -> int:
    """Y's type when it is not X's (a Cast at the end of the product), else 0."""
    return 0 if y.dtype is None or y.dtype == x.dtype else int(y.dtype)


def find(anchor: ir.Node) -> match.Candidate | None:
    """The L2 norm whose product contains the Mul or Div `anchor`, extended over the constant factors after it."""
    if not anchor.outputs or anchor.outputs[0] is None:
        return None
    return structure.first_found(functools.partial(_candidate, end) for end in reversed(_ends(anchor)))


def reference(
    x: np.ndarray, params: Mapping[str, np.ndarray | None], attrs: NormAttributes
) -> tuple[np.ndarray, np.ndarray, None]:
    """The float64 reference (ops.l2_norm.l2_normalized) on the matched Scale; the RMSNorm family's for an L2 norm
    with its epsilon added (AddedEpsilonAttributes)."""
    if isinstance(attrs, AddedEpsilonAttributes):
        return get_family(_RMS).reference(x, params, _rms_attrs(attrs))  # type: ignore[return-value]
    y, inv = l2_normalized(x, params.get("scale"), attrs)
    out_dtype = np_dtype(attrs.output_type) if attrs.output_type else x.dtype
    return y.astype(np.float32).astype(out_dtype), inv, None


def _emit_onnx_norm(op, spec: NormSpec, opset: int) -> list[ir.Value]:
    """L2Norm; a Y type other than X's (the library types Y like X): float32 Y from a narrow X by widening X in
    front (exact: the kernels compute from the widened X anyway), a narrow Y from float32 X by a Cast after the op."""
    attrs, x, y_cast = spec.attrs, spec.x, 0
    if attrs.output_type == _FLOAT and spec.x.dtype != ir.DataType.FLOAT:
        x = op.Cast(spec.x, to=_FLOAT)
        x.type, x.shape = ir.TensorType(ir.DataType.FLOAT), spec.x.shape  # the model-local function reads X's type
        attrs = dataclasses.replace(attrs, output_type=0)
    elif attrs.output_type:
        attrs, y_cast = dataclasses.replace(attrs, output_type=0), attrs.output_type
    inputs = [x] if spec.scale is None else [x, spec.scale]
    y = op.op(L2_NORM.name, *inputs, _domain=DOMAIN, _version=OPSET_VERSION, **attrs.as_dict())
    return [op.Cast(y, to=y_cast) if y_cast else y]


def _unsupported_onnx_norm(spec: NormSpec, opset: int) -> str | None:
    if spec.skip is not None:
        return "L2Norm has no residual input"
    if spec.x.dtype is None or int(spec.x.dtype) not in (_FLOAT, *NARROW_TYPES):
        return f"X of type {type_name(spec.x.dtype)}: the L2Norm op takes fp32, fp16 or bf16"
    if spec.attrs.output_type not in (0, _FLOAT, *NARROW_TYPES):
        return f"Y of type {type_name(spec.attrs.output_type)}: the L2Norm op writes fp32, fp16 or bf16"
    return None


def _emit_onnx(op, spec: NormSpec, opset: int) -> list[ir.Value]:
    """LpNormalization(p=2) along the one normalised axis, then Mul by the scale (in X's type)."""
    y = op.op(_ONNX_OP, spec.x, _version=LP_NORMALIZATION.version, axis=-1, p=2)
    if spec.scale is not None:
        scale = spec.scale if spec.scale.dtype == spec.x.dtype else op.Cast(spec.scale, to=int(spec.x.dtype))  # type:
        # ignore[arg-type]
        y = op.Mul(y, scale)
    if spec.attrs.output_type:
        y = op.Cast(y, to=spec.attrs.output_type)
    return [y]


def _emit_onnx_in_layout(op, spec: NormSpec, perm: tuple[int, ...]) -> list[ir.Value] | None:
    """A norm over one non-trailing axis as LpNormalization along that axis of X itself (no Transposes), the
    Scale row reshaped to [C, 1, ..] so that it scales that axis; None (nothing built) over several axes."""
    if spec.attrs.axis != -1:
        return None
    axis, rank = perm[-1], len(perm)
    y = op.op(_ONNX_OP, spec.x, _version=LP_NORMALIZATION.version, axis=axis, p=2)
    if spec.scale is not None:
        y = op.Mul(y, _scale_along(op, spec, [-1] + [1] * (rank - 1 - axis)))
    if spec.attrs.output_type:
        y = op.Cast(y, to=spec.attrs.output_type)
    return [y]


def _scale_along(op, spec: NormSpec, shape: list[int]) -> ir.Value:
    """The Scale row in X's type viewed `shape` (it scales X's normalised axis): a new constant where it is one
    (nothing left to fold in the written model), else a Cast and a Reshape."""
    assert spec.scale is not None and spec.x.dtype is not None
    array = constants.constant_array(spec.scale)
    if array is not None:
        return op.Constant(value=ir.tensor(array.astype(np_dtype(int(spec.x.dtype))).reshape(shape)))
    scale = spec.scale if spec.scale.dtype == spec.x.dtype else op.Cast(spec.scale, to=int(spec.x.dtype))
    return op.Reshape(scale, op.Constant(value=ir.tensor(np.array(shape, np.int64))))


def _unsupported_onnx(spec: NormSpec, opset: int) -> str | None:
    if spec.skip is not None:
        return "LpNormalization has no residual input"
    if spec.attrs.epsilon != 0:
        return (
            f"ONNX's LpNormalization has no epsilon: the graph clamps the norm at {spec.attrs.epsilon:g} "
            "(F.normalize), which LpNormalization would leave out (a zero row gives NaN instead of 0)"
        )
    if spec.attrs.axis != -1:
        return f"ONNX's LpNormalization normalises along one axis; this norm spans the last {-spec.attrs.axis}"
    if spec.x.dtype is None or int(spec.x.dtype) not in (_FLOAT, *NARROW_TYPES, int(ir.DataType.DOUBLE)):
        return f"X of type {type_name(spec.x.dtype)}"
    return None


def read_native(node: ir.Node, opset: int) -> NormSpec | tuple[NormSpec, tuple[int, ...]]:
    """ONNX LpNormalization with p = 2 as the take-over reads it: L2Norm over its one axis with epsilon 0 (x / ||x||,
    computed in float32: never less accurate than the op in X's type), with the Transpose moving that axis last when
    it is not (family.NormFamily.native). ValueError says why a node is left."""
    x = node.inputs[0] if node.inputs else None
    if x is None or len(node.inputs) != 1:
        raise ValueError("it does not have its one input")
    p = node.attributes.get("p")
    if p is not None and p.value != 2:
        raise ValueError(f"p={p.value}: only the L2 norm (p=2) is L2Norm")
    if x.dtype is None or int(x.dtype) not in (_FLOAT, *NARROW_TYPES):
        raise ValueError(f"input element type {type_name(x.dtype)} is not fp32, fp16 or bf16")
    if x.shape is None:
        raise ValueError("its input's rank is unknown (run shape inference first)")
    rank = len(x.shape)
    attr = node.attributes.get("axis")
    axis = -1 if attr is None else int(attr.value)
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    spec = NormSpec(KIND, x, None, None, None, NormAttributes(axis=-1, epsilon=0.0), node.outputs[0])
    axis %= rank
    if axis == rank - 1:
        return spec
    # Another axis (channels first, axis=1 on [N, C, H, W]): written between the Transposes that move it last.
    return spec, (*(d for d in range(rank) if d != axis), axis)


def _rms_attrs(attrs: NormAttributes) -> NormAttributes:
    """AddedEpsilonAttributes as the RMSNorm family's attributes (NormOpAttributes only with epsilon_outside)."""
    shared = {f.name: getattr(attrs, f.name) for f in dataclasses.fields(NormAttributes)}
    outside = getattr(attrs, "epsilon_outside", 0)
    return NormOpAttributes(**shared, epsilon_outside=1) if outside else NormAttributes(**shared)


def _rms_spec(spec: NormSpec) -> NormSpec | None:
    """The RMSNorm spec an L2 norm with its epsilon added is, None for an L2Norm's own spec."""
    if not isinstance(spec.attrs, AddedEpsilonAttributes):
        return None
    graph_attrs = None if spec.graph_attrs is None else _rms_attrs(spec.graph_attrs)
    return dataclasses.replace(spec, kind=_RMS, attrs=_rms_attrs(spec.attrs), graph_attrs=graph_attrs)


def _lowering(target: str, own: Lowering) -> Lowering:
    """`own` for L2Norm's specs; for an L2 norm with its epsilon added, the RMSNorm family's lowering of `target`."""

    def unsupported(spec: NormSpec, opset: int) -> str | None:
        rms = _rms_spec(spec)
        if rms is None:
            return own.unsupported(spec, opset)
        prepared = targets.prepare(rms, target, opset)
        return prepared if isinstance(prepared, str) else None

    def emit(op, spec: NormSpec, opset: int) -> list[ir.Value]:
        rms = _rms_spec(spec)
        return own.emit(op, spec, opset) if rms is None else targets.emit(op, rms, target, opset)

    def in_layout(op, spec: NormSpec, perm: tuple[int, ...]) -> list[ir.Value] | None:
        if own.in_layout is None or _rms_spec(spec) is not None:
            return None
        return own.in_layout(op, spec, perm)

    return Lowering(emit=emit, unsupported=unsupported, in_layout=in_layout)


def _unsupported_ort(spec: NormSpec, opset: int) -> str | None:
    return _ORT_REASON


def _no_emit(op, spec: NormSpec, opset: int) -> list[ir.Value]:
    raise ValueError(_ORT_REASON)


_ORT_REASON = (
    "ONNX Runtime has no L2 normalisation op with an epsilon or a scale (it runs ONNX's LpNormalization, the onnx "
    "target's op)"
)

FAMILY = NormFamily(
    kind=KIND,
    summary="L2 normalisation: x * scale / max(||x||_2, eps) over the trailing dims",
    rules=(FusionRule("l2_norm_channels_first", KIND, channels_first=True), FusionRule("l2_norm", KIND)),
    reference=reference,
    lowerings={
        "onnx-norm": _lowering("onnx-norm", Lowering(emit=_emit_onnx_norm, unsupported=_unsupported_onnx_norm)),
        "onnx": _lowering(
            "onnx", Lowering(emit=_emit_onnx, unsupported=_unsupported_onnx, in_layout=_emit_onnx_in_layout)
        ),
        "ort": _lowering("ort", Lowering(emit=_no_emit, unsupported=_unsupported_ort)),
    },
    find=find,
    anchor_ops=frozenset({"Mul", "Div"}),
    sweep=-1,  # before the RMSNorm family reads a sum of squares with epsilon 0 as a mean square times a constant
    native={_ONNX_OP: read_native},
)


def _reduce_l2(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """ONNX ReduceL2 (axes as attribute or input, keepdims), accumulated in float64 for a float64 input."""
    x = inputs[0]
    assert x is not None
    attr = node.attributes.get("axes")
    axes = list(attr.value) if attr is not None else (None if len(inputs) < 2 or inputs[1] is None else inputs[1])
    keep = _keepdims(node)
    axis = None if axes is None or len(axes) == 0 else tuple(int(a) % x.ndim for a in np.asarray(axes).reshape(-1))
    wide = x.astype(np.float64)
    y = np.sqrt(np.sum(wide * wide, axis=axis, keepdims=keep))
    return y if x.dtype == np.float64 else y.astype(x.dtype)


def _lp_normalization(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    attr = node.attributes.get("axis")
    axis = -1 if attr is None else int(attr.value)
    wide = x.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = wide / np.sqrt(np.sum(wide * wide, axis=axis, keepdims=True))
    return y if x.dtype == np.float64 else y.astype(x.dtype)


# The proof evaluates the matched subgraph: it has to know the ops this family's matches contain.
evaluate.register_op("ReduceL2", _reduce_l2)
evaluate.register_op(_ONNX_OP, _lp_normalization)
