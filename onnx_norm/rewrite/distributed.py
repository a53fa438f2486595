"""LayerNorm distributed over the sum: `x * s + (beta - mean * s)` with `s = gamma * rsqrt(var + eps)`.

This is `tf.nn.batch_normalization`'s formula, which TensorFlow's and Keras' LayerNormalization use and tf2onnx
exports as is (`Sub(beta, Mul(mean, s))`; Keras 3 writes `Add(Mul(Neg(mean), s), beta)`). It is the same function
as `(x - mean) * s + beta`, but no single node computes `x - mean`, so the product-of-powers matcher cannot see it.

The sum is split into signed terms (through Add, Sub and Neg) and each term flattened: exactly one `x * (var +
eps)^-1/2 * C` with sign +, one `mean(x) * (var + eps)^-1/2 * C` with sign - and the same constants C, and at most
one constant term with sign + (the bias). The matcher (`match.py`) then builds the candidate from the first term as
if it were the product `(x - mean) * s` and the bias as a tail Add; the proof step checks the whole subgraph.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import is_onnx_domain
from onnx_norm.rewrite import constants
from onnx_norm.rewrite.reductions import row_mean
from onnx_norm.rewrite.spec import Statistic
from onnx_norm.rewrite.structure import Factors, NearMiss, flatten, same_data

#: A distributed LayerNorm has three terms; residual streams chain many Adds, which are not looked into further.
_MAX_TERMS = 4


@dataclasses.dataclass
class DistributedForm:
    """The parts of `x * s - mean * s + bias` that the candidate is built from."""

    x_term: ir.Value
    factors: Factors  # of the x term: data^1 * stat^-1/2 * constants
    bias: ir.Value | None


def signed_terms(value: ir.Value) -> list[tuple[ir.Value, int]] | None:
    """`value` as a signed sum of terms through Add/Sub/Neg, None when it is not a sum of 2 to 4 terms."""
    terms: list[tuple[ir.Value, int]] = []

    def visit(current: ir.Value, sign: int, depth: int) -> bool:
        node = current.producer()
        # An intermediate sum read elsewhere too (a residual stream) is a term, not part of this sum.
        single = depth == 0 or (len(current.uses()) == 1 and not current.is_graph_output())
        if depth < 3 and single and node is not None and is_onnx_domain(node.domain):
            op = node.op_type
            if op in ("Add", "Sub") and len(node.inputs) == 2 and None not in node.inputs:
                a, b = node.inputs
                assert a is not None and b is not None
                return visit(a, sign, depth + 1) and visit(b, -sign if op == "Sub" else sign, depth + 1)
            if op == "Neg" and node.inputs[0] is not None and depth > 0:
                return visit(node.inputs[0], -sign, depth + 1)
        terms.append((current, sign))
        return len(terms) <= _MAX_TERMS

    root = value.producer()
    if root is None or root.op_type not in ("Add", "Sub") or not visit(value, 1, 0) or len(terms) < 2:
        return None
    return terms


def analyse(terms: list[tuple[ir.Value, int]], statistic: Statistic, eps_sum: ir.Value) -> DistributedForm | None:
    """The distributed LayerNorm these terms spell, None when they are not one, NearMiss when they almost are."""
    if not statistic.centred:
        return None
    x, axes = statistic.x, statistic.axes

    def classify(value: ir.Value) -> str | None:
        if value is eps_sum:
            return "stat"
        if same_data(value, x):
            return "data"
        mean = row_mean(value)
        if mean is not None and not mean.squared and same_data(mean.input, x) and mean.axes == axes:
            return "mean"
        return None

    x_terms: list[tuple[ir.Value, Factors]] = []
    mean_terms: list[Factors] = []
    biases: list[tuple[ir.Value, int]] = []
    for term, sign in terms:
        if constants.is_constant(term):
            biases.append((term, sign))
            continue
        try:
            factors = flatten(term, classify, negation=True)
        except NearMiss:
            return None
        total = sign * factors.sign
        if factors.leaves == {"data": Fraction(1), "stat": Fraction(-1, 2)} and total == 1:
            x_terms.append((term, factors))
        elif factors.leaves == {"mean": Fraction(1), "stat": Fraction(-1, 2)} and total == -1:
            mean_terms.append(factors)
        else:
            return None
    if len(x_terms) != 1 or len(mean_terms) != 1:
        return None
    x_term, x_factors = x_terms[0]
    if not _same_constants(x_factors, mean_terms[0]):
        raise NearMiss("x and its mean are scaled by different constants in x * s - mean * s", x_term)
    if len(biases) > 1 or any(sign != 1 for _, sign in biases):
        raise NearMiss("the bias is not a single constant added to the normalised value", x_term)
    return DistributedForm(x_term, x_factors, biases[0][0] if biases else None)


def _same_constants(a: Factors, b: Factors) -> bool:
    try:
        pa, pb = constants.fold_product(a.constants), constants.fold_product(b.constants)
    except ValueError:
        return False
    pa = np.ones(1) if pa is None else pa
    pb = np.ones(1) if pb is None else pb
    try:
        pa, pb = np.broadcast_arrays(pa, pb)
    except ValueError:
        return False
    return bool(np.allclose(pa, pb, rtol=1e-6, atol=0.0))
