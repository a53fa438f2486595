"""Structural helpers shared by the norm matchers: casts, squares, products of powers.

A normalised value is a product of powers: `(x - mean)^1 * (var + eps)^-1/2 * scale`, however the exporter spells
it (`Div(d, Sqrt(v))`, `Mul(d, Reciprocal(Sqrt(v)))`, `Mul(d, Div(1, Sqrt(v)))`, `Pow(v, -0.5)`, the scale before or
after the division, operands in any order). `flatten` turns such a tree into its factors and their exponents, so
that one check covers all of these spellings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import TypeVar

import onnx_ir as ir

from onnx_norm.dtypes import NARROW_TYPES, is_onnx_domain
from onnx_norm.rewrite import constants
from onnx_norm.rewrite.reductions import is_float_cast, row_mean

_Found = TypeVar("_Found")

_WIDTH = {
    ir.DataType.FLOAT16: 16,
    ir.DataType.BFLOAT16: 16,
    ir.DataType.FLOAT: 32,
    ir.DataType.DOUBLE: 64,
}


class NearMiss(Exception):
    """A candidate that looks like a norm but must not be rewritten; the message says why. `error`: the type of the
    exception when onnx-norm itself failed on the candidate (`internal_error`), empty when the graph is the reason."""

    def __init__(self, reason: str, *values: ir.Value | ir.Node | None, error: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.values = [v for v in values if v is not None]
        self.error = error


def internal_error(what: str, err: Exception) -> NearMiss:
    """The near-miss for an exception raised while matching, proving or rewriting a candidate: a bug in onnx-norm,
    not a property of the graph. It is reported (and the candidate skipped, never fatal) with the exception's type
    in `error`, so that the report and the tests tell it from the near-misses the graph causes."""
    return NearMiss(f"{what} ({type(err).__name__}: {err})", error=type(err).__name__)


def first_found(attempts: Iterable[Callable[[], _Found | None]]) -> _Found | None:
    """The first result an attempt returns (not None), trying them in order; when none does, the first near-miss an
    attempt raised on the way is raised (the earliest reading is the one the report explains), else None."""
    first_miss: NearMiss | None = None
    for attempt in attempts:
        try:
            found = attempt()
        except NearMiss as miss:
            first_miss = first_miss or miss
            continue
        if found is not None:
            return found
    if first_miss is not None:
        raise first_miss
    return None


def is_widening_cast(node: ir.Node) -> bool:
    if not is_float_cast(node):
        return False
    source = node.inputs[0].dtype if node.inputs[0] is not None else None
    target = ir.DataType(node.attributes["to"].value)
    if source is None or source not in _WIDTH:
        return False
    if source == target:
        return True
    # fp16 -> bf16 and bf16 -> fp16 both lose values.
    return _WIDTH[target] > _WIDTH[source]


def strip_lossless_steps(value: ir.Value) -> ir.Value:
    """`value` with the widening Casts and the Identity nodes above it removed: the steps that change no value, so
    that the norm reads what they read (a residual Add behind them is folded into the Skip op; those that something
    else reads too are kept, re-made from the op's Sum output)."""
    while True:
        node = value.producer()
        if node is None or not node.inputs or node.inputs[0] is None:
            return value
        if not (is_widening_cast(node) or (node.op_type == "Identity" and is_onnx_domain(node.domain))):
            return value
        value = node.inputs[0]


def strip_casts(value: ir.Value) -> ir.Value:
    """`value` with every float Cast and Identity above it removed."""
    while True:
        node = value.producer()
        if node is None or not (is_float_cast(node) or node.op_type == "Identity") or node.inputs[0] is None:
            return value
        value = node.inputs[0]


def strip_nonnegative_clamp(value: ir.Value) -> ir.Value:
    """`v` for `Max(v, c)`, `Relu(v)` or `Clip(v, c)` with a constant `c <= 0` and no upper bound, else `value`.

    A variance computed as E[x^2] - E[x]^2 can round below zero, so some implementations (Flax's fast variance)
    clamp it; the clamp changes nothing in exact arithmetic, which is what the fused op computes more closely."""
    node = value.producer()
    if node is None or not is_onnx_domain(node.domain) or not node.inputs or node.inputs[0] is None:
        return value
    op = node.op_type
    if op == "Relu":
        return node.inputs[0]
    if op == "Max" and len(node.inputs) == 2 and None not in node.inputs:
        a, b = node.inputs
        for data, bound in ((a, b), (b, a)):
            limit = constants.scalar(bound)
            if limit is not None and limit <= 0 and not constants.is_constant(data):
                return data  # type: ignore[return-value]
        return value
    if op == "Clip":
        low_value = node.inputs[1] if len(node.inputs) > 1 else None
        high_value = node.inputs[2] if len(node.inputs) > 2 else None
        low = constants.scalar(low_value) if low_value is not None else _float_attr(node, "min")
        high = constants.scalar(high_value) if high_value is not None else _float_attr(node, "max")
        if low is not None and low <= 0 and (high is None or high >= 3.0e38):
            return node.inputs[0]
    return value


def _float_attr(node: ir.Node, name: str) -> float | None:
    attr = node.attributes.get(name)
    return None if attr is None else float(attr.value)


def same_data(a: ir.Value, b: ir.Value) -> bool:
    """True when `a` and `b` are the same tensor up to float Casts."""
    return strip_casts(a) is strip_casts(b)


def squared(value: ir.Value) -> ir.Value | None:
    """For `Pow(t, 2)` or `Mul(t, t)` (the two operands the same up to Casts): `t`, else None."""
    value = strip_casts(value)
    node = value.producer()
    if node is None or not is_onnx_domain(node.domain) or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if a is None or b is None:
        return None
    if node.op_type == "Pow":
        exponent = constants.scalar(b)
        return a if exponent == 2.0 else None
    if node.op_type == "Mul" and (a is b or same_data(a, b)):
        return a
    return None


def difference(value: ir.Value) -> tuple[ir.Value, ir.Value] | None:
    """For `a - b` (up to Casts, default domain): (a, b), else None."""
    node = strip_casts(value).producer()
    if node is None or node.op_type != "Sub" or not is_onnx_domain(node.domain):
        return None
    a, b = node.inputs
    return None if a is None or b is None else (a, b)


def centred(value: ir.Value) -> tuple[ir.Value, tuple[int, ...]] | None:
    """For `x - mean(x)` (up to Casts): (x, axes), else None."""
    operands = difference(value)
    if operands is None:
        return None
    a, m = operands
    mean = row_mean(m)
    if mean is None or mean.squared or not same_data(mean.input, a):
        return None
    return a, mean.axes


def is_centred(value: ir.Value, x: ir.Value, axes: tuple[int, ...]) -> bool:
    found = centred(value)
    return found is not None and same_data(found[0], x) and found[1] == axes


def narrow(dtype: ir.DataType | None) -> int:
    """The element type a value of `dtype` is rounded to, if narrower than float32, else 0."""
    return int(dtype) if dtype is not None and int(dtype) in NARROW_TYPES else 0


@dataclasses.dataclass
class Factors:
    """A product of powers: named leaves with exponents, and constants with exponents."""

    leaves: dict[str, Fraction] = dataclasses.field(default_factory=dict)
    constants: list[tuple[ir.Value, Fraction]] = dataclasses.field(default_factory=list)
    nodes: list[ir.Node] = dataclasses.field(default_factory=list)
    sign: int = 1  # -1 after an odd number of Negs (only with `negation=True`)

    def add_leaf(self, name: str, exponent: Fraction) -> None:
        self.leaves[name] = self.leaves.get(name, Fraction(0)) + exponent


_TRANSPARENT = ("Mul", "Div", "Sqrt", "Reciprocal", "Pow", "Identity")
#: Ops that move a value's elements without changing them: a statistic reduced with its dims dropped is restored
#: to the kept layout by one of these, possibly after the epsilon or the square root. The layout the graph ends up
#: with is checked by the proof step, which evaluates the graph's own shape arithmetic.
LAYOUT_OPS = ("Unsqueeze", "Reshape", "Expand")


def flatten(
    value: ir.Value,
    classify: Callable[[ir.Value], str | None],
    *,
    max_nodes: int = 48,
    negation: bool = False,
) -> Factors:
    """Decomposes `value` into a product of powers of leaves.

    `classify(v)` names a leaf (returns e.g. "data" or "stat") or returns None to look through `v`'s producer.
    Constants are leaves of their own. Raises NearMiss when a non-constant operand is not a named leaf. With
    `negation`, `Neg` is looked through and counted in `sign` (the distributed LayerNorm's `-mean * inv`).
    """
    flattener = _Flattener(classify, max_nodes, negation)
    flattener.visit(value, Fraction(1))
    return flattener.factors


class _Flattener:
    def __init__(self, classify: Callable[[ir.Value], str | None], max_nodes: int, negation: bool) -> None:
        self.factors = Factors()
        self.classify = classify
        self.max_nodes = max_nodes
        self.negation = negation

    def visit(self, current: ir.Value, exponent: Fraction) -> None:
        factors = self.factors
        if len(factors.nodes) > self.max_nodes:
            raise NearMiss("subgraph too large")
        name = self.classify(current)
        if name is not None:
            factors.add_leaf(name, exponent)
            return
        if constants.is_constant(current):
            factors.constants.append((current, exponent))
            return
        node = current.producer()
        if node is None or not is_onnx_domain(node.domain):
            raise NearMiss(
                f"operand {current.name!r} is neither the normalised input, the statistic nor a constant", current
            )
        op = node.op_type
        if is_float_cast(node) or op == "Identity" or op in LAYOUT_OPS:
            factors.nodes.append(node)
            self.visit(node.inputs[0], exponent)  # type: ignore[arg-type]
            return
        if op == "Neg" and self.negation and exponent.numerator % 2 == 1 and exponent.denominator == 1:
            factors.nodes.append(node)
            factors.sign = -factors.sign
            self.visit(node.inputs[0], exponent)  # type: ignore[arg-type]
            return
        if op not in _TRANSPARENT or len(node.outputs) != 1:
            raise NearMiss(
                f"operand {current.name!r} ({op}) is neither the normalised input, the statistic nor a constant", node
            )
        factors.nodes.append(node)
        self._operands(node, exponent)

    def _operands(self, node: ir.Node, exponent: Fraction) -> None:
        """Visits the operands of a Mul, Div, Sqrt, Reciprocal or Pow with their exponents."""
        op = node.op_type
        a = node.inputs[0]
        b = node.inputs[1] if len(node.inputs) > 1 else None
        assert a is not None
        if op in ("Mul", "Div"):
            assert b is not None
            self.visit(a, exponent)
            self.visit(b, exponent if op == "Mul" else -exponent)
        elif op == "Sqrt":
            self.visit(a, exponent / 2)
        elif op == "Reciprocal":
            self.visit(a, -exponent)
        else:  # Pow
            power = constants.scalar(b)
            if power is None:
                raise NearMiss("Pow with a non-constant exponent", node)
            fraction = Fraction(power).limit_denominator(8)
            if abs(float(fraction) - power) > 1e-6:
                raise NearMiss(f"Pow with exponent {power}", node)
            self.visit(a, exponent * fraction)
