"""Values of inputs that choose a model's path: read from what the graph does with them, or given by the user.

A one-element input (a scalar, or a `[1]`) that a graph compares with constants or branches on selects the path the
whole model takes, and a random value takes a path the model is never run on (Silero VAD compares its sample rate
`sr` with 8000 and 16000; a random integer in [0, 16) matches neither). `graph_rules` finds, for every such input,
the values the graph can use, following it through value-preserving ops (Cast, Reshape, Squeeze, Unsqueeze,
Identity, ...) and into If/Loop/Scan subgraphs, whose nodes name outer-scope values:

- compared (Equal, Greater, Less, GreaterOrEqual, LessOrEqual) with constants (initializers or Constant nodes,
  possibly cast or reshaped): the largest of the constants it is tested for equality with, else the largest it is
  ordered against. Equality constants are the cases the graph was written for (Silero VAD's 8000 and 16000), and
  the largest is the model's usual one (16000: a model's own rate or size is its largest special case); a
  constant that does not fit the input's dtype is skipped;
- the condition of an If or a Where (directly or cast): true, the then-branch.

An input of more elements than one keeps the rules of `onnx_norm.inputs` (an elementwise comparison computes both
outcomes, so random values already reach both).

`--input NAME=VALUE` / `InputOptions.values` set an input outright: `parse_values` reads the command line's items,
`normalize_values` checks the API's mapping, `value_array` makes the array (dtype from the model's declaration).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from onnx_norm.errors import InputError
from onnx_norm.input_spec import InputSpec
from onnx_norm.ops.reference import np_dtype

Scalar = int | float | bool
#: A user's value for one input: one value (a scalar input, or every element of a larger one) or a 1-D list.
Value = Scalar | tuple[Scalar, ...]

_COMPARISONS = frozenset({"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"})
_CONDITIONS = frozenset({"If", "Where"})
# Ops that carry a value on unchanged in meaning (their input 0); Cast may change the dtype, not what it selects.
PASS_THROUGH = frozenset(
    {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Transpose", "Slice", "Tile"}
)
#: Constants larger than this are tables or weights, not values an input is compared with.
_MAX_CONSTANT = 64
#: How many compared constants a report line names before it elides the rest.
_SHOWN = 6


def subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph of its nodes (If branches, Loop and Scan bodies), recursively."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from subgraphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from subgraphs(sub)


@dataclasses.dataclass
class GraphIndex:
    """Who consumes and who produces every value, in the graph and all its subgraphs, and the small constants."""

    consumers: dict[str, list[tuple[onnx.NodeProto, int]]]
    producers: dict[str, onnx.NodeProto]
    constants: dict[str, onnx.TensorProto]

    @classmethod
    def of(cls, model: onnx.ModelProto) -> GraphIndex:
        index = cls({}, {}, {})
        for graph in subgraphs(model.graph):
            for init in graph.initializer:
                index.constants.setdefault(init.name, init)
            for node in graph.node:
                for position, name in enumerate(node.input):
                    if name:
                        index.consumers.setdefault(name, []).append((node, position))
                for name in node.output:
                    if name:
                        index.producers.setdefault(name, node)
        return index

    def constant(self, name: str, depth: int = 0) -> np.ndarray | None:
        """The values of `name` if it is a small constant: an initializer, a Constant node, or one of them through
        value-preserving ops (a Cast converts); None otherwise. External tensors are never read."""
        if name in self.constants:
            return _small_array(self.constants[name])
        node = self.producers.get(name)
        if node is None or depth > 8:
            return None
        if node.op_type == "Constant":
            return _constant_node_value(node)
        if node.op_type in PASS_THROUGH and node.input:
            values = self.constant(node.input[0], depth + 1)
            if values is not None and node.op_type == "Cast":
                to = next((a.i for a in node.attribute if a.name == "to"), 0)
                try:
                    return values.astype(np_dtype(to))
                except (KeyError, ValueError, TypeError):
                    return None
            return values
        return None


def _small_array(tensor: onnx.TensorProto) -> np.ndarray | None:
    if tensor.data_location == onnx.TensorProto.EXTERNAL or math.prod(tensor.dims) > _MAX_CONSTANT:
        return None
    try:
        return np.asarray(numpy_helper.to_array(tensor))
    except Exception:  # a type numpy cannot hold (strings, sparse): not a value to compare with
        return None


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return _small_array(attr.t)
        if attr.name in ("value_int", "value_ints"):
            return np.asarray(onnx.helper.get_attribute_value(attr), np.int64)
        if attr.name in ("value_float", "value_floats"):
            return np.asarray(onnx.helper.get_attribute_value(attr), np.float32)
    return None


@dataclasses.dataclass(frozen=True)
class ValueRule:
    """The value a one-element input takes from what the graph does with it, and why (for the report)."""

    value: Scalar
    why: str


def _uses(name: str, index: GraphIndex) -> tuple[list[np.ndarray], list[np.ndarray], str]:
    """The constants `name` is tested for equality with, those it is ordered against, and the first condition op it
    is (through value-preserving ops)."""
    equal: list[np.ndarray] = []
    ordered: list[np.ndarray] = []
    condition = ""
    frontier, seen = [name], {name}
    while frontier:
        value = frontier.pop()
        for node, position in index.consumers.get(value, ()):
            if node.op_type in _COMPARISONS and len(node.input) == 2:
                other = index.constant(node.input[1 - position])
                if other is not None:
                    (equal if node.op_type == "Equal" else ordered).append(other.ravel())
            elif node.op_type in _CONDITIONS and position == 0:
                condition = condition or node.op_type
            elif node.op_type in PASS_THROUGH and position == 0:
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        frontier.append(out)
    return equal, ordered, condition


def _fitting(arrays: Sequence[np.ndarray], dtype: np.dtype) -> list[Scalar]:
    """The distinct constants that the input's dtype holds exactly, sorted."""
    found: set[Scalar] = set()
    for array in arrays:
        for item in array.tolist():
            if isinstance(item, float) and not math.isfinite(item):
                continue
            try:
                converted = np.asarray(item).astype(dtype)
            except (ValueError, OverflowError, TypeError):
                continue
            if converted == item:
                found.add(converted.item())
    return sorted(found)


def graph_rules(model: onnx.ModelProto, specs: Sequence[InputSpec]) -> dict[str, ValueRule]:
    """{input: its value} for the inputs the graph compares with constants or branches on (module docstring); the
    caller applies them to one-element inputs only."""
    index = GraphIndex.of(model)
    rules: dict[str, ValueRule] = {}
    for spec in specs:
        dtype = spec.dtype
        if not _fits(0, dtype):
            continue  # strings and other types no constant is compared with
        equal, ordered, condition = _uses(spec.name, index)
        candidates = _fitting(equal, dtype) or _fitting(ordered, dtype)
        if candidates:
            named = _fitting(equal + ordered, dtype)
            shown = ", ".join(format_scalar(v) for v in named[:_SHOWN]) + (", ..." if len(named) > _SHOWN else "")
            rules[spec.name] = ValueRule(max(candidates), f"compared with {shown} in the graph")
        elif condition:
            true = np.asarray(True).astype(dtype).item()
            rules[spec.name] = ValueRule(true, f"the condition of a {condition}: its true branch")
    return rules


# ------------------------------------------------------------------------------------------ values the user gives


def format_scalar(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def format_value(value: Value) -> str:
    """A value as `--input` takes it: `16000`, `true`, `1,2,3` (a one-element list as `5,`)."""
    if isinstance(value, tuple):
        text = ",".join(format_scalar(v) for v in value)
        return text + "," if len(value) == 1 else text
    return format_scalar(value)


def _scalar(text: str, item: str) -> Scalar:
    word = text.strip()
    if word.lower() in ("true", "false"):
        return word.lower() == "true"
    try:
        return int(word)
    except ValueError:
        pass
    try:
        return float(word)
    except ValueError:
        raise InputError(f"--input {item!r}: {word!r} is not a number or true/false") from None


def parse_values(items: Iterable[str]) -> dict[str, Value]:
    """Parses `--input NAME=VALUE` items: VALUE one number or true/false, or a comma list for a 1-D input
    (`ids=1,2,3`, `ids=5,` for one element). InputError naming the item that is wrong."""
    values: dict[str, Value] = {}
    for item in items:
        name, sep, text = item.rpartition("=")
        if not sep or not name:
            also = "; data files go to --inputs" if item.endswith((".npz", ".npy")) else ""
            raise InputError(f"--input {item!r}: expected NAME=VALUE (for example sr=16000 or ids=1,2,3){also}")
        if not text.strip():
            raise InputError(f"--input {item!r}: no value given")
        if name in values:
            raise InputError(f"--input {item!r}: {name!r} is set twice")
        parts = text.split(",")
        if "," in text:
            parts = parts[:-1] if parts[-1] == "" else parts
            values[name] = tuple(_scalar(part, item) for part in parts)
        else:
            values[name] = _scalar(text, item)
    return values


def _api_scalar(value: object, name: str) -> Scalar:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int, float)):
        return value
    raise InputError(f"values[{name!r}]: expected a number, a bool or a 1-D sequence of them, got {value!r}")


def normalize_values(values: Mapping[str, object] | None) -> dict[str, Value] | None:
    """`values` (InputOptions.values) as {name: scalar or tuple}: numbers, bools, numpy scalars, or 1-D sequences
    or arrays of them; InputError for anything else."""
    if values is None:
        return None
    if not isinstance(values, Mapping):
        raise InputError(f"values must map an input name to its value, got {type(values).__name__}")
    normalized: dict[str, Value] = {}
    for name, given in values.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"values: input names must be strings, got {name!r}")
        value = given.item() if isinstance(given, np.ndarray) and given.ndim == 0 else given
        if isinstance(value, (np.ndarray, list, tuple)):
            items = list(np.asarray(value, dtype=object).ravel()) if np.ndim(value) == 1 else None
            if not items:
                raise InputError(f"values[{name!r}]: expected one value or a non-empty 1-D sequence, got {value!r}")
            normalized[name] = tuple(_api_scalar(v, name) for v in items)
        else:
            normalized[name] = _api_scalar(value, name)
    return normalized


def value_shape(spec: InputSpec, value: Value) -> tuple[int, ...] | None:
    """The shape a given value fixes: a list's length for a 1-D input, () for a scalar input (or one declared
    without a shape), None where one value fills an input of the shape generated or loaded. InputError when the
    value does not fit the declaration."""
    given = f"--input {spec.name}={format_value(value)}"
    if not isinstance(value, tuple):
        return () if spec.shape is None or len(spec.shape) == 0 else None
    if spec.shape is not None and len(spec.shape) != 1:
        kind = "a scalar; give one value" if not spec.shape else "not 1-D; a comma list sets a 1-D input"
        raise InputError(f"{given}: {spec.name!r} is {kind} ({spec.describe()})")
    declared = spec.shape[0] if spec.shape else None
    if isinstance(declared, int) and declared != len(value):
        raise InputError(f"{given}: {len(value)} value(s) given, the model expects {declared} ({spec.describe()})")
    return (len(value),)


def _fits(item: Scalar, dtype: np.dtype) -> bool:
    if dtype == np.bool_:
        return isinstance(item, bool) or item in (0, 1)
    if isinstance(item, bool) or not isinstance(item, (int, float)):
        return False
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return float(item).is_integer() and info.min <= item <= info.max
    return np.issubdtype(dtype, np.floating) or dtype == np_dtype(onnx.TensorProto.BFLOAT16)


def value_array(spec: InputSpec, value: Value, shape: tuple[int, ...]) -> np.ndarray:
    """The array of a given value, in the input's dtype: a list as it is, one value filling `shape`. InputError
    when a value is not one of the dtype (0.5 for an int64 input, 300 for a uint8 one, 2 for a bool)."""
    dtype = spec.dtype
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if not _fits(item, dtype):
            raise InputError(
                f"--input {spec.name}={format_value(value)}: {format_scalar(item)} is not a {dtype} value "
                f"({spec.describe()})"
            )
    if isinstance(value, tuple):
        return np.asarray([int(v) if np.issubdtype(dtype, np.integer) else v for v in value]).astype(dtype)
    scalar = int(value) if np.issubdtype(dtype, np.integer) else value
    return np.full(shape, scalar).astype(dtype)
