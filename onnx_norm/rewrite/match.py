"""Finding one norm that ends at a given node: structure first, then the safety conditions.

A norm is matched from its last node (the anchor) downwards:

1. The tail: from the anchor's output down through Casts, one bias Add of a constant, and multiplies or divides
   by constants, to the junction, the first Mul/Div whose operands are both computed.
2. The junction's value, flattened into a product of powers, must contain a leaf `stat + eps` with a negative
   exponent, where `stat` is a statistic a registered family recognises (families/) and `eps` a constant scalar.
3. Flattened again with the statistic's input known, the value must be exactly `data^1 * (stat + eps)^-1/2` times
   constants, where `data` is the centred input (LayerNorm) or the input (RMSNorm).
4. All nodes between the input and the anchor are removed: none may have consumers outside the match or be a
   graph output, except statistics the fused op also produces (mean, inverse std) and the input's own Casts,
   which are kept. Reductions cover exactly the normalised axes, scale and bias vary only along them.

The anchor is the end of the norm only if the tail cannot be extended by its single consumer: the driver visits
nodes in order, so a norm is matched at its last node, not at an earlier one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import FLOAT_TYPES, is_onnx_domain, type_name
from onnx_norm.ops.reference import np_dtype
from onnx_norm.ops.schema import NormAttributes
from onnx_norm.rewrite import casts, constants, distributed, family
from onnx_norm.rewrite.reductions import REDUCTIONS, is_float_cast, rank_of, row_mean
from onnx_norm.rewrite.spec import NormSpec, Statistic
from onnx_norm.rewrite.structure import (
    LAYOUT_OPS,
    Factors,
    NearMiss,
    flatten,
    is_centred,
    same_data,
    strip_casts,
    strip_nonnegative_clamp,
    strip_widening_casts,
)

#: Ops a norm can end with (Sub: the distributed LayerNorm without a bias, `x * s - mean * s`).
ANCHOR_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Cast"})
_MAX_TAIL = 12
_MAX_MATCH_NODES = 96


class _NotANorm(Exception):
    """The structure is not a norm at all (no near-miss to report)."""


@dataclasses.dataclass
class Candidate:
    """A matched norm, ready to be proven and rewritten."""

    spec: NormSpec
    nodes: list[ir.Node]  # nodes the fused op replaces
    axes: tuple[int, ...]  # reduced axes of the input (non-negative)
    perm: tuple[int, ...] | None  # channels-first: the Transpose that moves the normalised axes last
    new_constants: dict[str, np.ndarray]  # "scale"/"bias" that need a new constant in the graph
    variant: str
    cast_placement: str
    x_value: ir.Value  # the input of the norm before any residual Add was folded in
    proof_shape: list[int] | None = None  # input shape for the proof when the input has no shape
    kept: list[ir.Node] = dataclasses.field(default_factory=list)  # Casts of the input that others read too
    recast: list[ir.Node] = dataclasses.field(default_factory=list)  # kept Casts re-made from the fused Sum
    aliases: list[ir.Value] = dataclasses.field(default_factory=list)  # identical Casts of the input's source


@dataclasses.dataclass
class _TailOp:
    node: ir.Node
    role: str  # "cast", "scale", "bias"
    constant: ir.Value | None
    exponent: int = 1


def _other_parameter(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The scale or bias operand (`_parameter`) of a binary node whose other operand is `value`, if any."""
    a, b = node.inputs[0], node.inputs[1]
    other = b if a is value else a
    if other is value or other is None:
        return None
    return other if _parameter(other) else None


def _parameter(value: ir.Value) -> bool:
    """A scale or bias operand: a constant, or a weight the model takes at run time."""
    return constants.is_constant(value) or constants.is_runtime_parameter(value)


def _walk_tail(y: ir.Value) -> tuple[ir.Value, list[_TailOp]] | None:
    """Down from `y` to the junction; the tail ops are returned from the top (y) down."""
    tail: list[_TailOp] = []
    value = y
    seen_scale = False
    seen_bias = False
    for _ in range(_MAX_TAIL):
        node = value.producer()
        if node is None or not is_onnx_domain(node.domain) or len(node.outputs) != 1:
            return None
        op = node.op_type
        if is_float_cast(node) or op == "Identity":
            tail.append(_TailOp(node, "cast", None))
            value = node.inputs[0]  # type: ignore[assignment]
            continue
        if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
            return None
        a, b = node.inputs
        if op == "Sub":
            return (value, tail) if not (seen_bias or seen_scale) else None
        if op == "Add":
            if seen_bias or seen_scale:
                return None
            if not _parameter(a) and not _parameter(b):
                return value, tail  # a sum of two computed values: only the distributed LayerNorm ends here
            if _parameter(b):
                tail.append(_TailOp(node, "bias", b))
                value = a
            else:
                tail.append(_TailOp(node, "bias", a))
                value = b
            seen_bias = True
            continue
        if op == "Mul":
            if _parameter(b) and not _parameter(a):
                tail.append(_TailOp(node, "scale", b))
                value = a
                seen_scale = True
                continue
            if _parameter(a) and not _parameter(b):
                tail.append(_TailOp(node, "scale", a))
                value = b
                seen_scale = True
                continue
            return value, tail
        if op == "Div":
            if constants.is_constant(b) and not constants.is_constant(a):
                tail.append(_TailOp(node, "scale", b, exponent=-1))
                value = a
                seen_scale = True
                continue
            return value, tail
        return None
    return None


def _extends(y: ir.Value, tail: list[_TailOp]) -> bool:
    """True when the single consumer of `y` would continue the tail (so `y` is not the norm's end)."""
    if y.is_graph_output():
        return False
    consumers = {use.node for use in y.uses()}
    if len(consumers) != 1:
        return False
    (node,) = consumers
    if not is_onnx_domain(node.domain):
        return False
    if is_float_cast(node):
        return True
    has_bias = any(op.role == "bias" for op in tail)
    if has_bias or len(node.inputs) != 2:
        return False
    if node.op_type in ("Add", "Mul"):
        return _other_parameter(node, y) is not None
    if node.op_type == "Div":
        return node.inputs[0] is y and node.inputs[1] is not y and constants.is_constant(node.inputs[1])
    return False


def _statistic(stat: ir.Value, kinds: frozenset[str]) -> Statistic | None:
    """The first registered family's reading of `stat` as its statistic, among the families of `kinds`."""
    stat = strip_nonnegative_clamp(stat)
    for norm_family in family.families():
        if norm_family.statistic is not None and norm_family.kind in kinds:
            found = norm_family.statistic(stat)
            if found is not None:
                return found
    return None


def _stat_leaves(junction: ir.Value) -> list[ir.Value]:
    """Candidates for `statistic + eps` (or the statistic alone) that the junction's product reaches through
    multiplicative ops."""
    found: list[ir.Value] = []
    seen: set[ir.Value] = set()
    stack = [junction]
    while stack and len(seen) < 64:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        node = value.producer()
        if node is None or not is_onnx_domain(node.domain):
            continue
        if node.op_type in ("Add", "Sub", *REDUCTIONS) or row_mean(value) is not None:
            found.append(value)
        if node.op_type in ("Add", "Sub", *REDUCTIONS):
            continue
        if node.op_type in LAYOUT_OPS:
            if node.inputs[0] is not None:
                stack.append(node.inputs[0])
        elif node.op_type in ("Mul", "Div", "Sqrt", "Reciprocal", "Pow", "Identity") or is_float_cast(node):
            operands = node.inputs[:1] if node.op_type == "Pow" else node.inputs
            stack.extend(v for v in operands if v is not None and not constants.is_direct_constant(v))
    return found


def _data_classifier(statistic: Statistic, eps_sum: ir.Value):
    def classify(value: ir.Value) -> str | None:
        if value is eps_sum:
            return "stat"
        if statistic.centred:
            if is_centred(value, statistic.x, statistic.axes):
                return "data"
        elif same_data(value, statistic.x):
            return "data"
        return None

    return classify


def _exponent_text(exponent: Fraction) -> str:
    return str(exponent.numerator) if exponent.denominator == 1 else f"{exponent.numerator}/{exponent.denominator}"


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


def _twin_casts(x: ir.Value) -> list[ir.Value]:
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
    product = _fold_product(factors.constants)
    return product is None or bool(np.all(product == 1))


def _fold_product(factors: list[tuple[ir.Value, Fraction]]) -> np.ndarray | None:
    """The product of constant powers in float64, None when there is none."""
    try:
        return constants.fold_product(factors)
    except ValueError as err:
        raise NearMiss(str(err)) from err


def _row_constant(
    array: np.ndarray, x_shape: list | None, axes: tuple[int, ...], perm: tuple[int, ...] | None, what: str
) -> np.ndarray:
    """`array` as it broadcasts against one row (the normalised dims), or NearMiss when it varies across rows.

    With `x_shape` None (rank unknown, `axes` counted from the end) the row is the constant's trailing dims, which
    must then be the whole row: a constant that broadcasts inside a row of unknown size cannot be laid out."""
    if x_shape is None:
        k = len(axes)
        if array.ndim > k and any(d != 1 for d in array.shape[: array.ndim - k]):
            raise NearMiss(f"{what} varies across rows (shape {list(array.shape)}), not only along the normalised axes")
        row = array.reshape(array.shape[max(array.ndim - k, 0) :])
        if row.ndim < k or 1 in row.shape:
            raise NearMiss(f"{what} of shape {list(array.shape)} broadcasts inside a row whose size is unknown")
        return row
    rank = len(x_shape)
    if array.ndim > rank:
        raise NearMiss(f"{what} has more dims than the input")
    padded = array.reshape((1,) * (rank - array.ndim) + array.shape)
    x_shape = list(x_shape)
    for dim in range(rank):
        if dim not in axes and padded.shape[dim] != 1:
            raise NearMiss(f"{what} varies across rows (shape {list(array.shape)}), not only along the normalised axes")
        if dim in axes and not isinstance(x_shape[dim], int):
            # A symbolic normalised dim: the constant's own size is the only one the model runs with.
            if padded.shape[dim] == 1:
                raise NearMiss(
                    f"{what} of shape {list(array.shape)} broadcasts inside a row of symbolic size {x_shape[dim]}"
                )
            x_shape[dim] = padded.shape[dim]
        if dim in axes and padded.shape[dim] not in (1, x_shape[dim]):
            raise NearMiss(f"{what} shape {list(array.shape)} does not broadcast against the input")
    if perm is not None:
        padded = np.transpose(padded, perm)
        x_shape = [x_shape[p] for p in perm]
    k = len(axes)
    row_shape = tuple(x_shape[rank - k :])
    return np.broadcast_to(padded.reshape(padded.shape[rank - k :]), row_shape)


def _tensor_fits(value: ir.Value, row: np.ndarray) -> bool:
    """A direct constant the fused op can read as is: the row's shape, leading 1s of the row's shape removed."""
    if not constants.is_direct_constant(value) or value.shape is None:
        return False
    shape = tuple(value.shape)
    row_shape = tuple(row.shape)
    while row_shape and row_shape[0] == 1:
        row_shape = row_shape[1:]
    return shape in (tuple(row.shape), row_shape)


def find_norm(
    anchor: ir.Node,
    *,
    kinds: frozenset[str] | None = None,
    channels_first: bool = True,
    affine: AffineStrategy | None = None,
) -> Candidate | None:
    """The norm ending at `anchor`, None when there is none, NearMiss when one is there but unsafe to fuse.

    `kinds`: the families whose statistics to look for (default: every family with a statistic recogniser).
    `affine`: how scale and bias are read from the tail (default `default_affine`)."""
    if kinds is None:
        kinds = frozenset(f.kind for f in family.families() if f.statistic is not None)
    if anchor.op_type not in ANCHOR_OPS or not is_onnx_domain(anchor.domain) or len(anchor.outputs) != 1:
        return None
    y = anchor.outputs[0]
    walked = _walk_tail(y)
    if walked is None:
        return None
    junction, tail = walked
    if _extends(y, tail):
        return None
    junction_node = junction.producer()
    if junction_node is not None and junction_node.op_type in ("Add", "Sub"):
        if any(op.role != "cast" for op in tail):
            return None
        return _find_distributed(anchor, y, junction, tail, kinds, channels_first, affine)
    sums = _stat_leaves(junction)
    if not sums:
        return None

    def attempt(eps_sum: ir.Value, stat: ir.Value, eps_value: ir.Value | None) -> Candidate | None:
        statistic = _statistic(stat, kinds)
        if statistic is None:
            return None
        return _build(anchor, y, junction, tail, eps_sum, stat, eps_value, statistic, channels_first, affine=affine)

    return _first_candidate(sums, attempt)


def _eps_splits(eps_sum: ir.Value) -> list[tuple[ir.Value, ir.Value | None]]:
    """(statistic, epsilon) readings of a `stat + eps` candidate, either operand order, and the value alone (no
    epsilon at all: an exporter folded a tiny one away)."""
    producer = eps_sum.producer()
    splits: list[tuple[ir.Value, ir.Value | None]] = []
    if producer is not None and producer.op_type == "Add":
        a, b = producer.inputs
        if a is not None and b is not None:
            splits = [(a, b), (b, a)]
    splits.append((eps_sum, None))
    return splits


def _first_candidate(
    sums: list[ir.Value], attempt: Callable[[ir.Value, ir.Value, ir.Value | None], Candidate | None]
) -> Candidate | None:
    """The first candidate `attempt` builds over every (stat + eps, stat, eps) reading; when none does, the first
    near-miss met on the way is raised, or None returned."""
    first_miss: NearMiss | None = None
    for eps_sum in sums:
        for stat, eps_value in _eps_splits(eps_sum):
            try:
                found = attempt(eps_sum, stat, eps_value)
            except _NotANorm:
                continue
            except NearMiss as miss:
                first_miss = first_miss or miss
                continue
            if found is not None:
                return found
    if first_miss is not None:
        raise first_miss
    return None


def _find_distributed(
    anchor: ir.Node,
    y: ir.Value,
    junction: ir.Value,
    tail: list[_TailOp],
    kinds: frozenset[str],
    channels_first: bool,
    affine: AffineStrategy | None,
) -> Candidate | None:
    """The LayerNorm written as `x * s + (bias - mean * s)` (distributed.py), built as `(x - mean) * s + bias`."""
    terms = distributed.signed_terms(junction)
    if terms is None:
        return None
    sums: list[ir.Value] = []
    for term, _ in terms:
        if not constants.is_constant(term):
            sums += [v for v in _stat_leaves(term) if v not in sums]
    sum_node = junction.producer()
    assert sum_node is not None

    def attempt(eps_sum: ir.Value, stat: ir.Value, eps_value: ir.Value | None) -> Candidate | None:
        statistic = _statistic(stat, kinds)
        if statistic is None:
            return None
        form = distributed.analyse(terms, statistic, eps_sum)
        if form is None:
            return None
        bias_tail = [] if form.bias is None else [_TailOp(sum_node, "bias", form.bias)]
        return _build(
            anchor,
            y,
            form.x_term,
            tail + bias_tail,
            eps_sum,
            stat,
            eps_value,
            statistic,
            channels_first,
            factors=form.factors,
            affine=affine,
        )

    return _first_candidate(sums, attempt)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the normalised axes are: non-negative `axes` when the rank is known (counted from the end when not),
    the Transpose that moves them last for a channels-first norm, and the input's shape (None when unknown)."""

    axes: tuple[int, ...]
    from_end: tuple[int, ...]
    rank: int | None
    x_shape: list | None
    perm: tuple[int, ...] | None


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


@dataclasses.dataclass
class Affine:
    """Scale and bias as the fused op reads them: graph values, or constants to make (`new_constants`)."""

    scale: ir.Value | None
    bias: ir.Value | None
    new_constants: dict[str, np.ndarray]
    proof_shape: list[int] | None  # the input shape to prove with when the input's rank is unknown


@dataclasses.dataclass(frozen=True)
class AffineInputs:
    """What an affine strategy reads: the tail's scale factors and bias, the constants of the normalised
    product, the statistic's correction, the layout and a name for new constants."""

    scale_terms: list[tuple[ir.Value, Fraction]]
    bias: ir.Value | None
    correction: float
    layout: Layout
    name: str


#: Reads scale and bias from the tail; raises NearMiss when the fused op cannot take them.
AffineStrategy = Callable[[AffineInputs], Affine]


def _build(
    anchor: ir.Node,
    y: ir.Value,
    junction: ir.Value,
    tail: list[_TailOp],
    eps_sum: ir.Value,
    stat: ir.Value,
    eps_value: ir.Value | None,
    statistic: Statistic,
    channels_first: bool,
    factors: Factors | None = None,
    affine: AffineStrategy | None = None,
) -> Candidate:
    """The candidate for the normalised value `junction` (flattened here unless `factors` are given) and `tail`."""
    epsilon = _epsilon(eps_value, statistic)
    if factors is None:
        factors = flatten(junction, _data_classifier(statistic, eps_sum))
    _check_product(factors, junction)
    x = strip_widening_casts(statistic.x)
    _check_types(x, y)
    layout = _layout(x, y, stat, statistic, channels_first)
    runtime = {op.constant for op in tail if constants.is_runtime_parameter(op.constant)}
    replaced = _replaced(y, x, statistic, layout, eps_sum, runtime)
    scale_terms = [(op.constant, Fraction(op.exponent)) for op in tail if op.role == "scale"]
    bias_op = next((op for op in tail if op.role == "bias"), None)
    inputs = AffineInputs(
        scale_terms=[(v, e) for v, e in scale_terms + factors.constants if v is not None and not _is_one(v)],
        bias=None if bias_op is None else bias_op.constant,
        correction=statistic.correction,
        layout=layout,
        name=anchor.name or "norm",
    )
    params = (affine or default_affine)(inputs)
    rounding = _rounding(x, y, junction, tail, factors)
    graph_attrs = NormAttributes(
        axis=-len(layout.axes),
        epsilon=epsilon,
        normalized_type=rounding.normalized_type,
        multiply_type=rounding.multiply_type,
        output_type=rounding.output_type,
    )
    op = casts.op_rounding(rounding)
    attrs = dataclasses.replace(
        graph_attrs, normalized_type=op.normalized_type, multiply_type=op.multiply_type, output_type=op.output_type
    )
    spec = NormSpec(
        statistic.kind,
        x,
        None,
        params.scale,
        params.bias,
        attrs,
        y,
        mean=replaced.mean,
        inv_std=replaced.inv_std,
        graph_attrs=graph_attrs,
    )
    return Candidate(
        spec=spec,
        nodes=replaced.nodes,
        axes=layout.axes,
        perm=layout.perm,
        new_constants=params.new_constants,
        variant=statistic.variant + ("" if layout.perm is None else ", channels first"),
        cast_placement=casts.describe(x.dtype, statistic.x.dtype, rounding),
        x_value=x,
        aliases=replaced.aliases,
        proof_shape=params.proof_shape,
        kept=replaced.kept,
    )


def _epsilon(eps_value: ir.Value | None, statistic: Statistic) -> float:
    """The fused op's epsilon: the constant added to the statistic, divided by its correction."""
    if eps_value is None:
        return 0.0
    eps_array = constants.constant_array(eps_value)
    if eps_array is None:
        raise NearMiss(f"epsilon {eps_value.name!r} is not a constant", eps_value)
    if eps_array.size != 1:
        raise NearMiss(f"epsilon {eps_value.name!r} has {eps_array.size} elements, not one", eps_value)
    epsilon = float(np.asarray(eps_array, dtype=np.float64).reshape(()))
    if not np.isfinite(epsilon) or epsilon < 0:
        raise NearMiss(f"epsilon {epsilon} is not a non-negative number", eps_value)
    return epsilon / statistic.correction  # sqrt(c * var + eps) = sqrt(c) * sqrt(var + eps / c)


def _check_product(factors: Factors, junction: ir.Value) -> None:
    """The normalised value must be data^1 * (stat + eps)^-1/2 times constants."""
    data_exp = factors.leaves.get("data", Fraction(0))
    stat_exp = factors.leaves.get("stat", Fraction(0))
    if data_exp == 0:
        raise _NotANorm  # e.g. the reciprocal square root alone, before it meets the input
    if data_exp != 1 or stat_exp != Fraction(-1, 2):
        raise NearMiss(
            f"computes input^{_exponent_text(data_exp)} * (statistic + eps)^{_exponent_text(stat_exp)}, "
            "not input * (statistic + eps)^-1/2",
            junction,
        )


def _check_types(x: ir.Value, y: ir.Value) -> None:
    if x.dtype not in FLOAT_TYPES:
        raise NearMiss(f"input type {type_name(x.dtype)} is not supported by the fused ops", x)
    if y.dtype not in FLOAT_TYPES:
        raise NearMiss(f"output type {type_name(y.dtype)} is not supported by the fused ops", y)


def _layout(x: ir.Value, y: ir.Value, stat: ir.Value, statistic: Statistic, channels_first: bool) -> Layout:
    """The normalised axes: contiguous, trailing (or moved last by a Transpose when `channels_first`), static."""
    from_end = statistic.axes
    k = len(from_end)
    if list(from_end) != list(range(from_end[0], from_end[0] + k)):
        raise NearMiss(f"reduction axes {list(from_end)} are not contiguous", stat)
    rank = rank_of(x)
    if rank is None:
        # No shape (inference gave up after a computed Reshape): axes counted from the end still say which dims
        # are normalised, and scale/bias give their sizes.
        if from_end[-1] != -1:
            raise NearMiss(f"reduction axes {list(from_end)} are not trailing and the rank of {x.name!r} is unknown", x)
        return Layout(from_end, from_end, None, None, None)
    assert x.shape is not None
    x_shape = list(x.shape)
    axes = tuple(a + rank for a in from_end)
    if axes[0] < 0:
        raise NearMiss(f"reduction axes {list(from_end)} exceed the rank {rank} of {x.name!r}", stat)
    perm = None
    if axes[-1] != rank - 1:
        if not channels_first:
            raise NearMiss(f"reduction axes {list(axes)} are not the trailing axes of a rank-{rank} input", stat)
        perm = tuple(d for d in range(rank) if d not in axes) + axes
    # Symbolic normalised dims are fine: the fused op reads the row size at run time, a constant scale or bias pins
    # it (`_row_constant`) and the proof picks a size (prove.py).
    if y.shape is not None and len(y.shape) != rank:
        raise NearMiss("the output does not have the input's rank", y)
    return Layout(axes, from_end, rank, x_shape, perm)


def _replaced(
    y: ir.Value, x: ir.Value, statistic: Statistic, layout: Layout, eps_sum: ir.Value, runtime: set[ir.Value]
) -> Replaced:
    """The nodes between the input and `y`, less what must stay because something else reads it; `runtime`: the
    scale and bias the model takes at run time, which the fused op reads like the input."""
    strip_all = strip_casts(statistic.x)
    twins = _twin_casts(x)
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

    def __init__(self, nodes, y, x, statistic: Statistic, layout: Layout, eps_sum: ir.Value) -> None:
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


def default_affine(inputs: AffineInputs) -> Affine:
    """`runtime_rows` when the model takes a scale or bias at run time, else `constant_rows`."""
    terms = [v for v, _ in inputs.scale_terms] + ([inputs.bias] if inputs.bias is not None else [])
    if any(not constants.is_constant(v) for v in terms):
        return runtime_rows(inputs)
    return constant_rows(inputs)


def runtime_rows(inputs: AffineInputs) -> Affine:
    """A scale and/or bias the model takes at run time (`constants.is_runtime_parameter`), read by the fused op as
    they are: each must be exactly one row (the normalised dims), the scale the only factor; a constant beside one
    is made a row of the run-time one's type (the fused op reads Scale and Bias in one type)."""
    layout = inputs.layout
    if layout.perm is not None or layout.x_shape is None:
        raise NearMiss("a run-time scale or bias needs trailing normalised axes of known rank")
    row = tuple(layout.x_shape[a] for a in layout.axes)
    scale = next((v for v, _ in inputs.scale_terms if not constants.is_constant(v)), None)
    if scale is not None and (len(inputs.scale_terms) != 1 or inputs.scale_terms[0][1] != 1 or inputs.correction != 1):
        raise NearMiss("a run-time scale multiplied with other factors cannot be the fused op's Scale", scale)
    bias = inputs.bias if inputs.bias is not None and not constants.is_constant(inputs.bias) else None
    for value in (scale, bias):
        if value is not None and tuple(value.shape or ()) != row:
            raise NearMiss(
                f"run-time {value.name!r} of shape {list(value.shape or ())} is not one row {list(row)}", value
            )
    if scale is not None and bias is not None and scale.dtype != bias.dtype:
        raise NearMiss("run-time scale and bias have different element types", bias)
    runtime_type = (scale or bias).dtype  # type: ignore[union-attr]
    made = {"scale": _scale_row(inputs)[0] if scale is None else None}
    made["bias"] = _bias_row(inputs)[0] if bias is None else None
    new_constants = {
        k: np.ascontiguousarray(a.astype(np_dtype(int(runtime_type)))) for k, a in made.items() if a is not None
    }
    if "scale" in new_constants:
        scale = _detached_constant(new_constants["scale"], f"{inputs.name}_scale")
    if "bias" in new_constants:
        bias = _detached_constant(new_constants["bias"], f"{inputs.name}_bias")
    return Affine(scale, bias, new_constants, None)


def constant_rows(inputs: AffineInputs) -> Affine:
    """The default affine: scale and bias are constants (folded when computed) that vary only along the normalised
    axes, in one element type (widened when the graph's differ; exact for fp16/bf16)."""
    layout = inputs.layout
    row_scale, scale_value, scale_dtype = _scale_row(inputs)
    row_bias, bias_value, bias_dtype = _bias_row(inputs)
    new_constants = {}
    if row_scale is not None and scale_value is None:
        new_constants["scale"] = row_scale
    if row_bias is not None and bias_value is None:
        new_constants["bias"] = row_bias
    const_type = _common_type(
        scale_dtype if row_scale is not None else None, bias_dtype if row_bias is not None else None
    )
    if row_scale is not None and scale_value is not None and scale_value.dtype != const_type:
        new_constants["scale"], scale_value = row_scale, None
    if row_bias is not None and bias_value is not None and bias_value.dtype != const_type:
        new_constants["bias"], bias_value = row_bias, None
    for key, array in list(new_constants.items()):
        new_constants[key] = np.ascontiguousarray(
            array.astype(np.float64).astype(np.float32).astype(np_dtype(int(const_type)))
        )
    if "scale" in new_constants:
        scale_value = _detached_constant(new_constants["scale"], f"{inputs.name}_scale")
    if "bias" in new_constants:
        bias_value = _detached_constant(new_constants["bias"], f"{inputs.name}_bias")
    proof_shape = None
    if layout.x_shape is None:
        row_shapes = {tuple(r.shape) for r in (row_scale, row_bias) if r is not None}
        if len(row_shapes) > 1:
            raise NearMiss(f"scale and bias have different shapes {sorted(row_shapes)}")
        # Without scale or bias the row size is unknown; a mean-based norm computes the same formula at any size.
        proof_shape = [2, 3, *(row_shapes.pop() if row_shapes else (16,) * len(layout.axes))]
    return Affine(scale_value, bias_value, new_constants, proof_shape)


def _scale_row(inputs: AffineInputs) -> tuple[np.ndarray | None, ir.Value | None, ir.DataType | None]:
    """(the scale as one row, the graph value the op can read as is or None, its element type)."""
    terms, layout = inputs.scale_terms, inputs.layout
    scale_array = _fold_product(terms)
    if inputs.correction != 1.0:  # the sqrt(c) taken out of the square root
        correction = np.asarray(inputs.correction**-0.5)
        scale_array = correction if scale_array is None else scale_array * correction
    dtype = _constant_dtype([v for v, _ in terms])
    if scale_array is None:
        return None, None, dtype
    row = _row_constant(scale_array, layout.x_shape, layout.axes, layout.perm, "scale")
    if np.all(row == 1.0) and not _pins_a_dim(layout):
        return None, None, dtype
    alone = len(terms) == 1 and terms[0][1] == 1 and inputs.correction == 1.0
    if layout.perm is None and alone and _tensor_fits(terms[0][0], row):
        return row, terms[0][0], dtype
    return row, None, dtype


def _bias_row(inputs: AffineInputs) -> tuple[np.ndarray | None, ir.Value | None, ir.DataType | None]:
    bias, layout = inputs.bias, inputs.layout
    if bias is None:
        return None, None, None
    array = constants.constant_array(bias)
    if array is None:
        raise NearMiss("bias is not constant", bias)
    row = _row_constant(array.astype(np.float64), layout.x_shape, layout.axes, layout.perm, "bias")
    if np.all(row == 0.0) and not _pins_a_dim(layout):
        return None, None, bias.dtype
    if layout.perm is None and _tensor_fits(bias, row):
        return row, bias, bias.dtype
    return row, None, bias.dtype


def _pins_a_dim(layout: Layout) -> bool:
    """Whether a constant row is the only size of a symbolic normalised dim (kept even when it scales nothing: the
    model runs only at that size, and the proof reads it from the row)."""
    return layout.x_shape is not None and not all(isinstance(layout.x_shape[a], int) for a in layout.axes)


def _rounding(x: ir.Value, y: ir.Value, junction: ir.Value, tail: list[_TailOp], factors: Factors) -> casts.Rounding:
    """Where the graph rounds between the normalised value and the output (casts.py)."""
    steps = [casts.TailStep(op.role, op.node.outputs[0].dtype) for op in reversed(tail)]
    inner = _fold_product(factors.constants)
    scale_inside = inner is not None and not bool(np.all(inner == 1.0))
    return casts.infer_rounding(x.dtype, junction.dtype, steps, y.dtype, scale_inside=scale_inside)


def _is_one(value: ir.Value) -> bool:
    """A constant that is all ones (the 1 of TorchScript's `Div(1, Sqrt(..))`), which scales nothing."""
    array = constants.constant_array(value)
    return array is not None and array.size <= 1 and bool(np.all(array == 1))


def _constant_dtype(values: list[ir.Value]) -> ir.DataType | None:
    types = {v.dtype for v in values if v.dtype is not None}
    if len(types) == 1:
        return types.pop()
    return ir.DataType.FLOAT if types else None


def _common_type(a: ir.DataType | None, b: ir.DataType | None) -> ir.DataType:
    types = {t for t in (a, b) if t is not None}
    if len(types) == 1:
        only = types.pop()
        return only if only in FLOAT_TYPES else ir.DataType.FLOAT
    return ir.DataType.FLOAT


def _detached_constant(array: np.ndarray, name: str) -> ir.Value:
    """A constant value not yet in any graph; the rewrite turns it into an initializer or a Constant node."""
    tensor = ir.tensor(array, name=name)
    return ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
