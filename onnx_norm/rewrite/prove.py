"""Proving a candidate before it is rewritten: the matched subgraph against the fused op's reference.

Two checks, on random inputs of the input's shape (symbolic dims set to small sizes):

1. The formula. The subgraph is evaluated with every float widened to float64 (its exact value) on four samples
   (normal rows, rows of large magnitude with a large offset, near-constant rows, constant rows) and compared
   with the numpy reference (`onnx_norm.ops.reference`) computed in float64 with the candidate's epsilon, axes,
   scale and bias. Structure mistakes (another epsilon placement, another divisor, another tensor's mean, scale
   varying across rows) show up as large differences, especially on the near-constant and offset rows.
2. The rounding. The subgraph is evaluated in its own element types on the normal sample and compared with the
   reference using the candidate's rounding attributes, with a tolerance of a few units in the last place of the
   output type: it catches a wrong output type or rounding point, not the last-bit differences that the fused
   op's fp32 statistics legitimately make.

A failed check raises NearMiss with the measured error, and the candidate is reported instead of rewritten.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from onnx_norm.accuracy import accuracy_loss
from onnx_norm.ops.reference import np_dtype
from onnx_norm.ops.schema import NormAttributes
from onnx_norm.rewrite import constants, family
from onnx_norm.rewrite.evaluate import EvaluationError, evaluate
from onnx_norm.rewrite.match import Candidate
from onnx_norm.rewrite.spec import NormSpec
from onnx_norm.rewrite.structure import NearMiss

#: Relative tolerance of the formula check (float64 graph vs reference with float32 output rounding).
FORMULA_TOLERANCE = 1e-5
#: Tolerance of the rounding check, by output element type: a few units in the last place.
ROUNDING_TOLERANCE = {
    ir.DataType.FLOAT: 2e-4,
    ir.DataType.FLOAT16: 1e-2,
    ir.DataType.BFLOAT16: 6e-2,
}
_MAX_ELEMENTS = 1 << 22
#: Ops that compute each row from that row alone (no shape arithmetic), so that fewer rows can be evaluated.
_ROW_WISE = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Sqrt",
        "Reciprocal",
        "Neg",
        "Identity",
        "Cast",
        "CastLike",
        "ReduceMean",
        "ReduceSum",
        "ReduceSumSquare",
        "Unsqueeze",
        "Constant",
    }
)
_SAMPLES = ("normal", "large offset", "near-constant", "constant")


def concrete_shape(shape: ir.Shape) -> list[int]:
    """The shape with symbolic dims replaced by small distinct sizes (2, 3, 4, ...); dims with the same name get the
    same size (a graph may only be valid where they agree), anonymous dims a size of their own."""
    sizes = iter(range(2, 64))
    named: dict[str, int] = {}
    result = []
    for dim in shape:
        if isinstance(dim, int):
            result.append(dim)
            continue
        name = getattr(dim, "value", None)
        if name is None:
            result.append(next(sizes))
        else:
            if name not in named:
                named[name] = next(sizes)
            result.append(named[name])
    return result


def _pinned(shape: list[int], candidate: Candidate) -> list[int]:
    """`shape` with each symbolic normalised dim set to the size a constant scale or bias has there (the only size
    the model runs with); a run-time one of a named dim takes the size chosen for that name. The op's Scale and
    Bias are rows of the normalised dims in the order the op sees them (after a channels-first Transpose)."""
    spec = candidate.spec
    assert spec.x.shape is not None
    dims = list(spec.x.shape)
    rank, k = len(dims), len(candidate.axes)
    row_axes = list(candidate.perm[rank - k :]) if candidate.perm is not None else list(range(rank - k, rank))
    pinned = list(shape)
    for value in (spec.scale, spec.bias):
        if value is None or value.shape is None or constants.is_runtime_parameter(value):
            continue
        for offset, size in enumerate(reversed(list(value.shape)), start=1):
            if offset > k and candidate.perm is not None:
                break
            # Past the row: a per-row-group scale's dims, those of X just before the normalised axes.
            axis = row_axes[-offset] if offset <= k else rank - offset
            if axis < 0:
                break
            if isinstance(size, int) and size > 1 and not isinstance(dims[axis], int):
                pinned[axis] = size
    return pinned


def _dim_sizes(spec: NormSpec, shape: list[int]) -> dict[object, int]:
    """The size chosen for each dim of the input, by the dim itself (an int stands for itself, a named dim for the
    size it got): how a run-time scale of shape [N] is fed."""
    sizes: dict[object, int] = {}
    for dim, size in zip(spec.x.shape or (), shape, strict=False):
        if not isinstance(dim, int) and dim.value is not None:
            sizes.setdefault(dim.value, size)
    return sizes


def _sample(kind: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "large offset":
        return 300.0 + 50.0 * rng.standard_normal(shape)
    if kind == "near-constant":
        return 1.25 + 1e-3 * rng.standard_normal(shape)
    return np.full(shape, 0.75)


@dataclasses.dataclass
class _Feeds:
    arrays: dict[ir.Value, np.ndarray]
    x: np.ndarray  # what the norm normalises (x + skip for residual variants), in the input's type
    x_wide: np.ndarray  # the same in float64 without the input-type rounding of the sum
    extra: dict[str, np.ndarray]  # the family's extra inputs, by name
    runtime: dict[str, np.ndarray]  # "scale"/"bias" the model takes at run time (random rows here)
    sizes: dict[str, int]  # the size each named dim of the input got (for `Shape`s of other values with it)


def _proof_input_shape(candidate: Candidate) -> list[int]:
    spec = candidate.spec
    if candidate.proof_shape is not None:
        shape = list(candidate.proof_shape)
    else:
        assert spec.x.shape is not None
        shape = _pinned(concrete_shape(spec.x.shape), candidate)
    normalised = {axis % len(shape) for axis in candidate.axes}
    # A dim that a constant of the subgraph varies along keeps its size (a per-head scale has one row per head).
    normalised |= _constant_dims(candidate, len(shape))
    if all(node.op_type in _ROW_WISE for node in candidate.nodes):
        # Rows are independent: a few of them prove as much as the model's static batch and sequence would.
        shape = [d if axis in normalised else min(d, 3) for axis, d in enumerate(shape)]
    if int(np.prod(shape, dtype=np.int64)) > _MAX_ELEMENTS:
        raise NearMiss(f"input of {shape} elements is too large to prove the candidate", spec.x)
    return shape


def _constant_dims(candidate: Candidate, rank: int) -> set[int]:
    """The dims of the input (right-aligned, as they broadcast) along which a constant the subgraph reads has more
    than one element: a per-head scale [H, D], also one the fused op reads as a single row because its heads are
    equal."""
    dims: set[int] = set()
    for node in candidate.nodes:
        for value in node.inputs:
            if value is None or value.shape is None or not constants.is_constant(value) or len(value.shape) > rank:
                continue
            offset = rank - len(value.shape)
            dims |= {offset + i for i, d in enumerate(value.shape) if not isinstance(d, int) or d != 1}
    return dims


def _broadcast_shape(value: ir.Value, x_shape: list[int], x_dims: ir.Shape | None) -> list[int]:
    """The shape of an extra input fed with an input of `x_shape`: its dims of 1 stay, the others are x's: the dim
    of x aligned from the end (as they broadcast) when it is the same dim in the model, else the first dim of x
    that is. An extra input of lower rank whose first dim is none of x's is per sample (a [B, H] factor of a
    [B, S, H] input): that dim is x's first."""
    if value.shape is None or len(value.shape) > len(x_shape):
        raise NearMiss(f"extra input {value.name!r} has no shape that broadcasts against the input", value)
    offset = len(x_shape) - len(value.shape)
    dims = list(x_dims) if x_dims is not None and len(x_dims) == len(x_shape) else None

    def size(i: int, d: object) -> int:
        if d == 1:
            return 1
        if dims is not None and dims[offset + i] != d and d in dims:
            return x_shape[dims.index(d)]
        if i == 0 and offset > 0 and len(value.shape) > 1 and (dims is None or d not in dims):
            return x_shape[0]
        return x_shape[offset + i]

    return [size(i, d) for i, d in enumerate(value.shape)]


def _feeds(candidate: Candidate, kind: str, rng: np.random.Generator) -> _Feeds:
    spec = candidate.spec
    assert spec.x.dtype is not None
    shape = _proof_input_shape(candidate)
    dtype = np_dtype(int(spec.x.dtype))
    data = _sample(kind, shape, rng)
    extra = {}
    for name, value in spec.extra_inputs.items():
        assert value.dtype is not None
        array = rng.standard_normal(_broadcast_shape(value, shape, spec.x.shape)).astype(np.float32)
        extra[name] = array.astype(np_dtype(int(value.dtype)))
    sizes = _dim_sizes(spec, shape)
    runtime = _runtime_parameters(spec, rng, sizes)
    named = {str(k): v for k, v in sizes.items()}
    given = {spec.extra_inputs[name]: array for name, array in extra.items()}
    given |= {getattr(spec, name): array for name, array in runtime.items()}
    if spec.skip is None:
        x = data.astype(np.float32).astype(dtype)
        arrays = {spec.x: x} | dict.fromkeys(candidate.aliases, x) | given
        return _Feeds(arrays, x, x.astype(np.float64), extra, runtime, named)
    half = (data / 2).astype(np.float32).astype(dtype)
    rest = (data - half.astype(np.float64)).astype(np.float32).astype(dtype)
    total = (half.astype(np.float32) + rest.astype(np.float32)).astype(dtype)
    wide = half.astype(np.float64) + rest.astype(np.float64)
    return _Feeds({spec.x: half, spec.skip: rest} | given, total, wide, extra, runtime, named)


def _runtime_parameters(spec: NormSpec, rng: np.random.Generator, sizes: dict[object, int]) -> dict[str, np.ndarray]:
    """Random rows for a scale or bias the model takes at run time (a scale around 1, a bias around 0); a named dim
    of theirs has the size `sizes` gives it."""
    arrays = {}
    for name, value, centre in (("scale", spec.scale, 1.0), ("bias", spec.bias, 0.0)):
        if value is None or not constants.is_runtime_parameter(value):
            continue
        assert value.shape is not None and value.dtype is not None
        dims = [d if isinstance(d, int) else sizes.get(d.value, 1) for d in value.shape]
        row = centre + 0.5 * rng.standard_normal(dims)
        arrays[name] = row.astype(np.float32).astype(np_dtype(int(value.dtype)))
    return arrays


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None or constants.is_runtime_parameter(value):
        return None  # none, or fed at run time (_Feeds.runtime)
    array = constants.constant_array(value)
    if array is None:
        raise NearMiss(f"scale or bias {value.name!r} is not constant", value)
    return array


def _reference(
    candidate: Candidate, feeds: _Feeds, attrs: NormAttributes, *, wide: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The family's reference on the candidate's parameters: (Y, inverse std, mean or None)."""
    spec = candidate.spec
    params: dict[str, np.ndarray | None] = {"scale": _const(spec.scale), "bias": _const(spec.bias)}
    params |= feeds.runtime | feeds.extra
    if wide:
        params = {k: None if v is None else v.astype(np.float64) for k, v in params.items()}
    x = feeds.x_wide if wide else feeds.x
    if candidate.perm is not None:
        x = np.transpose(x, candidate.perm)
    y, inv, mean = family.get(spec.kind).reference(x, params, attrs)
    if candidate.perm is not None:
        y = np.transpose(y, np.argsort(candidate.perm))
    return y, inv, mean


def _max_error(actual: np.ndarray, expected: np.ndarray, tolerance: float) -> tuple[float, bool]:
    """Largest error relative to the tolerance allowed for it (> 1 fails); NaN/Inf must agree."""
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    if a.shape != e.shape:
        return float("inf"), False
    finite = np.isfinite(e)
    if not np.array_equal(finite, np.isfinite(a)):
        return float("inf"), False
    if not finite.any():
        return 0.0, True
    magnitude = float(np.max(np.abs(e[finite])))
    allowed = tolerance * (np.abs(e[finite]) + max(magnitude, 1e-6))
    ratio = float(np.max(np.abs(a[finite] - e[finite]) / allowed))
    return ratio, ratio <= 1.0


def _outputs(candidate: Candidate) -> list[tuple[str, ir.Value]]:
    spec = candidate.spec
    outputs = [("Y", spec.y)]
    if spec.mean is not None:
        outputs.append(("Mean", spec.mean))
    if spec.inv_std is not None:
        outputs.append(("InvStdDev", spec.inv_std))
    if spec.sum is not None:
        outputs.append(("Sum", spec.sum))
    return outputs


def prove(candidate: Candidate, *, seed: int = 0) -> None:
    """Raises NearMiss when the subgraph and the fused op disagree; returns quietly when they agree."""
    spec = candidate.spec
    rng = np.random.default_rng(seed)
    outputs = _outputs(candidate)
    exact = dataclasses.replace(spec.attrs, normalized_type=0, multiply_type=0, output_type=0)
    for kind in _SAMPLES:
        feeds = _feeds(candidate, kind, rng)
        try:
            graph = evaluate([v for _, v in outputs], feeds.arrays, widen=True, dim_sizes=feeds.sizes)
        except (EvaluationError, ValueError, TypeError, IndexError) as err:
            raise NearMiss(f"cannot evaluate the matched subgraph: {err}") from err
        y, inv, mean = _reference(candidate, feeds, exact, wide=True)
        expected = {"Y": y, "Mean": mean, "InvStdDev": inv, "Sum": feeds.x_wide}
        for (name, _), actual in zip(outputs, graph, strict=False):
            reference = expected[name]
            assert reference is not None
            ratio, ok = _max_error(
                actual, np.broadcast_to(reference, actual.shape) if name != "Y" else reference, FORMULA_TOLERANCE
            )
            if not ok:
                raise NearMiss(
                    f"proof failed: {name} differs from the fused op on {kind} rows "
                    f"({ratio:.3g} x the float64 tolerance)"
                )
    # The rounding attributes, in the graph's own element types, on normal rows.
    feeds = _feeds(candidate, "normal", rng)
    try:
        (y_graph,) = evaluate([spec.y], feeds.arrays, dim_sizes=feeds.sizes)
    except (EvaluationError, ValueError, TypeError, IndexError) as err:
        raise NearMiss(f"cannot evaluate the matched subgraph: {err}") from err
    y_ref, _, _ = _reference(candidate, feeds, spec.attrs, wide=False)
    if y_graph.dtype != y_ref.dtype:
        raise NearMiss(f"proof failed: the graph's output is {y_graph.dtype}, the fused op's {y_ref.dtype}")
    # The graph is only as exact as the narrowest type it computes in (an fp16 graph cast to fp32 at the end).
    types = {spec.x.dtype, spec.y.dtype} | {v.dtype for n in candidate.nodes for v in n.outputs}
    tolerance = max(ROUNDING_TOLERANCE.get(t, 2e-4) for t in types if t is not None)  # type: ignore[arg-type]
    ratio, ok = _max_error(y_graph, y_ref, tolerance)
    if not ok:
        raise NearMiss(f"proof failed: the rounding differs from the graph's ({ratio:.3g} x the tolerance)")
    y_exact, _, _ = _reference(candidate, feeds, exact, wide=True)
    less_accurate = accuracy_loss(y_ref, y_graph, y_exact)
    if less_accurate:
        raise NearMiss(f"proof failed: the fused op would be less accurate than the subgraph ({less_accurate})")
