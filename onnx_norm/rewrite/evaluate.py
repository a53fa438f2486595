"""A small numpy interpreter for the ops that appear in decomposed norms.

It serves two purposes: folding constant expressions (Gemma's `1 + w`, a `Cast` of a weight, the `Flatten` of a
scale in LayerNormalization's function expansion) and proving a matched subgraph against the fused op's reference
(`prove.py`); a matched subgraph may contain a native norm op (a family's composite around an exported
LayerNormalization), which is evaluated with the reference's math (`NORM_OPS`). Keeping it to the ops the matchers
accept makes the proof independent of any runtime's kernel coverage (ONNX Runtime has no bf16 ReduceMean on CPU,
for one), and lets the same subgraph be evaluated either in its own element types or with every float widened to
float64 (`widen=True`), which gives the exact value of the formula the graph spells.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import is_onnx_domain, onnx_opset
from onnx_norm.ops.numerics import elem_type, normalized, np_dtype
from onnx_norm.ops.schema import MS_DOMAIN, NormAttributes, native_of, native_ops

_FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}


class EvaluationError(Exception):
    """The subgraph uses an op or an input this interpreter does not handle."""


#: Largest array one op may make. Folding reads symbolic dims as a million (constants.py), so shape arithmetic
#: such as `Expand(Range(0, seq), [seq, 1])` would ask for terabytes; such a value is not a constant anyway.
MAX_EVALUATED_ELEMENTS = 1 << 25


def _attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    if attr is None:
        return default
    return attr.value


def _int_list(array: np.ndarray | None) -> list[int] | None:
    return None if array is None else [int(v) for v in np.asarray(array).reshape(-1)]


def _reduce_axes(node: ir.Node, inputs: Sequence[np.ndarray | None], rank: int) -> tuple[int, ...] | None:
    axes = _attr(node, "axes")
    if axes is None and len(inputs) > 1 and inputs[1] is not None:
        axes = _int_list(inputs[1])
    if axes is None or len(axes) == 0:
        if _attr(node, "noop_with_empty_axes", 0):
            return None
        return tuple(range(rank))
    return tuple(sorted(int(a) % rank for a in axes))


def _reduce(fn: Callable) -> Callable:
    def run(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
        x = inputs[0]
        assert x is not None
        axes = _reduce_axes(node, inputs, x.ndim)
        if axes is None:
            return x
        keepdims = bool(_attr(node, "keepdims", 1))
        # numpy reduces float16 in float32 internally; keep the graph's element type for the result.
        return np.asarray(fn(x, axis=axes, keepdims=keepdims)).astype(x.dtype)

    return run


def _global_average_pool(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    return np.asarray(np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)).astype(x.dtype)


def _unsqueeze(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    axes = _attr(node, "axes")
    if axes is None:
        axes = _int_list(inputs[1])
    rank = x.ndim + len(axes)
    for axis in sorted(int(a) % rank for a in axes):
        x = np.expand_dims(x, axis)
    return x


def _squeeze(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    axes = _attr(node, "axes")
    if axes is None and len(inputs) > 1 and inputs[1] is not None:
        axes = _int_list(inputs[1])
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(int(a) % x.ndim for a in axes))


def _flatten(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    axis = int(_attr(node, "axis", 1)) % (x.ndim + 1) if x.ndim else 0
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.reshape(lead, -1)


def _reshape(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x, shape = inputs[0], _int_list(inputs[1])
    assert x is not None and shape is not None
    if not _attr(node, "allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


def _binary(fn: Callable) -> Callable:
    def run(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        # Both operands have the same element type in a valid graph; the result keeps it (numpy would promote
        # a 0-d float32 against float16 arrays otherwise).
        return np.asarray(fn(a, b)).astype(a.dtype)

    return run


def _mod(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """ONNX's Mod: the divisor's sign (`fmod=0`, integers only), or C's fmod, the dividend's (`fmod=1`); dynamo's
    padding of a sequence to whole chunks, `(8 - s % 8) % 8`, in a view's target."""
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    with np.errstate(all="ignore"):
        return np.asarray((np.fmod if _attr(node, "fmod", 0) else np.mod)(a, b)).astype(a.dtype)


def _pow(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    with np.errstate(all="ignore"):
        return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)


def _unary(fn: Callable) -> Callable:
    def run(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
        x = inputs[0]
        assert x is not None
        with np.errstate(all="ignore"):
            return np.asarray(fn(x)).astype(x.dtype)

    return run


def _transpose(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    perm = _attr(node, "perm")
    return np.transpose(x, perm)


def _expand(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x, shape = inputs[0], _int_list(inputs[1])
    assert x is not None and shape is not None
    return x * np.ones(shape, dtype=x.dtype)


def _shape(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    start = int(_attr(node, "start", 0))
    end = _attr(node, "end")
    dims = x.shape[start:] if end is None else x.shape[start : int(end)]
    return np.asarray(dims, dtype=np.int64)


#: Ops whose output depends on their input's type and shape only, never on its values.
SHAPE_OPS = frozenset({"Shape", "Size"})


def static_shape(node: ir.Node, fill: int | None = None, sizes: Mapping[str, int] | None = None) -> np.ndarray | None:
    """A `Shape` or `Size` node's output from its input's inferred shape, without the input's values.

    None when the rank is unknown, or when a dim it reads is symbolic and neither in `sizes` (named dims' sizes)
    nor given a `fill`; with `fill`, the other symbolic dims read as fill, fill + 1, ... (evaluating twice with two
    fills tells whether a value depends on them)."""
    source = node.inputs[0] if node.inputs else None
    if source is None or source.shape is None or node.op_type not in SHAPE_OPS:
        return None
    rank = len(source.shape)
    dims = list(source.shape)
    if node.op_type == "Shape":
        start = int(_attr(node, "start", 0))
        end = _attr(node, "end")
        dims = dims[slice(start, rank if end is None else int(end))]
    named = sizes or {}
    dims = [named.get(str(d.value), d) if not isinstance(d, int) and d.value is not None else d for d in dims]
    if fill is None and not all(isinstance(d, int) for d in dims):
        return None
    result = np.asarray([d if isinstance(d, int) else fill + i for i, d in enumerate(dims)], dtype=np.int64)
    return np.asarray(np.prod(result), dtype=np.int64) if node.op_type == "Size" else result


def _range(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    start, limit, delta = inputs
    assert start is not None and limit is not None and delta is not None
    if int(np.asarray(delta).reshape(())) == 0 and start.dtype.kind in "iu":
        raise EvaluationError("Range with a zero step")
    return np.arange(start.reshape(()), limit.reshape(()), delta.reshape(()), dtype=start.dtype)


def _constant_of_shape(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    shape = _int_list(inputs[0])
    assert shape is not None
    fill = _attr(node, "value")
    value = np.zeros((1,), dtype=np.float32) if fill is None else fill.numpy()
    return np.full(shape, value.reshape(-1)[0], dtype=value.dtype)


def _size(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    return np.asarray(x.size, dtype=np.int64)


def _concat(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    arrays = [a for a in inputs if a is not None]
    return np.concatenate(arrays, axis=int(_attr(node, "axis", 0)))


def _gather(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x, indices = inputs[0], inputs[1]
    assert x is not None and indices is not None
    return np.take(x, indices, axis=int(_attr(node, "axis", 0)))


def _slice(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    if len(inputs) > 1:  # opset >= 10: starts, ends, axes, steps as inputs
        starts, ends = _int_list(inputs[1]), _int_list(inputs[2])
        axes = _int_list(inputs[3]) if len(inputs) > 3 else None
        steps = _int_list(inputs[4]) if len(inputs) > 4 else None
    else:
        starts, ends, axes, steps = _attr(node, "starts"), _attr(node, "ends"), _attr(node, "axes"), None
    assert starts is not None and ends is not None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        index[int(axis) % x.ndim] = slice(int(start), int(end), int(step))  # numpy clamps like ONNX does
    return x[tuple(index)]


def _extremum(combine: Callable) -> Callable:
    """Max or Min over any number of inputs, in the first one's type."""

    def run(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
        arrays = [a for a in inputs if a is not None]
        result = arrays[0]
        for other in arrays[1:]:
            result = combine(result, other)
        return np.asarray(result).astype(arrays[0].dtype)

    return run


_max = _extremum(np.maximum)


def _relu(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    return np.maximum(x, np.zeros((), dtype=x.dtype))


def _clip(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    x = inputs[0]
    assert x is not None
    low = inputs[1] if len(inputs) > 1 else _attr(node, "min")
    high = inputs[2] if len(inputs) > 2 else _attr(node, "max")
    if low is not None:
        x = np.maximum(x, np.asarray(low, dtype=x.dtype))
    if high is not None:
        x = np.minimum(x, np.asarray(high, dtype=x.dtype))
    return x


def _where(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    c, a, b = inputs
    return np.where(c, a, b)


def _errstate(fn: Callable) -> Callable:
    def run(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(node, inputs)

    return run


_OPS: dict[str, Callable[[ir.Node, Sequence[np.ndarray | None]], np.ndarray]] = {
    "Add": _errstate(_binary(np.add)),
    "Sub": _errstate(_binary(np.subtract)),
    "Mul": _errstate(_binary(np.multiply)),
    "Div": _errstate(_binary(np.divide)),
    "Pow": _pow,
    "Mod": _mod,
    "Sqrt": _unary(np.sqrt),
    "Reciprocal": _unary(np.reciprocal),
    "Neg": _unary(np.negative),
    "Identity": lambda node, inputs: inputs[0],  # type: ignore[dict-item]
    "ReduceMean": _errstate(_reduce(np.mean)),
    "ReduceSum": _errstate(_reduce(np.sum)),
    "GlobalAveragePool": _errstate(_global_average_pool),
    "ReduceProd": _errstate(_reduce(np.prod)),
    "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
    "ReduceSumSquare": _errstate(_reduce(lambda x, axis, keepdims: np.sum(x * x, axis=axis, keepdims=keepdims))),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Expand": _expand,
    "Where": _where,
    "Max": _errstate(_max),
    "Min": _errstate(_extremum(np.minimum)),  # dynamo's `Min(s, padded)` in a view's target
    "Relu": _errstate(_relu),
    "Clip": _errstate(_clip),
    "Shape": _shape,
    "Size": _size,
    "Range": _range,
    "ConstantOfShape": _constant_of_shape,
    "Concat": _concat,
    "Gather": _gather,
    "Slice": _slice,
}


def _sigmoid(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """In float64, rounded once to the input's type through float32, as the kernels' activations round."""
    x = inputs[0]
    assert x is not None
    with np.errstate(over="ignore"):
        y = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    return y.astype(np.float32).astype(x.dtype) if x.dtype != np.float64 else y


#: Activations the families fuse after or before a norm (an activation after it, a gate before it): evaluated by the
#: proof, never folded as constants. Here, not in a family's module, so that every family that fuses one finds it.
_EVALUATED_ONLY: dict[str, Callable[[ir.Node, Sequence[np.ndarray | None]], np.ndarray]] = {"Sigmoid": _sigmoid}


def register_op(op_type: str, run: Callable[[ir.Node, Sequence[np.ndarray | None]], np.ndarray]) -> None:
    """Teaches the proof an op a family's matches contain (ops the built-in families never match): `run`
    maps the node and its input arrays (float64 when widened) to its one output. Such ops are evaluated only, never
    folded as constants (SUPPORTED_OPS keeps the built-in list)."""
    _OPS.setdefault(op_type, run)


#: Ops that may sit inside a matched norm or a folded constant: elementwise and per-row ops, layout ops, and the
#: integer shape arithmetic that dynamo emits to restore a reduction's dims.
SUPPORTED_OPS = frozenset(_OPS) | {"Cast", "CastLike", "Constant"}
_OPS.update(_EVALUATED_ONLY)
#: The ops of `_OPS` whose output can be larger than every input (numpy broadcasting), for `_output_elements`.
_BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Where"})


#: Native norm ops the evaluator runs (ONNX's, and ONNX Runtime's in the default or com.microsoft domain: the op
#: records' native ops that the take-over reads, without a residual): op -> whether it is an RMS norm. Not in
#: SUPPORTED_OPS: constant folding and the decomposed matchers never meet them.
NORM_OPS = {native.op_type: op.rms for op, native in native_ops() if native.take_over and not op.skip}
_MS = MS_DOMAIN
_STASH = (int(ir.DataType.FLOAT), int(ir.DataType.DOUBLE))


def _standard_norm(node: ir.Node) -> bool:
    """Whether `node` has the ONNX-standard semantics (its function body: normalised value rounded to X's type,
    affine in X's type) rather than ONNX Runtime's contrib ones (computed in float32, Y of the scale's type rounded
    once). The same split as the take-over's (native.py), from the op records' native ops: LayerNormalization from
    opset 17, RMSNormalization."""
    graph = node.graph
    opset = onnx_opset(graph.opset_imports) if graph is not None else None
    found = native_of(node.op_type, node.domain, opset or 0)
    return found is not None and found[1].single_type


def _native_norm(node: ir.Node, inputs: Sequence[np.ndarray | None], widen: bool) -> list[np.ndarray]:
    """A native norm op's outputs (Y, then Mean and InvStdDev or the contrib ops' inv_std_var), computed by the
    ops' reference (float64 statistics, then the op's rounding points in its element types; everything float64
    with `widen`). Statistics stashed in float32 are computed in float64 and rounded to float32 at the end, within
    a unit in the last place of a float32 computation; other stash types than float32/float64 are not evaluated."""
    rms = NORM_OPS[node.op_type]
    x = inputs[0]
    scale = inputs[1] if len(inputs) > 1 else None
    bias = inputs[2] if len(inputs) > 2 and not rms else None
    if x is None:
        raise EvaluationError(f"{node.op_type} without an input")
    stash = int(_attr(node, "stash_type", 1))
    if stash not in _STASH:
        raise EvaluationError(f"{node.op_type} with stash_type {stash} (statistics only in float32 or float64)")
    attrs = NormAttributes(axis=int(_attr(node, "axis", -1)), epsilon=float(_attr(node, "epsilon", 1e-5)))
    standard = _standard_norm(node)
    if standard and not widen and x.dtype != np.float64:
        t = elem_type(x.dtype)  # the function body rounds the normalised value, the product and the sum to T
        attrs = NormAttributes(attrs.axis, attrs.epsilon, normalized_type=t, multiply_type=t)
    y, inv, mean = normalized(x, scale, bias, attrs, rms=rms)
    if widen:
        out_dtype, stat_dtype = np.dtype(np.float64), np.dtype(np.float64)
    else:  # ONNX: Y of X's type; contrib ops: Y of the scale's type, rounded once
        out_dtype = x.dtype if standard or scale is None else scale.dtype
        stat_dtype = np_dtype(stash)
    # Narrow through float32 as the kernels do (double rounding through float32 is innocuous).
    y = y if out_dtype == np.float64 else y.astype(np.float32).astype(out_dtype)
    stats = [inv] if rms else [mean, inv]
    outputs = [y, *(s.astype(stat_dtype) for s in stats if s is not None)]
    if len(node.outputs) > len(outputs):
        raise EvaluationError(f"{node.op_type} with {len(node.outputs)} outputs")
    return outputs[: len(node.outputs)]


def _is_native_norm(node: ir.Node) -> bool:
    return node.op_type in NORM_OPS and (is_onnx_domain(node.domain) or node.domain == _MS)


def _cast(array: np.ndarray, to: int, widen: bool) -> np.ndarray:
    dtype = ir.DataType(to)
    if widen and dtype in _FLOATS:
        return array.astype(np.float64)
    with np.errstate(all="ignore"):
        if dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16) and array.dtype == np.float64:
            # Narrow through float32 like runtimes do (double rounding through float32 is innocuous).
            array = array.astype(np.float32)
        return array.astype(np_dtype(int(to)))


#: The element type of each scalar and list form of a `Constant` node's attribute.
_CONSTANT_FORMS = {
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
}


def constant_attribute(node: ir.Node, widen: bool = False) -> np.ndarray:
    """The output of a `Constant` node, whichever attribute holds it; EvaluationError for strings and sparse
    tensors, which no norm reads."""
    attr = next(iter(node.attributes.values()), None)
    if attr is None:
        raise EvaluationError("Constant without a value")
    if attr.name == "value":
        return tensor_array(attr.value, widen)
    dtype = _CONSTANT_FORMS.get(attr.name)
    if dtype is None:
        raise EvaluationError(f"cannot evaluate a Constant's {attr.name}")
    array = np.asarray(attr.value, dtype=dtype)
    return array.astype(np.float64) if widen and dtype is np.float32 else array


def tensor_array(tensor: ir.TensorProtocol, widen: bool = False) -> np.ndarray:
    array = tensor.numpy()
    if widen and tensor.dtype in _FLOATS:
        return array.astype(np.float64)
    return array


def evaluate(
    outputs: Sequence[ir.Value],
    feeds: Mapping[ir.Value, np.ndarray],
    *,
    widen: bool = False,
    max_nodes: int = 256,
    symbolic_fill: int | None = None,
    dim_sizes: Mapping[str, int] | None = None,
) -> list[np.ndarray]:
    """Evaluates `outputs` from `feeds` and constants; raises EvaluationError on anything else.

    With `widen`, every float tensor (constants, feeds, casts) is computed in float64. `Shape` nodes whose input has
    a known shape are computed from it, named dims as `dim_sizes` gives them (the sizes the feeds have there: a
    view's target read from `Shape` of a graph input), other symbolic dims as `symbolic_fill`, ... (see
    `static_shape`).
    """
    evaluator = _Evaluator(feeds, widen, max_nodes, symbolic_fill, dim_sizes)
    return [evaluator.get(v) for v in outputs]  # type: ignore[misc]


class _Evaluator:
    """Values computed so far (the feeds first) and the node budget left."""

    def __init__(
        self,
        feeds: Mapping[ir.Value, np.ndarray],
        widen: bool,
        max_nodes: int,
        symbolic_fill: int | None,
        dim_sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.widen = widen
        self.budget = max_nodes
        self.symbolic_fill = symbolic_fill
        self.dim_sizes = dim_sizes
        self.cache: dict[ir.Value, np.ndarray] = {}
        for value, array in feeds.items():
            # bfloat16 (ml_dtypes) has numpy kind "V", not "f": test the ONNX element type instead.
            is_float = value.dtype in _FLOATS or array.dtype.kind == "f"
            self.cache[value] = array.astype(np.float64) if widen and is_float else array

    def get(self, value: ir.Value | None) -> np.ndarray | None:
        if value is None:
            return None
        if value in self.cache:
            return self.cache[value]
        if value.const_value is not None and not value.is_graph_input():
            result = tensor_array(value.const_value, self.widen)
        else:
            node = value.producer()
            if node is None:
                raise EvaluationError(f"value {value.name!r} is neither an input of the subgraph nor a constant")
            self.budget -= 1
            if self.budget < 0:
                raise EvaluationError("subgraph too large to evaluate")
            if _is_native_norm(node):
                # Several outputs at once (Y and the statistics): keep each of them.
                arrays = _native_norm(node, [self.get(v) for v in node.inputs], self.widen)
                self.cache.update(zip(node.outputs, arrays, strict=False))
                return self.cache[value]
            result = self.run_node(node)
        self.cache[value] = result
        return result

    def run_node(self, node: ir.Node) -> np.ndarray:
        if not is_onnx_domain(node.domain):
            raise EvaluationError(f"cannot evaluate {node.domain}::{node.op_type}")
        if node.op_type == "Constant":
            return constant_attribute(node, self.widen)
        static = static_shape(node, self.symbolic_fill, self.dim_sizes) if node.op_type in SHAPE_OPS else None
        if static is not None:
            return static  # the dims are known: no need for the input's values (`x.shape[-1]` as a divisor)
        if node.op_type == "CastLike" and len(node.inputs) == 2 and node.inputs[1] is not None:
            like = node.inputs[1].dtype
            if like is not None:  # the target is a type, not a value: no need to evaluate the second input
                source = self.get(node.inputs[0])
                assert source is not None
                return _cast(source, int(like), self.widen)
        inputs = [self.get(v) for v in node.inputs]
        if node.op_type == "Cast":
            assert inputs[0] is not None
            return _cast(inputs[0], int(_attr(node, "to")), self.widen)
        if node.op_type == "CastLike":
            assert inputs[0] is not None and inputs[1] is not None
            return inputs[0].astype(inputs[1].dtype)
        fn = _OPS.get(node.op_type)
        if fn is None:
            raise EvaluationError(f"cannot evaluate {node.op_type}")
        if len(node.outputs) != 1:
            raise EvaluationError(f"{node.op_type} with several outputs")
        elements = _output_elements(node, inputs)
        if elements is not None and elements > MAX_EVALUATED_ELEMENTS:
            raise EvaluationError(f"{node.op_type} would make {elements} elements, too many to evaluate")
        return fn(node, inputs)


def _output_elements(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> int | None:
    """How many elements `node` would make, where its inputs say so before it runs (ops that make arrays from a
    shape or a range, and broadcasting ones); None when they do not."""
    try:
        if node.op_type == "Expand" and inputs[0] is not None:
            target = _int_list(inputs[1]) or []
            return math.prod(np.broadcast_shapes(inputs[0].shape, tuple(target)))
        if node.op_type == "ConstantOfShape":
            return math.prod(_int_list(inputs[0]) or [])
        if node.op_type == "Range" and all(i is not None for i in inputs[:3]):
            start, limit, delta = (float(np.asarray(i).reshape(())) for i in inputs[:3])  # type: ignore[union-attr]
            return max(0, math.ceil((limit - start) / delta)) if delta else None
        if node.op_type in _BROADCASTING:
            return math.prod(np.broadcast_shapes(*(i.shape for i in inputs if i is not None)))
        return None
    except (ValueError, TypeError, OverflowError):
        return None  # not broadcastable, or not a shape: the op itself says what is wrong
