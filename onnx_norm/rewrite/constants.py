"""Constants inside a norm: epsilon, exponents, divisors, axes, and scale/bias folded from constant expressions.

A value is constant when it is computed only from

- initializers that are not also graph inputs (an input can be overridden at run time),
- `Constant` nodes, whichever attribute holds the value (`value`, `value_float(s)`, `value_int(s)`),
- the type or static shape of runtime values: `CastLike`'s second input gives a type, not a value (onnxscript
  writes `mean + 1e-5` as `Add(mean, CastLike(Constant(1e-5), mean))`); `Shape` and `Size` read only dims
  (TorchScript's `x.shape[-1]` as the divisor of a mean, ONNX's RMSNormalization expansion computing its axes as
  `Range(axis + Size(Shape(X)), Size(Shape(X)))`),

through the ops of the numpy interpreter (evaluate.py: arithmetic, Cast, Range, ConstantOfShape, Identity,
Reshape, Expand, Concat, Gather, ...). A `Shape` of symbolic dims counts when the result does not depend on them.

Why not onnxscript's or onnx-ir's constant folding: both fold by rewriting the graph (a folded value becomes a new
initializer or Constant node), and the user's graph must not change except where a norm is fused. Here nothing is
written back; a value is evaluated when a matcher asks for it, and inside `folding()` (one per `FuseNormsPass`
run) each value is evaluated once.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import FLOAT_TYPES, is_onnx_domain
from onnx_norm.rewrite import loops
from onnx_norm.rewrite.evaluate import SHAPE_OPS, SUPPORTED_OPS, EvaluationError, evaluate, static_shape

#: Constant expressions larger than this are not folded (a scale or bias is one row of the normalised dims).
MAX_FOLD_ELEMENTS = 1 << 24
_MAX_FOLD_NODES = 32
_FILLS = (1_000_003, 2_000_029)  # sizes no static dim has
#: Folded arrays up to this many elements are kept for the rest of the pass (epsilons, axes, divisors, rows).
_CACHE_ELEMENTS = 1 << 16
_MISSING = object()
_cache: contextvars.ContextVar[dict[ir.Value, np.ndarray | None] | None] = contextvars.ContextVar(
    "onnx_norm_constants", default=None
)


@contextlib.contextmanager
def folding() -> Iterator[None]:
    """Remembers folded values until the block ends: within it the graph's constant expressions must not change
    (a rewrite replaces computed values, never the constants they are made of)."""
    token = _cache.set({})
    try:
        yield
    finally:
        _cache.reset(token)


def is_direct_constant(value: ir.Value) -> bool:
    if value.const_value is not None and not value.is_graph_input():
        return True
    node = value.producer()
    return node is not None and node.op_type == "Constant" and is_onnx_domain(node.domain)


def is_runtime_parameter(value: ir.Value | None) -> bool:
    """A weight the model takes at run time, which a fused op can read as it is: a value of a float type and a
    shape of static or named dims (a named dim is the input's dim of that name, `[N]` for an input `[B, S, N]`)
    that is only ever the operand of a Mul or Add with something else (named dims only in a 1-D row: `[B, S, H]` is
    an activation multiplied onto the norm), and that is

    - a graph input (an export with `export_params=False`, or an initializer kept as an overridable input),
    - a Loop body input every iteration sees unchanged (tf2onnx passes gamma and beta through its loops, loops.py),
    - a value of an enclosing graph read inside a subgraph (constant for the whole run of the subgraph),
    - or a 1-D row computed at run time from such weights alone (`_computed_row`: tf2onnx's `Slice` or `Neg` of a
      loop-carried gamma, `1 + w` of a graph input).

    A norm's own input never is: it also feeds the statistic (a reduction, Pow, Sub, Cast or Mul with itself)."""
    if value is None or value.dtype not in FLOAT_TYPES or value.shape is None:
        return False
    if not all(isinstance(d, int) or d.value is not None for d in value.shape) or not value.uses():
        return False
    dims = list(value.shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    if 1 in dims:
        return False  # broadcast inside: per sample ([B, 1, H], a per-sample factor), not a row of weights
    if len(dims) > 1 and not all(isinstance(d, int) for d in dims):
        return False  # [B, S, H]: an activation (a gate, a mask) multiplied onto the norm, not its weights
    invariant = loops.is_invariant(value)
    # Inside a loop or branch, only a 1-D row: an enclosing activation multiplied onto the norm is no weight.
    enclosing = len(dims) <= 1 and (invariant or _read_from_subgraph(value))
    if not (value.is_graph_input() or enclosing or _computed_row(value)):
        return False
    for use in value.uses():
        node = use.node
        if invariant and node.op_type == "Identity" and is_onnx_domain(node.domain):
            continue  # the body passing it on to the next iteration
        if node.op_type not in ("Mul", "Add") or not is_onnx_domain(node.domain) or len(node.inputs) != 2:
            return False
        if node.inputs[0] is node.inputs[1]:
            return False
    return True


#: The most nodes `_computed_row` reads back through.
_MAX_ROW_NODES = 16


def _computed_row(value: ir.Value) -> bool:
    """A 1-D value computed at run time from weights alone, which a fused op can read as its Scale or Bias like a
    graph input: the nodes computing it (at most _MAX_ROW_NODES, default domain) hold no reduction, so it is no
    part of a norm's own computation (every value of a norm but its input comes from the statistic's reduction,
    and the input also feeds the statistic, which `is_runtime_parameter`'s readers exclude), and what they read is
    constant, a graph input, a loop-invariant body input or a value of an enclosing graph, never a value a loop
    body changes from one iteration to the next (loops.py marks those)."""
    producer = value.producer()
    if producer is None or value.shape is None or len(value.shape) != 1 or is_constant(value):
        return False  # a constant (a Constant node's row too) is folded and proven with its values
    own, nodes = producer.graph, 0
    stack = [value]
    for current in each_once(stack):
        if is_direct_constant(current) or loops.is_invariant(current):
            continue
        node = current.producer()
        if node is None:
            if loops.is_body_input(current) and current.dtype is not None and current.dtype.is_floating_point():
                return False  # a loop-carried value the body changes, or a scan input: data, not a weight
            continue
        if node.graph is not own:
            continue  # read from the enclosing graph: the same for the whole run of this one
        nodes += 1
        if nodes > _MAX_ROW_NODES or not is_onnx_domain(node.domain) or _is_reduction(node) or _subgraphs_of(node):
            return False
        stack.extend(v for v in node.inputs if v is not None)
    return True


def _is_reduction(node: ir.Node) -> bool:
    return node.op_type.startswith("Reduce") or node.op_type in ("GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool")


def _subgraphs_of(node: ir.Node) -> bool:
    return any(attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for attr in node.attributes.values())


def _read_from_subgraph(value: ir.Value) -> bool:
    """Whether `value` is read by a node of another graph than its own (an If/Loop/Scan body reading it from the
    enclosing scope)."""
    producer = value.producer()
    own = producer.graph if producer is not None else value.graph
    return own is not None and any(use.node.graph is not own for use in value.uses())


def is_constant(value: ir.Value | None) -> bool:
    """True when `value` depends on constants only (no graph input, no runtime value beyond its type)."""
    if value is None:
        return False
    if value.const_value is not None and not value.is_graph_input():
        return value.const_value.size <= MAX_FOLD_ELEMENTS
    nodes = _constant_nodes(value)
    if nodes is None:
        return False
    if any(_reads_symbolic_dims(n) for n in nodes):
        return constant_array(value) is not None
    return True


def _reads_symbolic_dims(node: ir.Node) -> bool:
    return node.op_type in SHAPE_OPS and static_shape(node) is None


def _type_only_inputs(node: ir.Node) -> list[ir.Value] | None:
    """The inputs whose values `node` reads (the others give only a type or shape); None when `node` depends on
    a runtime value it cannot be folded without."""
    if node.op_type == "Constant":
        return []
    if node.op_type in SHAPE_OPS:
        return [] if static_shape(node, fill=1) is not None else None
    if node.op_type == "CastLike":
        if len(node.inputs) != 2 or node.inputs[1] is None or node.inputs[1].dtype is None:
            return None
        return [node.inputs[0]] if node.inputs[0] is not None else None
    return [v for v in node.inputs if v is not None]


def each_once(stack: list[ir.Value]) -> Iterator[ir.Value]:
    """Pops `stack` until it is empty, each value once; the caller pushes onto `stack` what to visit next."""
    seen: set[ir.Value] = set()
    while stack:
        value = stack.pop()
        if value not in seen:
            seen.add(value)
            yield value


def _constant_nodes(value: ir.Value) -> list[ir.Node] | None:
    """The nodes computing `value` from constants, or None when it depends on anything else."""
    nodes: list[ir.Node] = []
    stack = [value]
    for current in each_once(stack):
        if current.const_value is not None and not current.is_graph_input():
            if current.const_value.size > MAX_FOLD_ELEMENTS:
                return None
            continue
        node = current.producer()
        if node is None or not is_onnx_domain(node.domain) or node.op_type not in SUPPORTED_OPS:
            return None
        nodes.append(node)
        if len(nodes) > _MAX_FOLD_NODES:
            return None
        read = _type_only_inputs(node)
        if read is None:
            return None
        stack.extend(read)
    return nodes


def type_readers(value: ir.Value, inside: set[ir.Node]) -> list[ir.Node]:
    """The nodes of `value`'s constant expression that read a value produced `inside` (for its type or shape
    only), with the nodes between them and `value`: they go when the nodes inside are replaced
    (`CastLike(Constant(1e-5), mean)` reads the norm's own mean)."""
    nodes = _constant_nodes(value)
    if not nodes:
        return []
    node_set = set(nodes)
    tainted: set[ir.Node] = set()
    for node in reversed(nodes):  # collected from `value` up: reversed, inputs come before their readers
        for input_value in node.inputs:
            if input_value is None:
                continue
            producer = input_value.producer()
            if producer in inside or (producer in node_set and producer in tainted):
                tainted.add(node)
    return [n for n in nodes if n in tainted]


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The value of a constant or constant expression, or None when it is not constant."""
    if value is None:
        return None
    cache = _cache.get()
    if cache is not None:
        found = cache.get(value, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
    array = _fold(value)
    if cache is not None and (array is None or array.size <= _CACHE_ELEMENTS):
        cache[value] = array
    return array


def _fold(value: ir.Value) -> np.ndarray | None:
    if value.const_value is not None and not value.is_graph_input():
        if value.const_value.size > MAX_FOLD_ELEMENTS:
            return None
        return value.const_value.numpy()
    nodes = _constant_nodes(value)
    if nodes is None:
        return None
    symbolic = any(_reads_symbolic_dims(n) for n in nodes)
    try:
        (array,) = evaluate([value], {}, symbolic_fill=_FILLS[0] if symbolic else None)
        if symbolic:
            # Read symbolic dims as two different sizes: a value that depends on them is not a constant.
            (other,) = evaluate([value], {}, symbolic_fill=_FILLS[1])
            if other.shape != array.shape or not np.array_equal(other, array):
                return None
            if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
                return None  # both sizes overflowed (`Cast(x.shape[-1], float16)`): equal, yet not independent
    except (EvaluationError, ValueError, TypeError, IndexError, AssertionError, MemoryError):
        return None
    return array


def scalar(value: ir.Value | None) -> float | None:
    """A one-element constant as a Python float (any shape with one element), else None."""
    array = constant_array(value)
    if array is None or array.size != 1:
        return None
    return float(np.asarray(array, dtype=np.float64).reshape(()))


def int_list(value: ir.Value | None) -> list[int] | None:
    array = constant_array(value)
    if array is None or array.dtype.kind not in "iu":
        return None
    return [int(v) for v in array.reshape(-1)]


def fold_product(factors: list[tuple[ir.Value, Fraction]]) -> np.ndarray | None:
    """The product of constant powers in float64, None when there is none; ValueError when one is not constant."""
    result: np.ndarray | None = None
    for value, exponent in factors:
        array = constant_array(value)
        if array is None:
            raise ValueError(f"cannot fold constant {value.name!r}")
        term = np.power(array.astype(np.float64), float(exponent))
        result = term if result is None else result * term
    return result
