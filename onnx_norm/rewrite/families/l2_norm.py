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
folded into one Scale, which must be constant along every axis that is not normalised. Without a clamp the match
has epsilon 0 (`x / x.norm(...)`, CLIP's embeddings): a zero row is 0/0 = NaN in the graph and in the op alike.

The native ONNX LpNormalization (p = 2) is taken over with `--take-over-native` (`read_native`, epsilon 0).

Targets: `onnx-norm` (our op), `onnx` (LpNormalization, then Mul by the scale: only when the match has no epsilon,
as LpNormalization has none, and normalises one axis), `ort`: a reason (ONNX Runtime has no L2 op with an epsilon).
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
from onnx_norm.ops.schema import DOMAIN, OPSET_VERSION, NormAttributes
from onnx_norm.rewrite import constants, evaluate, match, structure
from onnx_norm.rewrite.family import FusionRule, Lowering, NormFamily
from onnx_norm.rewrite.reductions import reduction_axes
from onnx_norm.rewrite.spec import NormSpec
from onnx_norm.rewrite.structure import NearMiss

KIND = L2_NORM.kind
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
    eps: float  # the clamp on the norm (0: none)
    variant: str


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
        return _raw(value, dropped)
    inner = _stat(clamp[0], dropped)
    if inner is None or inner.eps != 0:
        return None
    eps = clamp[1] if inner.kind == "norm" else math.sqrt(clamp[1])
    return dataclasses.replace(inner, eps=eps, variant=f"{inner.variant} clamped by {node.op_type}")  # type:
    # ignore[union-attr]


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
    """The anchor's output, then each Mul or Div by a constant (or float Cast) that is its only reader, in turn:
    the candidates' ends, longest last."""
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
        if other is None or not constants.is_constant(other) or (node.op_type == "Div" and other is node.inputs[0]):
            break
        ends.append(node.outputs[0])
    return ends


def _region(y: ir.Value, x: ir.Value) -> list[ir.Node]:
    """Every node between `x` (and constants) and `y`; NearMiss when one of them reads something else or is read
    from outside."""
    nodes: list[ir.Node] = []
    stack = [y]
    while stack:
        value = stack.pop()
        if value is x or constants.is_constant(value):
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


def _scale_row(factors: structure.Factors, x: ir.Value, axes: tuple[int, ...]) -> np.ndarray | None:
    """The product's constants as one row over the normalised dims (float32), None when they are all 1; NearMiss when
    they vary along an axis that is not normalised."""
    array = constants.fold_product(factors.constants)
    if array is None:
        return None
    assert x.shape is not None
    rank = len(x.shape)
    if array.ndim > rank:
        raise NearMiss(f"the scale of shape {list(array.shape)} has more dims than the input (rank {rank})")
    padded = (1,) * (rank - array.ndim) + array.shape
    varying = [a - rank for a, d in enumerate(padded) if d != 1 and a - rank not in axes]
    if varying:
        raise NearMiss(
            f"the scale (shape {list(array.shape)}) varies along axes {varying}, not only along the normalised "
            f"axes {list(axes)}"
        )
    row = array.reshape(padded[rank + axes[0] :])
    while row.ndim > 1 and row.shape[0] == 1:
        row = row.reshape(row.shape[1:])
    if np.all(row == 1.0):
        return None
    return np.ascontiguousarray(row.astype(np.float32))


def _detached(array: np.ndarray, name: str) -> ir.Value:
    """A constant value not yet in any graph; the driver makes it an initializer (or a Constant in a function)."""
    tensor = ir.tensor(array, name=name)
    return ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)


def _candidate(end: ir.Value) -> match.Candidate | None:
    """The L2 norm ending at `end`, or None; NearMiss when the product divides by a norm but is not one."""
    found = _find_stat(end)
    if found is None:
        return None
    stat_value, stat = found
    x = structure.strip_lossless_steps(stat.x)
    if x.shape is None:
        raise NearMiss("the rank of the L2 norm's input is unknown", x)
    rank = len(x.shape)
    axes = tuple(stat.axes)
    if axes != tuple(range(-len(axes), 0)):
        raise NearMiss(f"the L2 norm is over axes {list(axes)}, not the trailing ones of its rank-{rank} input", x)

    def classify(value: ir.Value) -> str | None:
        if value is stat_value:
            return "stat"
        return "data" if value is x or structure.same_data(value, x) else None

    factors = structure.flatten(end, classify)
    wanted = {"data": 1, "stat": -1 if stat.kind == "norm" else Fraction(-1, 2)}
    if factors.leaves != wanted:
        powers = ", ".join(f"{k}^{v}" for k, v in factors.leaves.items())
        raise NearMiss(f"the product is {powers}, not x / ||x||", end)
    row = _scale_row(factors, x, axes)
    nodes = _region(end, x)
    attrs = NormAttributes(axis=axes[0], epsilon=stat.eps, output_type=_output_type(x, end))
    scale = None if row is None else _detached(row, f"{end.name or 'l2'}_scale")
    spec = NormSpec(KIND, x, None, scale, None, attrs, end)
    t = int(x.dtype) if x.dtype is not None else 0
    if t in NARROW_TYPES:  # the graph rounds each step; the op rounds once (casts.op_rounding, the proof checks)
        spec.graph_attrs = dataclasses.replace(attrs, normalized_type=t, multiply_type=t)
    return match.Candidate(
        spec=spec,
        nodes=nodes,
        axes=tuple(a % rank for a in axes),
        perm=None,
        new_constants={} if row is None else {"scale": row},
        variant=stat.variant + (" x scale" if row is not None else ""),
        cast_placement=f"{type_name(x.dtype)} in",
        x_value=x,
    )


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
    """The float64 reference (ops.l2_norm.l2_normalized) on the matched Scale."""
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


def read_native(node: ir.Node, opset: int) -> NormSpec:
    """ONNX LpNormalization with p = 2 as the take-over reads it: L2Norm over its one axis with epsilon 0 (x / ||x||,
    computed in float32: never less accurate than the op in X's type). ValueError says why a node is left."""
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
    if axis % rank != rank - 1:
        raise ValueError(f"axis {axis} is not the last of its rank-{rank} input (L2Norm normalises trailing dims)")
    return NormSpec(KIND, x, None, None, None, NormAttributes(axis=-1, epsilon=0.0), node.outputs[0])


_ORT_REASON = (
    "ONNX Runtime has no L2 normalisation op with an epsilon or a scale (it runs ONNX's LpNormalization, the onnx "
    "target's op)"
)

FAMILY = NormFamily(
    kind=KIND,
    summary="L2 normalisation: x * scale / max(||x||_2, eps) over the trailing dims",
    rules=(FusionRule("l2_norm", KIND),),
    reference=reference,
    lowerings={
        "onnx-norm": Lowering(emit=_emit_onnx_norm, unsupported=_unsupported_onnx_norm),
        "onnx": Lowering(emit=_emit_onnx, unsupported=_unsupported_onnx),
        "ort": _ORT_REASON,
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
