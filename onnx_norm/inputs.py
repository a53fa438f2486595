"""Model inputs for the parity gate and the benchmark: loaded from .npz/.npy files or generated from the signature.

Generated inputs are seeded and realistic enough that a model computes what it computes in production, each input
by the first rule that applies:

- inputs set with `--input NAME=VALUE` (`InputOptions.values`) take that value, in every sample; a list fixes the
  length of a 1-D input, one value fills the input (a scalar input: a scalar). With data files, the value replaces
  that input in every file's sample;
- attention masks are 0/1 (ones, with a padded tail on every row after the first);
- position ids count up from 0 along the last axis;
- integer inputs that index a table (followed to the Gather they feed, in the graph or an If/Loop subgraph) stay
  inside it;
- a one-element input (a scalar, or `[1]`) that the graph compares with constants or branches on takes a value
  the graph can use (`onnx_norm.input_values`: the largest constant it is tested for equality with, else the
  largest it is ordered against; true for an If's or Where's condition): Silero VAD's sample rate `sr`, compared
  with 8000 and 16000, is 16000, not a random integer that takes a branch the model is never run on;
- other integers are random in [0, 16) (with a warning naming `--input`), bools random, floats standard normal.

A verify report lists the inputs of the last two rules' kind (given, chosen from the graph, or a one-element input
drawn at random); a run that fails on generated inputs names them with `--input`, and the guessed dims with
`--shape`.

Dims are read as ONNX Runtime reads them: a negative dim value (`-1`, as some exporters write a batch dim), an
empty dim param and a missing one are free; 0 is fixed (ORT runs such an input only empty, and verify warns that an
empty output compares nothing). Free dims come from `--shape` (an input's full shape, `input_ids:1,128`, or one
symbolic dim, `sequence_length:128`), else from defaults: 1 for batch dims (and the first axis), 16 for
past-sequence dims, 128 for the rest, but no more than the rows of a learned position-embedding table (BERT-style
models index it with 0..seq-1). A symbolic dim takes the same value in every input that names it.
"""

from __future__ import annotations

import ast
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnx_norm import input_values
from onnx_norm.errors import InputError
from onnx_norm.input_spec import InputSpec
from onnx_norm.ops.reference import np_dtype

logger = logging.getLogger(__name__)

Sample = dict[str, np.ndarray]

DEFAULT_BATCH = 1
DEFAULT_PAST = 16
DEFAULT_DIM = 128

_BATCH_NAMES = re.compile(r"batch|^n$|^b$|^N$", re.IGNORECASE)
_PAST_NAMES = re.compile(r"past|cache", re.IGNORECASE)
_MASK_NAMES = re.compile(r"mask", re.IGNORECASE)
_POSITION_NAMES = re.compile(r"position|pos_ids", re.IGNORECASE)
_GATHER_OPS = frozenset({"Gather", "GatherElements"})
_POSITION_TABLES = re.compile(r"position|pos_emb|wpe", re.IGNORECASE)
_FALLBACK_INT_HIGH = 16
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The inputs a caller must feed: graph inputs that are not initializers (IR < 4 lists those as inputs)."""
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise InputError(f"input {value.name!r} is not a tensor; only tensor inputs are supported")
        shape: tuple[int | str | None, ...] | None = None
        if tensor_type.HasField("shape"):
            shape = tuple(_declared_dim(dim) for dim in tensor_type.shape.dim)
        specs.append(InputSpec(value.name, tensor_type.elem_type, shape))
    return specs


def _declared_dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    """A dim as ONNX Runtime reads it: a negative value (`-1`, as some exporters write a batch dim) is free, as an
    empty dim param is (None: any size), and so is a param that names nothing (Paddle writes `?` for every unknown
    dim: two `?` are not one symbol); 0 is fixed (ORT runs such an input only when it is empty)."""
    if dim.HasField("dim_value"):
        return dim.dim_value if dim.dim_value >= 0 else None
    return dim.dim_param if _IDENTIFIER.search(dim.dim_param) else None


def check_same_inputs(original: onnx.ModelProto, optimized: onnx.ModelProto) -> None:
    """InputError unless both models take inputs of the same names, element types and ranks (they are fed alike):
    bench's correspondence check (`onnx_norm.correspond`) on the inputs alone."""
    from onnx_norm.correspond import check

    check(original, optimized, outputs=False)


def parse_shapes(items: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """Parses `name:1,128` items (`--shape`) into {name: dims}; raises InputError with the item that is wrong."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise InputError(f"--shape {item!r}: expected NAME:D0,D1,... (for example input_ids:1,128)")
        try:
            values = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
        except ValueError:
            raise InputError(f"--shape {item!r}: dims must be integers, got {dims!r}") from None
        if any(v < 0 for v in values):
            raise InputError(f"--shape {item!r}: dims must not be negative")
        shapes[name] = values
    return shapes


def normalize_shapes(shapes: Mapping[str, object] | None) -> dict[str, tuple[int, ...]] | None:
    """`shapes` as {name: dims}: a dim value alone (`{"sequence": 8}`) or a sequence of them (`{"x": [1, 8]}`);
    InputError for anything else or a negative dim."""
    if shapes is None:
        return None
    if not isinstance(shapes, Mapping):
        raise InputError(f"shapes must map an input or dim name to its dims, got {type(shapes).__name__}")
    normalized: dict[str, tuple[int, ...]] = {}
    for name, dims in shapes.items():
        values = [dims] if _is_int(dims) else dims
        if not isinstance(name, str) or isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise InputError(f"shapes[{name!r}]: expected an int or a sequence of ints, got {dims!r}")
        values = list(values)
        if not all(_is_int(v) for v in values):
            raise InputError(f"shapes[{name!r}]: dims must be integers, got {dims!r}")
        if any(int(v) < 0 for v in values):
            raise InputError(f"shapes[{name!r}]: dims must not be negative, got {dims!r}")
        normalized[name] = tuple(int(v) for v in values)
    return normalized


def is_float(dtype: np.dtype) -> bool:
    """Whether a numpy dtype is a floating-point type, bfloat16 (an ml_dtypes type numpy does not call floating)
    included."""
    return np.issubdtype(dtype, np.floating) or dtype == np_dtype(onnx.TensorProto.BFLOAT16)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _default_dim(symbol: str | None, position: int, limit: int | None = None) -> int:
    if symbol and _PAST_NAMES.search(symbol):
        return DEFAULT_PAST
    if (symbol and _BATCH_NAMES.search(symbol)) or position == 0:
        return DEFAULT_BATCH
    return min(DEFAULT_DIM, limit) if limit else DEFAULT_DIM


def position_limit(model: onnx.ModelProto) -> int | None:
    """Rows of the smallest learned position-embedding table (a Gather from an initializer named like one)."""
    tables = {init.name: tuple(init.dims) for init in model.graph.initializer if _POSITION_TABLES.search(init.name)}
    rows = [
        tables[node.input[0]][0]
        for node in model.graph.node
        if node.op_type == "Gather" and node.input and node.input[0] in tables and tables[node.input[0]]
    ]
    return min(rows) if rows else None


def _eval_dim_expression(expr: str, symbols: Mapping[str, int]) -> int | None:
    """Evaluates dim params such as `past_sequence_length + 1` (exporters write them); None if it is not one."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None

    def value(node: ast.AST) -> int | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return symbols.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            left, right = value(node.left), value(node.right)
            if left is None or right is None:
                return None
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            return left // right if right else None
        return None

    if isinstance(tree.body, ast.Name):
        return None  # a plain symbol, not an expression
    return value(tree.body)


def resolve_shapes(
    specs: Sequence[InputSpec], overrides: Mapping[str, Sequence[int]] | None = None, *, limit: int | None = None
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every input: `overrides` by input name or by symbolic dim, then defaults (non-batch
    dims capped at `limit`)."""
    overrides = dict(overrides or {})
    symbols = _symbol_overrides(specs, overrides)
    shapes: dict[str, tuple[int, ...]] = {}
    # Inputs given in full fix their symbolic dims first, so other inputs sharing a symbol agree with them.
    for spec in specs:
        if spec.name in overrides:
            shapes[spec.name] = _given_shape(spec, overrides[spec.name], symbols)
    for spec in specs:
        if spec.name not in shapes:
            shapes[spec.name] = _default_shape(spec, specs, symbols, limit)
    return shapes


def _symbol_overrides(specs: Sequence[InputSpec], overrides: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The values `overrides` gives symbolic dims (keys that are no input name); InputError for a key that is
    neither an input nor a symbol of the model."""
    by_name = {spec.name: spec for spec in specs}
    # Symbols, also those inside exporters' dim expressions such as `past_sequence_length + 1`.
    symbols_in_model = {
        name for spec in specs for d in (spec.shape or ()) if isinstance(d, str) for name in _IDENTIFIER.findall(d)
    }
    symbols: dict[str, int] = {}
    for key, dims in overrides.items():
        if key in by_name:
            continue
        if key in symbols_in_model:
            if len(dims) != 1:
                raise InputError(f"--shape {key}: {key!r} is a symbolic dim and takes one value, got {list(dims)}")
            symbols[key] = int(dims[0])
            continue
        known = ", ".join(spec.describe() for spec in specs) or "none"
        raise InputError(
            f"--shape names {key!r}, which is neither an input nor a symbolic dim of the model (inputs: {known})"
        )
    return symbols


def _given_shape(spec: InputSpec, given_dims: Sequence[int], symbols: dict[str, int]) -> tuple[int, ...]:
    """An input's shape given in full, checked against its declaration; fixes the symbols it names in `symbols`."""
    dims = tuple(int(d) for d in given_dims)
    if spec.shape is None:
        return dims
    if len(dims) != len(spec.shape):
        raise InputError(f"--shape {spec.name}: rank {len(dims)} given, the model expects {spec.describe()}")
    for axis, (given, declared) in enumerate(zip(dims, spec.shape, strict=True)):
        if isinstance(declared, int) and declared != given:
            zero = "; ONNX Runtime runs the model only with an empty input there" if declared == 0 else ""
            raise InputError(
                f"--shape {spec.name}: dim {axis} is fixed to {declared} in the model, got {given} "
                f"({spec.describe()}){zero}"
            )
        if isinstance(declared, str) and _eval_dim_expression(declared, {}) is None:
            previous = symbols.setdefault(declared, given)
            if previous != given:
                raise InputError(
                    f"--shape {spec.name}: dim {axis} ({declared}) is {given} but {declared} is {previous} elsewhere"
                )
    return dims


def _default_shape(
    spec: InputSpec, specs: Sequence[InputSpec], symbols: dict[str, int], limit: int | None
) -> tuple[int, ...]:
    """An input's shape from its declaration: fixed dims as declared, symbols as given or defaulted (recorded in
    `symbols`, so that every input sharing one agrees), dim expressions evaluated."""
    if spec.shape is None:
        raise InputError(f"input {spec.name!r} has no declared shape; give it with --shape {spec.name}:D0,D1,...")
    dims_out = []
    for position, dim in enumerate(spec.shape):
        if isinstance(dim, int):
            dims_out.append(dim)
            continue
        if dim is not None:
            expr_value = _eval_dim_expression(dim, {**_defaults_for(specs, limit), **symbols})
            if expr_value is not None:
                dims_out.append(expr_value)
                continue
            dims_out.append(symbols.setdefault(dim, _default_dim(dim, position, limit)))
        else:
            dims_out.append(_default_dim(None, position, limit))
    return tuple(dims_out)


def guessed_dims(
    model: onnx.ModelProto, shapes: Mapping[str, object] | None = None, values: Mapping[str, object] | None = None
) -> dict[str, int]:
    """The dims of generated inputs that took a default because `shapes` (or a list in `values`) did not give them:
    {symbolic dim, or `input[axis]` for an unnamed one: value}."""
    specs = input_specs(model)
    given = _overrides(specs, shapes, input_values.normalize_values(values) or {})
    concrete = resolve_shapes(specs, given, limit=position_limit(model))
    named = set(given)
    for spec in specs:
        if spec.name in given:
            named.update(d for d in spec.shape or () if isinstance(d, str))
    guessed: dict[str, int] = {}
    for spec in specs:
        if spec.name in given:
            continue
        for axis, dim in enumerate(spec.shape or ()):
            if dim is None:
                guessed[f"{spec.name}[{axis}]"] = concrete[spec.name][axis]
            elif isinstance(dim, str) and dim.isidentifier() and dim not in named:
                guessed[dim] = concrete[spec.name][axis]
    return guessed


def _dims_hint(model: onnx.ModelProto, shapes: Mapping[str, object] | None, values: Mapping[str, object] | None) -> str:
    guessed = guessed_dims(model, shapes, values)
    if not guessed:
        return ""
    dims = ", ".join(f"{name}={value}" for name, value in guessed.items())
    return f"guessed dims: {dims}; give the model's real sizes with --shape NAME:VALUE"


def run_hint(
    model: onnx.ModelProto,
    sample: Mapping[str, np.ndarray],
    *,
    shapes: Mapping[str, object] | None = None,
    values: Mapping[str, object] | None = None,
) -> str:
    """A hint for a run that failed on generated inputs (`sample`): the inputs whose values were chosen for the
    user, from the graph or at random, with `--input` to set them, and the dims that were guessed, with `--shape`."""
    try:
        parts = [_values_hint(model, sample, values), _dims_hint(model, shapes, values)]
    except InputError:
        return ""
    text = "; ".join(part for part in parts if part)
    return f" ({text})" if text else ""


def _values_hint(model: onnx.ModelProto, sample: Mapping[str, np.ndarray], values: Mapping[str, object] | None) -> str:
    chosen: dict[str, str] = {}
    for name, kind, value, why in _chosen(model, sample, input_values.normalize_values(values) or {}):
        if kind == "graph":
            chosen[name] = f"{name}={input_values.format_scalar(value)} ({why})"
        elif kind in ("int", "bool") and sample[name].size == 1:
            chosen[name] = f"{name}={input_values.format_scalar(value)} was drawn at random"
        elif kind == "int":
            chosen[name] = f"{name} took random values in [0, {_FALLBACK_INT_HIGH})"
    if not chosen:
        return ""
    only = next(iter(chosen)) if len(chosen) == 1 else "NAME"
    how = f"set {'it' if len(chosen) == 1 else 'them'} with --input {only}=VALUE"
    return f"generated inputs: {', '.join(chosen.values())}; {how}"


def input_notes(
    model: onnx.ModelProto,
    sample: Mapping[str, np.ndarray],
    *,
    values: Mapping[str, object] | None = None,
    generated: bool = True,
) -> dict[str, dict[str, Any]]:
    """What a report says of the inputs whose values choose the model's path, {name: {"value", "why"}}: those
    given (`values`, why "given"), and of generated ones, the one-element inputs whose value came from the graph
    (`input_values.graph_rules`) or was drawn at random (an integer or bool that no comparison or lookup
    reaches)."""
    given = input_values.normalize_values(values) or {}
    notes: dict[str, dict[str, Any]] = {}
    for name, value in given.items():
        notes[name] = {"value": list(value) if isinstance(value, tuple) else value, "why": "given"}
    if generated:
        for name, kind, value, why in _chosen(model, sample, given):
            if kind == "graph" or (kind in ("int", "bool") and sample[name].size == 1):
                notes[name] = {"value": value, "why": why}
    return notes


def notes_line(notes: Mapping[str, Mapping[str, Any]]) -> str:
    """`inputs: sr=16000 (compared with 8000, 16000 in the graph)`: the notes of `input_notes` in one line."""
    items = []
    for name, note in notes.items():
        value = note["value"]
        text = input_values.format_value(tuple(value) if isinstance(value, list) else value)
        items.append(f"{name}={text} ({note['why']})")
    return "inputs: " + "; ".join(items) if items else ""


def _chosen(
    model: onnx.ModelProto, sample: Mapping[str, np.ndarray], given: Mapping[str, object]
) -> list[tuple[str, str, Any, str]]:
    """(name, kind, value, why) of every generated input of `sample` that is not given, by the rule that made it
    (`_plan`); value is the first element."""
    specs = [spec for spec in input_specs(model) if spec.name in sample and spec.name not in given]
    plans = _plans(model, specs, {spec.name: tuple(sample[spec.name].shape) for spec in specs})
    chosen = []
    for spec in specs:
        kind, _, rule = plans[spec.name]
        array = np.asarray(sample[spec.name])
        value = array.reshape(-1)[0].item() if array.size else None
        why = rule.why if kind == "graph" and rule is not None else "drawn at random"
        chosen.append((spec.name, kind, value, why))
    return chosen


def _defaults_for(specs: Sequence[InputSpec], limit: int | None) -> dict[str, int]:
    symbols: dict[str, int] = {}
    for spec in specs:
        for position, dim in enumerate(spec.shape or ()):
            if isinstance(dim, str):
                for name in _IDENTIFIER.findall(dim):
                    symbols.setdefault(name, _default_dim(name, position, limit))
    return symbols


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Shapes known without running: initializers and Constant nodes (of every subgraph too), and fully static
    value infos and outputs."""
    shapes: dict[str, tuple[int, ...]] = {}
    for graph in input_values.subgraphs(model.graph):
        shapes.update({init.name: tuple(init.dims) for init in graph.initializer})
        for node in graph.node:
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                        shapes[node.output[0]] = tuple(attr.t.dims)
    for value in list(model.graph.value_info) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes.setdefault(value.name, tuple(d.dim_value for d in dims))
    return shapes


def gather_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """For integer inputs that index a table through Gather (in the graph or a subgraph): the size of the indexed
    axis (exclusive bound)."""
    consumers = input_values.GraphIndex.of(model).consumers
    static = _static_shapes(model)
    bounds: dict[str, int] = {}
    for spec in input_specs(model):
        if not np.issubdtype(spec.dtype, np.integer):
            continue
        found: list[int] = []
        frontier, seen = [spec.name], {spec.name}
        while frontier:
            value = frontier.pop()
            for node, index in consumers.get(value, ()):
                if node.op_type in _GATHER_OPS and index == 1:
                    data_shape = static.get(node.input[0])
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    if data_shape:
                        found.append(int(data_shape[axis % len(data_shape)]))
                elif node.op_type in input_values.PASS_THROUGH and index == 0:
                    for out in node.output:
                        if out and out not in seen:
                            seen.add(out)
                            frontier.append(out)
        if found:
            bounds[spec.name] = min(found)
    return bounds


_Plan = tuple[str, int | None, input_values.ValueRule | None]


def _plans(
    model: onnx.ModelProto, specs: Sequence[InputSpec], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, _Plan]:
    """How each input's values are made (the module docstring's rules, in order): (kind, table size, graph rule),
    kind one of mask, position, table, graph, bool, int (random, nothing tells its range) or normal."""
    bounds, rules = gather_bounds(model), input_values.graph_rules(model, specs)
    plans: dict[str, _Plan] = {}
    for spec in specs:
        dtype, shape = spec.dtype, shapes[spec.name]
        integer = np.issubdtype(dtype, np.integer)
        bound, rule = bounds.get(spec.name), rules.get(spec.name)
        if not (integer or dtype == np.bool_ or is_float(dtype)):
            raise InputError(f"input {spec.name!r} has element type {spec.describe()}, which cannot be generated")
        if _MASK_NAMES.search(spec.name):
            kind = "mask"
        elif integer and _POSITION_NAMES.search(spec.name) and len(shape) >= 1:
            kind = "position"
        elif integer and bound is not None:
            kind = "table"
        elif rule is not None and math.prod(shape) == 1:
            kind = "graph"
        else:
            kind = "bool" if dtype == np.bool_ else "int" if integer else "normal"
        plans[spec.name] = (kind, bound, rule)
    return plans


def _generate_one(spec: InputSpec, shape: tuple[int, ...], plan: _Plan, rng: np.random.Generator) -> np.ndarray:
    dtype = spec.dtype
    kind, bound, rule = plan
    if kind == "mask":
        return _mask(shape, rng).astype(dtype)
    if kind == "position":
        positions = np.broadcast_to(np.arange(shape[-1]), shape)
        if bound:
            positions = positions % bound
        return np.ascontiguousarray(positions).astype(dtype)
    if kind == "table":
        return rng.integers(0, max(bound or 0, 1), size=shape).astype(dtype)
    if kind == "graph" and rule is not None:
        return np.full(shape, rule.value).astype(dtype)
    if kind == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if kind == "int":
        return rng.integers(0, _FALLBACK_INT_HIGH, size=shape).astype(dtype)
    return rng.standard_normal(size=shape, dtype=np.float32).astype(dtype)


def _mask(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Ones, with a random padded tail (zeros) on each row after the first; a row keeps at least one 1."""
    mask = np.ones(shape, dtype=np.int64)
    if len(shape) < 2 or shape[-1] < 2:
        return mask
    rows = mask.reshape(-1, shape[-1])
    for row in rows[1:]:
        valid = int(rng.integers(1, shape[-1] + 1))
        row[valid:] = 0
    return mask


def memory_limit() -> int:
    """Bytes one sample's inputs may take: half of this machine's memory (16 GiB where that is unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def _check_size(specs: Sequence[InputSpec], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """InputError when the generated inputs would not fit in memory (a typo such as --shape sequence:1280000)."""
    sizes = {spec.name: math.prod(shapes[spec.name]) * spec.dtype.itemsize for spec in specs}
    total, limit = sum(sizes.values()), memory_limit()
    if total > limit:
        largest = max(sizes, key=sizes.__getitem__)
        raise InputError(
            f"the inputs would take {total / 2**30:.3g} GiB per sample ({largest!r} is "
            f"{'x'.join(map(str, shapes[largest]))}), more than half of this machine's memory "
            f"({limit / 2**30:.3g} GiB); give smaller dims with --shape"
        )


def _overrides(
    specs: Sequence[InputSpec], shapes: Mapping[str, object] | None, given: Mapping[str, input_values.Value]
) -> dict[str, tuple[int, ...]]:
    """The shapes asked for: `shapes`, and those the given values fix (a list's length, a scalar input's ());
    InputError for a value that names no input, does not fit its input, or contradicts `shapes`."""
    overrides = dict(normalize_shapes(shapes) or {})
    by_name = {spec.name: spec for spec in specs}
    for name, value in given.items():
        shape = input_values.value_shape(_given_spec(by_name, name, value), value)
        if shape is None or (name in overrides and not isinstance(value, tuple)):
            continue  # one value fills the input, in the shape asked for or generated
        if overrides.get(name, shape) != shape:
            raise InputError(
                f"--input {name}={input_values.format_value(value)} gives shape {list(shape)}, "
                f"--shape {name} gives {list(overrides[name])}"
            )
        overrides[name] = shape
    return overrides


def _given_spec(by_name: Mapping[str, InputSpec], name: str, value: input_values.Value) -> InputSpec:
    if name not in by_name:
        known = ", ".join(spec.describe() for spec in by_name.values()) or "none"
        given = f"--input {name}={input_values.format_value(value)}"
        raise InputError(f"{given}: {name!r} is not an input of the model (inputs: {known})")
    return by_name[name]


def generate(
    model: onnx.ModelProto,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    samples: int = 1,
    seed: int = 0,
    values: Mapping[str, object] | None = None,
) -> list[Sample]:
    """`samples` seeded input sets for `model` (the module docstring's rules); `values` sets inputs outright,
    the same in every sample."""
    if samples < 1:
        raise InputError(f"samples must be at least 1, got {samples}")
    specs = input_specs(model)
    given = input_values.normalize_values(values) or {}
    concrete = resolve_shapes(specs, _overrides(specs, shapes, given), limit=position_limit(model))
    _check_size(specs, concrete)
    by_name = {spec.name: spec for spec in specs}
    fixed = {name: input_values.value_array(by_name[name], value, concrete[name]) for name, value in given.items()}
    made = [spec for spec in specs if spec.name not in fixed]
    plans = _plans(model, made, concrete)
    for spec in made:
        if plans[spec.name][0] == "int":
            logger.warning(
                "integer input %r feeds no Gather or comparison with a constant; using random values in [0, %d) "
                "(set it with --input %s=VALUE)",
                spec.name,
                _FALLBACK_INT_HIGH,
                spec.name,
            )
    rng = np.random.default_rng(seed)
    return [
        {
            spec.name: fixed[spec.name].copy()
            if spec.name in fixed
            else _generate_one(spec, concrete[spec.name], plans[spec.name], rng)
            for spec in specs
        }
        for _ in range(samples)
    ]


def _read_files(specs: Sequence[InputSpec], files: Sequence[str | Path]) -> list[Sample]:
    """The samples in `files`, unchecked (`load`)."""
    names = [spec.name for spec in specs]
    samples: list[Sample] = []
    npy_sample: Sample = {}
    for item in files:
        text = str(item)
        name, sep, path_text = text.partition(":") if not Path(text).exists() else ("", "", text)
        path = Path(path_text if sep else text)
        if not path.is_file():
            raise InputError(f"input file not found: {path}")
        try:
            data = np.load(path, allow_pickle=False)
        except Exception as err:  # numpy raises ValueError/OSError/zipfile errors for unreadable files
            raise InputError(f"cannot read input file {path}: {err}") from err
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                samples.append({key: data[key] for key in data.files})
            continue
        if not sep:
            if len(names) != 1:
                raise InputError(
                    f"{path}: a .npy file holds one array; name its input as NAME:{path} (inputs: {', '.join(names)})"
                )
            name = names[0]
        npy_sample[name] = data
    if npy_sample:
        samples.append(npy_sample)
    return samples


def load(
    model: onnx.ModelProto, files: Sequence[str | Path], values: Mapping[str, object] | None = None
) -> list[Sample]:
    """Samples from files: each `.npz` is one sample (keys are input names); `.npy` files given as `NAME:FILE.npy`
    (or a bare `FILE.npy` for a single-input model) together make one sample. `values` replace their inputs in
    every sample (a list as it is, one value filling the array loaded). Validated against the model."""
    specs = input_specs(model)
    samples = _read_files(specs, files)
    for index, sample in enumerate(samples):
        set_values(specs, sample, values, where=f"sample {index}")
        validate(specs, sample, where=f"sample {index}")
    return samples


def set_values(
    specs: Sequence[InputSpec], sample: Sample, values: Mapping[str, object] | None, *, where: str = "inputs"
) -> None:
    """Sets the inputs `values` names in a sample read or given (in place): a list as it is, one value filling
    the input's array (a scalar input: a scalar)."""
    by_name = {spec.name: spec for spec in specs}
    for name, value in (input_values.normalize_values(values) or {}).items():
        spec = _given_spec(by_name, name, value)
        shape = input_values.value_shape(spec, value)
        if shape is None:
            if name not in sample:
                raise InputError(
                    f"{where}: --input {name}={input_values.format_value(value)} fills {name!r} "
                    f"({spec.describe()}), which the sample does not hold: no shape to fill"
                )
            shape = tuple(np.shape(sample[name]))
        sample[name] = input_values.value_array(spec, value, shape)


def check_given(
    model: onnx.ModelProto, samples: Iterable[Mapping[str, np.ndarray]], values: Mapping[str, object] | None = None
) -> list[Sample]:
    """Samples a caller gave, as copies with `values` set (`set_values`), validated against the model."""
    specs = input_specs(model)
    checked = []
    for index, given in enumerate(samples):
        sample = dict(given)
        set_values(specs, sample, values, where=f"sample {index}")
        validate(specs, sample, where=f"sample {index}")
        checked.append(sample)
    return checked


def validate(specs: Sequence[InputSpec], sample: Mapping[str, np.ndarray], *, where: str = "inputs") -> None:
    """Raises InputError naming the first input whose name, dtype or shape does not fit the model."""
    by_name = {spec.name: spec for spec in specs}
    unknown = sorted(set(sample) - set(by_name))
    if unknown:
        raise InputError(
            f"{where}: {', '.join(map(repr, unknown))} not an input of the model (inputs: "
            f"{', '.join(spec.describe() for spec in specs)})"
        )
    missing = [name for name in by_name if name not in sample]
    if missing:
        raise InputError(f"{where}: missing input(s) {', '.join(map(repr, missing))}")
    symbols: dict[str, tuple[int, str]] = {}
    for name, array in sample.items():
        spec = by_name[name]
        if array.dtype != spec.dtype:
            raise InputError(f"{where}: input {name!r} has dtype {array.dtype}, the model expects {spec.describe()}")
        if spec.shape is None:
            continue
        if array.ndim != len(spec.shape):
            raise InputError(
                f"{where}: input {name!r} has shape {list(array.shape)} (rank {array.ndim}), "
                f"the model expects {spec.describe()}"
            )
        for axis, (size, declared) in enumerate(zip(array.shape, spec.shape, strict=True)):
            if isinstance(declared, int) and declared != size:
                raise InputError(
                    f"{where}: input {name!r} has shape {list(array.shape)}, dim {axis} must be {declared} "
                    f"({spec.describe()})"
                )
            if isinstance(declared, str) and declared.isidentifier():
                seen = symbols.setdefault(declared, (size, name))
                if seen[0] != size:
                    raise InputError(
                        f"{where}: dim {declared!r} is {size} in input {name!r} but {seen[0]} in input {seen[1]!r}"
                    )


def prepare(
    model: onnx.ModelProto,
    *,
    files: Sequence[str | Path] = (),
    shapes: Mapping[str, Sequence[int]] | None = None,
    samples: int = 1,
    seed: int = 0,
    values: Mapping[str, object] | None = None,
) -> list[Sample]:
    """Inputs for a run: the samples in `files` when given, else `samples` generated ones; `values` set their
    inputs in every sample."""
    if files:
        if shapes:
            logger.warning("--shape is ignored when inputs come from files")
        return load(model, files, values)
    return generate(model, shapes=shapes, samples=samples, seed=seed, values=values)
