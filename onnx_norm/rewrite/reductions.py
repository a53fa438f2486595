"""Row means as exporters spell them.

`mean(t, axes)` with the reduced dims kept, written as any of: `ReduceMean(keepdims=1)` with axes as an attribute
(opset < 18) or an input (opset >= 18); `ReduceMean(keepdims=0)` with the dims restored by `Unsqueeze` over the same
axes, or by a `Reshape`/`Expand` to the kept shape (dynamo's `broadcast_in_dim`); `ReduceSum` divided by, or
multiplied by the inverse of, the number of reduced elements; `ReduceSumSquare` likewise (a row mean of the
square); with float Casts anywhere on the way (a mean computed in fp32 and narrowed again). A statistic may also
be taken with its dims dropped (`dropped_ok`) when the exporter restores them later, after the epsilon or the
square root: the proof step checks the layout the graph ends up with.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import ANALYSED_FLOAT_TYPES, is_onnx_domain
from onnx_norm.rewrite import constants
from onnx_norm.rewrite.evaluate import EvaluationError, evaluate

_REL_TOLERANCE = {
    ir.DataType.FLOAT16: 2.0**-10,
    ir.DataType.BFLOAT16: 2.0**-7,
}
#: The reductions a row mean is made of. `GlobalAveragePool` is the mean over every dim after the first two, dims
#: kept: tf2onnx writes Keras' mean over the last axis of a rank-3 tensor as one below opset 18.
REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceSumSquare", "GlobalAveragePool")


@dataclasses.dataclass
class RowMean:
    """`value` is the mean of `input` over `axes`, with the reduced dims kept.

    Axes count from the end (-1 is the last dim), so that they compare equal whether or not the rank is known:
    shape inference often loses shapes after attention's computed Reshapes, and a norm over trailing axes does
    not need the rank.
    """

    input: ir.Value
    axes: tuple[int, ...]
    nodes: list[ir.Node]
    kept: bool = True  # False: the reduced dims are dropped here and restored further down the graph
    squared: bool = False  # ReduceSumSquare: the mean of input^2, not of input
    correction: float = 1.0  # N/(N-1): the sum over N elements divided by N-1 (an unbiased variance)


def is_float_cast(node: ir.Node) -> bool:
    if node.op_type != "Cast" or not is_onnx_domain(node.domain):
        return False
    to = node.attributes.get("to")
    return to is not None and int(to.value) in ANALYSED_FLOAT_TYPES


def rank_of(value: ir.Value) -> int | None:
    return None if value.shape is None else len(value.shape)


def _raw_axes(node: ir.Node) -> list[int] | None:
    attr = node.attributes.get("axes")
    if attr is not None:
        return [int(a) for a in attr.value]
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return constants.int_list(node.inputs[1])
    return []


def _from_end(axes: list[int], rank: int | None) -> tuple[int, ...] | None:
    """Axes as negative offsets from the end, sorted; None when they cannot be placed (rank unknown and an axis
    counted from the front, or out of range)."""
    if rank is None:
        if any(a >= 0 for a in axes):
            return None
        result = sorted(set(axes))
    else:
        if any(not -rank <= a < rank for a in axes):
            return None
        result = sorted({a % rank - rank for a in axes})
    return tuple(result) if len(result) == len(axes) else None


def reduction_axes(node: ir.Node, rank: int | None) -> tuple[int, ...] | None:
    """Axes of a Reduce* node counted from the end, or None when they are not constant."""
    if node.op_type == "GlobalAveragePool":
        return None if rank is None or rank < 3 else tuple(range(2 - rank, 0))
    axes = _raw_axes(node)
    if axes is None:
        return None
    if not axes:
        noop = node.attributes.get("noop_with_empty_axes")
        if (noop is not None and noop.value) or rank is None:
            return None
        return tuple(range(-rank, 0))
    return _from_end(axes, rank)


def _unsqueeze_axes(node: ir.Node) -> tuple[int, ...] | None:
    attr = node.attributes.get("axes")
    axes = (
        [int(a) for a in attr.value]
        if attr is not None
        else constants.int_list(node.inputs[1] if len(node.inputs) > 1 else None)
    )
    if axes is None:
        return None
    return _from_end(axes, rank_of(node.outputs[0]))


def _scalar_factor(node: ir.Node) -> tuple[ir.Value, float, float] | None:
    """For Mul/Div by a constant scalar: (the other operand, the factor, relative tolerance of the constant)."""
    a, b = node.inputs[0], node.inputs[1]
    if a is None or b is None:
        return None
    if node.op_type == "Div":
        value = constants.scalar(b)
        if value is None or value == 0:
            return None
        return a, 1.0 / value, _REL_TOLERANCE.get(b.dtype, 1e-6) if b.dtype else 1e-6
    for operand, other in ((b, a), (a, b)):
        value = constants.scalar(operand)
        if value is not None:
            return other, value, _REL_TOLERANCE.get(operand.dtype, 1e-6) if operand.dtype else 1e-6
    return None


@dataclasses.dataclass
class _Path:
    """The ops between a value and the reduction under it: the reduction node, the nodes on the way, the scalar
    factor they multiply by (and its tolerance), the Unsqueezes' axes and whether a Reshape/Expand is among them."""

    reduction: ir.Node | None
    nodes: list[ir.Node]
    factor: float
    tolerance: float
    unsqueezes: list[tuple[int, ...]]
    reshaped: bool
    divisor: ir.Value | None = None  # a row size computed at run time that the sum is divided by (`x.shape[-1]`)


def _path_to_reduction(value: ir.Value) -> _Path | None:
    """Down from `value` through Casts, Unsqueezes, Reshapes/Expands and scalar factors to a reduction."""
    path = _Path(None, [], 1.0, 1e-6, [], False)
    current: ir.Value | None = value
    for _ in range(10):
        node = current.producer() if current is not None else None
        if node is None or not is_onnx_domain(node.domain):
            return None
        op = node.op_type
        if op in REDUCTIONS:
            path.reduction = node
            return path
        if is_float_cast(node) or op == "Identity":
            current = node.inputs[0]
        elif op == "Unsqueeze":
            axes = _unsqueeze_axes(node)
            if axes is None:
                return None
            path.unsqueezes.append(axes)
            current = node.inputs[0]
        elif op in ("Reshape", "Expand"):
            path.reshaped = True
            current = node.inputs[0]
        elif op in ("Mul", "Div"):
            scaled = _scalar_factor(node) or _runtime_divisor(node, path)
            if scaled is None:
                return None
            current, step, tol = scaled
            path.factor *= step
            path.tolerance = max(path.tolerance, tol)
        else:
            return None
        path.nodes.append(node)
        if current is None:
            return None
    return None


def _runtime_divisor(node: ir.Node, path: _Path) -> tuple[ir.Value, float, float] | None:
    """For `Div(s, n)`, `Mul(s, Reciprocal(n))` or `Mul(s, Div(c, n))` with `n` computed at run time (the row size
    read from the input's shape when it is symbolic): (s, the constant factor, its tolerance), `n` recorded on
    `path` (one per path; `row_mean` checks that it is the reduced size)."""
    a, b = node.inputs[0], node.inputs[1]
    if path.divisor is not None or a is None or b is None:
        return None
    if node.op_type == "Div":
        path.divisor = b
        return a, 1.0, 1e-6
    for s, inverse in ((a, b), (b, a)):
        producer = inverse.producer()
        # Any producer can be met here, one without inputs too (a Constant that is not a scalar factor).
        if producer is None or not is_onnx_domain(producer.domain) or None in producer.inputs:
            continue
        if producer.op_type == "Reciprocal" and len(producer.inputs) == 1:
            path.divisor = producer.inputs[0]
            return s, 1.0, 1e-6
        if producer.op_type == "Div" and len(producer.inputs) == 2:
            numerator = constants.scalar(producer.inputs[0])
            if numerator is not None:
                path.divisor = producer.inputs[1]
                return s, numerator, _REL_TOLERANCE.get(producer.inputs[0].dtype, 1e-6)  # type: ignore[union-attr]
    return None


#: Ops of the shape arithmetic that computes a row size from `Shape(x)` or `Size(x)`.
_COUNT_OPS = frozenset(
    {
        "Shape",
        "Size",
        "Gather",
        "Slice",
        "Squeeze",
        "Unsqueeze",
        "Reshape",
        "Concat",
        "ReduceProd",
        "Mul",
        "Cast",
        "Identity",
    }
)
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19)


def _shape_sources(value: ir.Value) -> list[ir.Value] | None:
    """The values whose `Shape`/`Size` the integer arithmetic computing `value` reads, None when it reads anything
    else that is not constant."""
    sources: list[ir.Value] = []
    stack, seen = [value], 0
    while stack:
        current = stack.pop()
        seen += 1
        if seen > 24:
            return None
        if constants.is_constant(current):
            continue
        node = current.producer()
        if node is None or not is_onnx_domain(node.domain) or node.op_type not in _COUNT_OPS:
            return None
        if node.op_type in ("Shape", "Size"):
            if node.inputs[0] is None:
                return None
            sources.append(node.inputs[0])
            continue
        stack.extend(v for v in node.inputs if v is not None)
    return sources


def _same_dims(a: ir.Value, b: ir.Value) -> bool:
    """Whether `a` and `b` have the same shape at run time by their inferred shapes: equal static or named dims."""
    if a is b:
        return True
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    return all(
        (isinstance(p, int) and p == q) or (not isinstance(p, int) and p.value is not None and p == q)
        for p, q in zip(a.shape, b.shape, strict=True)
    )


def runtime_row_count(count: ir.Value, reduced: ir.Value, axes: tuple[int, ...]) -> bool:
    """Whether `count` is the number of elements of one row of `reduced` over `axes`, computed at run time from its
    shape (TorchScript's `Cast(Gather(Shape(x), -1))` when the dim is symbolic, dynamo's `Shape(x, start=-1)`): the
    shape arithmetic is evaluated with the dims of `reduced` set to distinct primes, so the product of exactly the
    reduced dims is the only way to the expected number."""
    rank = rank_of(reduced)
    sources = _shape_sources(count)
    if rank is None or rank > len(_PRIMES) or not sources or not all(_same_dims(v, reduced) for v in sources):
        return False
    dims = _PRIMES[:rank]
    try:
        (result,) = evaluate([count], dict.fromkeys(sources, np.zeros(dims, np.float32)))
    except (EvaluationError, ValueError, TypeError, IndexError):
        return False
    expected = math.prod(dims[rank + a] for a in axes)
    return result.size == 1 and float(result.reshape(())) == expected


def _dims_kept(path: _Path, axes: tuple[int, ...], dropped_ok: bool) -> bool | None:
    """Whether the reduced dims are kept at `value` (False: dropped, allowed with `dropped_ok`); None when the
    Unsqueezes on the way do not restore exactly the reduced axes."""
    assert path.reduction is not None
    keepdims = path.reduction.attributes.get("keepdims")
    if keepdims is None or bool(keepdims.value):
        return None if path.unsqueezes else True
    if path.unsqueezes:
        return True if len(path.unsqueezes) == 1 and path.unsqueezes[0] == axes else None
    if path.reshaped:
        return True
    return False if dropped_ok else None


def _correction(path: _Path, count: int | None, unbiased_ok: bool) -> float | None:
    """1 for a mean; N/(N-1) for a sum over N divided by N-1 when `unbiased_ok`; None for any other factor."""
    factor = path.factor
    assert path.reduction is not None
    if path.reduction.op_type in ("ReduceSum", "ReduceSumSquare"):
        if count is None:
            return None  # the divisor cannot be checked against the reduced size
        factor *= count
    if abs(factor - 1.0) <= 4 * path.tolerance:
        return 1.0
    if not unbiased_ok or count is None or count < 2:
        return None
    correction = count / (count - 1)
    return correction if abs(factor - correction) <= 4 * path.tolerance * correction else None


def row_mean(value: ir.Value, *, dropped_ok: bool = False, unbiased_ok: bool = False) -> RowMean | None:
    """Recognises `value` as a row mean with kept dims (or with dropped dims when `dropped_ok`), or returns None.

    With `unbiased_ok`, the sum divided by N-1 instead of N (Bessel's correction, `x.var(unbiased=True)`) is
    accepted too, with `correction` N/(N-1); N must be static."""
    path = _path_to_reduction(value)
    if path is None:
        return None
    node = path.reduction
    assert node is not None
    reduced = node.inputs[0]
    if reduced is None:
        return None
    axes = reduction_axes(node, rank_of(reduced))
    if axes is None:
        return None
    kept = _dims_kept(path, axes, dropped_ok)
    if kept is None or (path.reshaped and not restores_kept_dims(value, reduced, axes)):
        return None
    if path.divisor is None:
        count = _reduced_count(reduced, axes)
    elif node.op_type in ("ReduceSum", "ReduceSumSquare") and runtime_row_count(path.divisor, reduced, axes):
        count = 1  # divided by the reduced size itself: the sum's factor is the constant part alone
    else:
        return None
    correction = _correction(path, count, unbiased_ok and path.divisor is None)
    if correction is None:
        return None
    nodes = [*path.nodes, node]
    return RowMean(reduced, axes, nodes, kept, node.op_type == "ReduceSumSquare", correction)


def _reduced_count(reduced: ir.Value, axes: tuple[int, ...]) -> int | None:
    """The number of elements a reduction over `axes` takes per row, None when a reduced dim is not static."""
    shape = reduced.shape
    if shape is None:
        return None
    dims = [shape[len(shape) + a] for a in axes]
    if not all(isinstance(d, int) for d in dims):
        return None
    return math.prod(dims)  # type: ignore[arg-type]


def restores_kept_dims(value: ir.Value, reduced: ir.Value, axes: tuple[int, ...]) -> bool:
    """Whether a Reshape/Expand on the way gives `value` the kept-dims layout of a reduction of `reduced`.

    Where shape inference knows both shapes they must agree (reduced dims 1, or the full size for an Expand
    to the input's shape); where it does not, the proof step evaluates the graph's own shape arithmetic."""
    if value.shape is None or reduced.shape is None:
        return True
    if len(value.shape) != len(reduced.shape):
        return False
    rank = len(reduced.shape)
    for dim, (out, full) in enumerate(zip(value.shape, reduced.shape, strict=True)):
        if dim - rank in axes:
            if isinstance(out, int) and out not in (1, full):
                return False
            continue
        # A kept dim must be the input's: 1 where the input's is not would broadcast one row's statistic to others.
        if (isinstance(out, int) and isinstance(full, int) and out != full) or (out == 1 and full != 1):
            return False
    return True
