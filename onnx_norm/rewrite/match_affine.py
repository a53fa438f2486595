"""Step 5 of the matcher (match.py): the affine strategies, which read scale and bias from the tail as the fused op
takes them. `default_affine` picks `runtime_rows` (a scale or bias the model takes at run time, one row) or
`constant_rows` (constants that vary only along the normalised axes); a family passes its own to `find_norm`."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import FLOAT_TYPES
from onnx_norm.ops.reference import np_dtype
from onnx_norm.rewrite import constants
from onnx_norm.rewrite.match_state import Affine, AffineInputs, AffineStrategy, Layout, fold_product
from onnx_norm.rewrite.structure import NearMiss

__all__ = ["Affine", "AffineInputs", "AffineStrategy", "default_affine"]


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
    if any(a is not None and a.ndim > len(row) for a in made.values()):
        raise NearMiss("a per-head constant scale or bias beside a run-time one (which must be one row)")
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
    axes, in one element type (float32 when the graph's differ, or when theirs would round a folded one)."""
    layout = inputs.layout
    row_scale, scale_value, scale_dtype = _scale_row(inputs)
    row_bias, bias_value, bias_dtype = _bias_row(inputs)
    if layout.x_shape is not None and row_scale is not None and row_bias is not None:
        # The op reads Scale and Bias with the same row groups: a one-row one beside a per-head one is repeated.
        shape = np.broadcast_shapes(row_scale.shape, row_bias.shape)
        if row_scale.shape != shape:
            row_scale, scale_value = np.broadcast_to(row_scale, shape), None
        if row_bias.shape != shape:
            row_bias, bias_value = np.broadcast_to(row_bias, shape), None
    new_constants = {}
    if row_scale is not None and scale_value is None:
        new_constants["scale"] = row_scale
    if row_bias is not None and bias_value is None:
        new_constants["bias"] = row_bias
    const_type = _common_type(
        scale_dtype if row_scale is not None else None, bias_dtype if row_bias is not None else None
    )
    if not all(_holds(array, const_type) for array in new_constants.values()):
        # A folded row that the graph's narrow type rounds (an unbiased std's sqrt((N-1)/N) times a float16
        # weight): the op reads float32 Scale and Bias beside a narrow X, exactly.
        const_type = ir.DataType.FLOAT
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
    scale_array = fold_product(terms)
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


def _row_constant(
    array: np.ndarray, x_shape: list | None, axes: tuple[int, ...], perm: tuple[int, ...] | None, what: str
) -> np.ndarray:
    """`array` as it broadcasts against one row (the normalised dims), or as rows of the row-group dims just before
    them (a per-head scale [H, D] over [B, S, H, D] normalised over D stays [H, D]: `_row_groups`); NearMiss when it
    varies across rows in another way.

    With `x_shape` None (rank unknown, `axes` counted from the end) the row is the constant's trailing dims, which
    must then be the whole row: a constant that broadcasts inside a row of unknown size cannot be laid out."""
    if x_shape is None:
        k = len(axes)
        if array.ndim > k and any(d != 1 for d in array.shape[: array.ndim - k]):
            raise NearMiss(
                f"{what} varies across rows (shape {list(array.shape)}) and the input's rank is unknown, so its "
                "row-group dims cannot be placed"
            )
        row = array.reshape(array.shape[max(array.ndim - k, 0) :])
        if row.ndim < k or 1 in row.shape:
            raise NearMiss(f"{what} of shape {list(array.shape)} broadcasts inside a row whose size is unknown")
        return row
    rank = len(x_shape)
    if array.ndim > rank:
        raise NearMiss(f"{what} has more dims than the input")
    padded = array.reshape((1,) * (rank - array.ndim) + array.shape)
    given = list(x_shape)
    x_shape = list(x_shape)
    groups = _row_groups(padded, x_shape, axes, perm, what)
    static = all(isinstance(d, int) for d in given[rank - len(axes) - groups : rank - len(axes)])
    for dim in axes:
        if not isinstance(x_shape[dim], int):
            # A symbolic normalised dim: the constant's own size is the only one the model runs with.
            if padded.shape[dim] == 1:
                raise NearMiss(
                    f"{what} of shape {list(array.shape)} broadcasts inside a row of symbolic size {x_shape[dim]}"
                )
            x_shape[dim] = padded.shape[dim]
        if padded.shape[dim] not in (1, x_shape[dim]):
            raise NearMiss(f"{what} shape {list(array.shape)} does not broadcast against the input")
    if perm is not None:
        padded = np.transpose(padded, perm)
        x_shape = [x_shape[p] for p in perm]
    k = len(axes) + groups
    row_shape = tuple(padded.shape[rank - k : rank - len(axes)]) + tuple(x_shape[rank - len(axes) :])
    rows = np.broadcast_to(padded.reshape(padded.shape[rank - k :]), row_shape)
    if groups and static and np.all(rows == rows[(0,) * groups]):
        # The same in every row group: one row (a native op can take it). Not where a row-group dim is symbolic:
        # the scale's size there is the only one the graph runs with, and the proof reads it from the scale.
        return rows[(0,) * groups]
    return rows


def _row_groups(
    padded: np.ndarray, x_shape: list, axes: tuple[int, ...], perm: tuple[int, ...] | None, what: str
) -> int:
    """How many of the input's dims just before the normalised axes `padded` varies along (its row-group dims): it
    must vary along a block of them ending right before the axes, each of its own size there, and be 1 on every
    dim before the block; the fused op then reads row r of X with row r mod prod(groups) of the scale. A symbolic
    dim of the input takes the constant's size (the only one the model runs with)."""
    varying = [d for d in range(len(x_shape)) if d not in axes and padded.shape[d] != 1]
    if not varying:
        return 0
    shape = list(padded.shape)
    first = min(axes)
    if perm is not None or any(a != first + i for i, a in enumerate(sorted(axes))) or first + len(axes) != len(shape):
        raise NearMiss(f"{what} varies across rows (shape {shape}) of a norm whose normalised axes are not last")
    start = varying[0]
    for dim in range(start, first):
        if padded.shape[dim] == 1 and x_shape[dim] != 1:
            raise NearMiss(
                f"{what} varies across rows (shape {shape}) along dim {start} of the input but is broadcast over "
                f"dim {dim} (size {x_shape[dim]}): only dims just before the normalised axes can be row groups"
            )
        if isinstance(x_shape[dim], int) and padded.shape[dim] != x_shape[dim]:
            raise NearMiss(f"{what} shape {shape} does not broadcast against the input")
        x_shape[dim] = padded.shape[dim]
    return first - start


def _tensor_fits(value: ir.Value, row: np.ndarray) -> bool:
    """A direct constant the fused op can read as is: the row's shape, leading 1s of the row's shape removed."""
    if not constants.is_direct_constant(value) or value.shape is None:
        return False
    shape = tuple(value.shape)
    row_shape = tuple(row.shape)
    while row_shape and row_shape[0] == 1:
        row_shape = row_shape[1:]
    return shape in (tuple(row.shape), row_shape)


def _pins_a_dim(layout: Layout) -> bool:
    """Whether a constant row is the only size of a symbolic normalised dim (kept even when it scales nothing: the
    model runs only at that size, and the proof reads it from the row)."""
    return layout.x_shape is not None and not all(isinstance(layout.x_shape[a], int) for a in layout.axes)


def _constant_dtype(values: list[ir.Value]) -> ir.DataType | None:
    types = {v.dtype for v in values if v.dtype is not None}
    if len(types) == 1:
        return types.pop()
    return ir.DataType.FLOAT if types else None


def _holds(array: np.ndarray, dtype: ir.DataType) -> bool:
    """True when `dtype` holds every value of `array` as float32 has it (the op's arithmetic)."""
    wide = np.asarray(array, dtype=np.float64).astype(np.float32)
    return bool(np.array_equal(wide.astype(np_dtype(int(dtype))).astype(np.float32), wide, equal_nan=True))


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
