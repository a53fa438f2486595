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

The steps live in their own modules and share one state (match_state.py: `MatchState`, `StatReading`, `Layout`):
the tail walk (match_tail.py), the outside-readers check (match_outside.py) and the affine strategies
(match_affine.py); this module reads the statistic, checks the product and the layout, and builds the candidate.
The names families use are all importable from here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import FLOAT_TYPES, is_onnx_domain, type_name
from onnx_norm.ops.schema import NormAttributes, NormOpAttributes
from onnx_norm.rewrite import casts, constants, distributed, family
from onnx_norm.rewrite.candidate import Candidate
from onnx_norm.rewrite.match_affine import (
    Affine,
    AffineInputs,
    AffineStrategy,
    constant_rows,
    default_affine,
    runtime_rows,
)
from onnx_norm.rewrite.match_outside import Replaced, replaced, twin_casts
from onnx_norm.rewrite.match_state import Layout, MatchState, StatReading, TailOp, fold_product
from onnx_norm.rewrite.match_tail import extends, walk_tail
from onnx_norm.rewrite.reductions import REDUCTIONS, is_float_cast, rank_of, restores_kept_dims, row_mean
from onnx_norm.rewrite.spec import NormSpec, Statistic
from onnx_norm.rewrite.structure import (
    LAYOUT_OPS,
    Factors,
    NearMiss,
    first_found,
    flatten,
    is_centred,
    same_data,
    strip_lossless_steps,
    strip_nonnegative_clamp,
)

__all__ = ["ANCHOR_OPS", "Affine", "AffineInputs", "AffineStrategy", "Candidate", "Layout", "MatchState"]
__all__ += ["Replaced", "StatReading", "constant_rows", "default_affine", "find_norm", "norm_layout", "runtime_rows"]
__all__ += ["twin_casts"]

#: Ops a norm can end with (Sub: the distributed LayerNorm without a bias, `x * s - mean * s`).
ANCHOR_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Cast"})


class _NotANorm(Exception):
    """The structure is not a norm at all (no near-miss to report)."""


def _statistic(stat: ir.Value, kinds: frozenset[str]) -> Statistic | None:
    """The first registered family's reading of `stat` as its statistic, among the families of `kinds`."""
    core, restorers = _statistic_core(stat)
    for norm_family in family.families():
        if norm_family.statistic is not None and norm_family.kind in kinds:
            found = norm_family.statistic(core)
            if found is not None and all(restores_kept_dims(v, found.x, found.axes) for v in restorers):
                return found
    return None


def _statistic_core(stat: ir.Value) -> tuple[ir.Value, list[ir.Value]]:
    """`stat` under the steps on top of it that change none of its values, in any order and number: a clamp at
    zero (`strip_nonnegative_clamp`), an Identity, and the Reshape/Expand/Unsqueeze that restores the dims the
    reductions dropped (jax2tf's `expand_dims` to a shape computed from `Shape(x)`, after Flax's `Max(0, var)` or
    before it); also the outputs of those layout steps, which must give the kept-dims layout where shape inference
    knows it (the proof evaluates the graph's own shape arithmetic where it does not)."""
    restorers: list[ir.Value] = []
    for _ in range(8):
        unclamped = strip_nonnegative_clamp(stat)
        if unclamped is not stat:
            stat = unclamped
            continue
        node = stat.producer()
        if node is None or not is_onnx_domain(node.domain) or not node.inputs or node.inputs[0] is None:
            break
        if node.op_type in LAYOUT_OPS:
            restorers.append(stat)
        elif node.op_type != "Identity":
            break
        stat = node.inputs[0]
    return stat, restorers


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
    walked = walk_tail(y)
    if walked is None:
        return None
    junction, tail = walked
    if extends(y, tail):
        return None
    state = MatchState(anchor, y, junction, tail, kinds, channels_first, affine)
    junction_node = junction.producer()
    if junction_node is not None and junction_node.op_type in ("Add", "Sub"):
        if any(op.role != "cast" for op in tail):
            return None
        return _find_distributed(state)
    sums = _stat_leaves(junction)
    if not sums:
        return None

    def attempt(eps_sum: ir.Value, stat: ir.Value, eps_value: ir.Value | None) -> Candidate | None:
        reading = _reading(eps_sum, stat, eps_value, kinds)
        return None if reading is None else _build(state, reading)

    return _first_candidate(sums, attempt)


def _reading(
    eps_sum: ir.Value, stat: ir.Value, eps_value: ir.Value | None, kinds: frozenset[str]
) -> StatReading | None:
    """`eps_sum` read as `stat + eps` with `stat` a family's statistic, or as `sqrt(stat) + eps` (epsilon added to
    the standard deviation: `(x - mean) / (x.std() + eps)`); None when neither is."""
    statistic = _statistic(stat, kinds)
    if statistic is not None:
        return StatReading(eps_sum, stat, eps_value, statistic)
    root = _square_root_of(stat) if eps_value is not None else None
    statistic = None if root is None else _statistic(root, kinds)
    if root is None or statistic is None:
        return None
    return StatReading(eps_sum, root, eps_value, statistic, epsilon_outside=True)


def _square_root_of(value: ir.Value) -> ir.Value | None:
    """v for `Sqrt(v)` or `Pow(v, 0.5)`, else None."""
    node = value.producer()
    if node is None or not is_onnx_domain(node.domain) or not node.inputs or node.inputs[0] is None:
        return None
    if node.op_type == "Sqrt":
        return node.inputs[0]
    if node.op_type == "Pow" and len(node.inputs) == 2 and node.inputs[1] is not None:
        exponent = constants.constant_array(node.inputs[1])
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 0.5:
            return node.inputs[0]
    return None


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

    def reading(eps_sum: ir.Value, stat: ir.Value, eps_value: ir.Value | None) -> Candidate | None:
        try:
            return attempt(eps_sum, stat, eps_value)
        except _NotANorm:
            return None

    return first_found(
        functools.partial(reading, eps_sum, stat, eps_value)
        for eps_sum in sums
        for stat, eps_value in _eps_splits(eps_sum)
    )


def _find_distributed(state: MatchState) -> Candidate | None:
    """The LayerNorm written as `x * s + (bias - mean * s)` (distributed.py), built as `(x - mean) * s + bias`."""
    terms = distributed.signed_terms(state.junction)
    if terms is None:
        return None
    sums: list[ir.Value] = []
    for term, _ in terms:
        if not constants.is_constant(term):
            sums += [v for v in _stat_leaves(term) if v not in sums]
    sum_node = state.junction.producer()
    assert sum_node is not None

    def attempt(eps_sum: ir.Value, stat: ir.Value, eps_value: ir.Value | None) -> Candidate | None:
        reading = _reading(eps_sum, stat, eps_value, state.kinds)
        if reading is None or reading.epsilon_outside:  # distributed.analyse reads (stat + eps)^-1/2 only
            return None
        form = distributed.analyse(terms, reading.statistic, eps_sum)
        if form is None:
            return None
        bias_tail = [] if form.bias is None else [TailOp(sum_node, "bias", form.bias)]
        term_state = dataclasses.replace(state, junction=form.x_term, tail=state.tail + bias_tail)
        return _build(term_state, reading, form.factors)

    return _first_candidate(sums, attempt)


def _build(state: MatchState, reading: StatReading, factors: Factors | None = None) -> Candidate:
    """The candidate for the normalised value `state.junction` (flattened here unless `factors` are given) and
    `state.tail`, with the statistic of `reading`."""
    statistic = reading.statistic
    epsilon = _epsilon(reading.eps_value, statistic, reading.epsilon_outside)
    if factors is None:
        factors = flatten(state.junction, _data_classifier(statistic, reading.eps_sum))
    _check_product(factors, state.junction, reading.epsilon_outside)
    x = strip_lossless_steps(statistic.x)
    _check_types(x, state.y)
    layout = norm_layout(x, state.y, statistic.axes, reading.stat, state.channels_first)
    runtime = {op.constant for op in state.tail if constants.is_runtime_parameter(op.constant)}
    removed = replaced(state.y, x, statistic, layout, reading.eps_sum, runtime)
    params = (state.affine or default_affine)(_affine_inputs(state, statistic, layout, factors))
    rounding = _rounding(x, state.y, state.junction, state.tail, factors)
    # The built-in norm ops' attributes only when the norm needs one of their own (other ops built on an inner
    # norm then see it: NormAttributes.unsupported_by).
    attributes = NormOpAttributes if reading.epsilon_outside else NormAttributes
    graph_attrs = attributes(
        axis=-len(layout.axes),
        epsilon=epsilon,
        normalized_type=rounding.normalized_type,
        multiply_type=rounding.multiply_type,
        output_type=rounding.output_type,
        **({"epsilon_outside": 1} if reading.epsilon_outside else {}),
    )
    op = casts.op_rounding(rounding)
    attrs = dataclasses.replace(
        graph_attrs, normalized_type=op.normalized_type, multiply_type=op.multiply_type, output_type=op.output_type
    )
    spec = NormSpec(statistic.kind, x, None, params.scale, params.bias, attrs, state.y)
    spec.mean, spec.inv_std, spec.graph_attrs = removed.mean, removed.inv_std, graph_attrs
    return Candidate(
        spec=spec,
        nodes=removed.nodes,
        axes=layout.axes,
        perm=layout.perm,
        new_constants=params.new_constants,
        variant=statistic.variant + ("" if layout.perm is None else ", channels first"),
        cast_placement=casts.describe(x.dtype, statistic.x.dtype, rounding),
        x_value=x,
        aliases=removed.aliases,
        proof_shape=params.proof_shape,
        kept=removed.kept,
    )


def _affine_inputs(state: MatchState, statistic: Statistic, layout: Layout, factors: Factors) -> AffineInputs:
    """What the affine strategy reads: the tail's scale factors with the product's constants, and the bias."""
    scale_terms = [(op.constant, Fraction(op.exponent)) for op in state.tail if op.role == "scale"]
    bias_op = next((op for op in state.tail if op.role == "bias"), None)
    return AffineInputs(
        scale_terms=[(v, e) for v, e in scale_terms + factors.constants if v is not None and not _is_one(v)],
        bias=None if bias_op is None else bias_op.constant,
        correction=statistic.correction,
        layout=layout,
        name=state.anchor.name or "norm",
    )


def _epsilon(eps_value: ir.Value | None, statistic: Statistic, outside: bool = False) -> float:
    """The fused op's epsilon: the constant added to the statistic (to its square root when `outside`), divided by
    its correction (by the correction's square root when `outside`)."""
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
    if outside:  # sqrt(c * var) + eps = sqrt(c) * (sqrt(var) + eps / sqrt(c))
        return epsilon / statistic.correction**0.5
    return epsilon / statistic.correction  # sqrt(c * var + eps) = sqrt(c) * sqrt(var + eps / c)


def _check_product(factors: Factors, junction: ir.Value, outside: bool = False) -> None:
    """The normalised value must be data^1 * (stat + eps)^-1/2 (`outside`: (sqrt(stat) + eps)^-1) times constants."""
    data_exp = factors.leaves.get("data", Fraction(0))
    stat_exp = factors.leaves.get("stat", Fraction(0))
    if data_exp == 0:
        raise _NotANorm  # e.g. the reciprocal square root alone, before it meets the input
    leaf, wanted = ("(sqrt(statistic) + eps)", Fraction(-1)) if outside else ("(statistic + eps)", Fraction(-1, 2))
    if data_exp != 1 or stat_exp != wanted:
        raise NearMiss(
            f"computes input^{_exponent_text(data_exp)} * {leaf}^{_exponent_text(stat_exp)}, "
            f"not input * {leaf}^{_exponent_text(wanted)}",
            junction,
        )


def _check_types(x: ir.Value, y: ir.Value) -> None:
    if x.dtype not in FLOAT_TYPES:
        raise NearMiss(f"input type {type_name(x.dtype)} is not supported by the fused ops", x)
    if y.dtype not in FLOAT_TYPES:
        raise NearMiss(f"output type {type_name(y.dtype)} is not supported by the fused ops", y)


def norm_layout(x: ir.Value, y: ir.Value, from_end: tuple[int, ...], stat: ir.Value, channels_first: bool) -> Layout:
    """The normalised axes `from_end` (counted from the end) of `x`: contiguous, trailing (or moved last by a
    Transpose when `channels_first`: the driver writes the fused op between two Transposes), static; `stat` is the
    value a near-miss points at. The one home of the channels-first layout, also for the families' own matchers."""
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


def _rounding(x: ir.Value, y: ir.Value, junction: ir.Value, tail: list[TailOp], factors: Factors) -> casts.Rounding:
    """Where the graph rounds between the normalised value and the output (casts.py)."""
    steps = [casts.TailStep(op.role, op.node.outputs[0].dtype) for op in reversed(tail)]
    inner = fold_product(factors.constants)
    scale_inside = inner is not None and not bool(np.all(inner == 1.0))
    return casts.infer_rounding(x.dtype, junction.dtype, steps, y.dtype, scale_inside=scale_inside)


def _is_one(value: ir.Value) -> bool:
    """A constant that is all ones (the 1 of TorchScript's `Div(1, Sqrt(..))`), which scales nothing."""
    array = constants.constant_array(value)
    return array is not None and array.size <= 1 and bool(np.all(array == 1))
