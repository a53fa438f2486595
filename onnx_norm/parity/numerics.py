"""What the original norms do in their own narrow types on the given inputs: the steps that overflow to inf,
underflow to zero or add an epsilon that rounded to zero, beside the fused op's error (verify --per-node).

Each original norm (the subgraph a fused op replaced, found through parity/mapping.py) is evaluated twice by the
rewrite's numpy interpreter from the original's own values of the norm's inputs: in its element types, one op at a
time as a float16/bfloat16 kernel computes it, and in float64. ONNX Runtime's CPU provider would not show these
failures (it runs fp16 ops without fp16 kernels in fp32), its CUDA provider and other fp16 runtimes do: users of
those report them, and the fused op, which accumulates in float32, fixes them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

import numpy as np
import onnx
import onnx_ir as ir

from onnx_norm.dtypes import NARROW_TYPES, type_name

logger = logging.getLogger(__name__)

#: Nodes of one norm walked back from its output at most (a mapping gone wrong must not evaluate the model).
_MAX_NODES = 64


@dataclasses.dataclass
class NarrowNumerics:
    """One original norm in its own types: what went wrong, and both errors against the float64 result."""

    problems: list[str]  # one line per step that overflowed, underflowed or added a zero epsilon
    original_max_error: float | None  # the subgraph in its own types, against float64
    fused_max_error: float | None  # the fused op's output (as run), against the same float64 result
    overflows: int = 0  # elements of the subgraph's steps that overflowed to inf/NaN where float64 is finite

    @property
    def repaired(self) -> bool:
        """The original overflowed in its own types and the fused op's output is finite (its error is)."""
        return self.overflows > 0 and self.fused_max_error is not None and np.isfinite(self.fused_max_error)


def _replaced_nodes(y: ir.Value, stops: set[ir.Value]) -> list[ir.Node] | None:
    """The nodes computing `y` from `stops` and constants, in topological order; None past _MAX_NODES."""
    seen: dict[ir.Node, None] = {}
    stack = [y]
    while stack:
        value = stack.pop()
        node = value.producer()
        if value in stops or node is None or node in seen:
            continue
        seen[node] = None
        if len(seen) > _MAX_NODES:
            return None
        stack.extend(v for v in node.inputs if v is not None)
    order = {node: index for index, node in enumerate(y.graph or [])} if y.graph is not None else {}
    return sorted(seen, key=lambda node: order.get(node, 0))


def _overflows(own: np.ndarray, exact: np.ndarray) -> int:
    """Elements non-finite in the narrow evaluation where the float64 one is finite."""
    return int((~np.isfinite(np.asarray(own).astype(np.float64)) & np.isfinite(np.asarray(exact, np.float64))).sum())


def _problems(node: ir.Node, own: np.ndarray, exact: np.ndarray, dtype: ir.DataType) -> list[str]:
    own64 = np.asarray(own).astype(np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    where = f"{node.op_type} {node.name or node.outputs[0].name!r} ({type_name(dtype)})"
    found = []
    overflow = _overflows(own64, exact)
    if overflow:
        largest = float(np.max(np.abs(exact[np.isfinite(exact)]), initial=0.0))
        found.append(f"{where}: {overflow} element(s) overflow to inf/NaN (float64 max |value| {largest:.3g})")
    tiny = {int(ir.DataType.FLOAT16): 2.0**-14, int(ir.DataType.BFLOAT16): 2.0**-126}.get(int(dtype), 2.0**-126)
    underflow = int(((own64 == 0) & (exact != 0) & (np.abs(exact) < tiny)).sum())
    if underflow:
        found.append(f"{where}: {underflow} element(s) underflow to 0")
    return found


def _float_type(dtype: np.dtype) -> ir.DataType | None:
    try:
        elem = ir.DataType.from_numpy(dtype)
    except TypeError:
        return None
    return elem if elem.is_floating_point() else None


def _zero_epsilon(node: ir.Node) -> str | None:
    """An Add of a narrow constant that is 0 feeding a square root: the epsilon rounded away."""
    if node.op_type != "Add" or not any(c.op_type in ("Sqrt", "Pow", "Reciprocal") for c, _ in node.outputs[0].uses()):
        return None
    for value in node.inputs:
        tensor = None if value is None else value.const_value
        if tensor is not None and value.dtype in NARROW_TYPES and tensor.size <= 1 and not np.any(tensor.numpy()):
            return f"Add {node.name or node.outputs[0].name!r}: epsilon is 0 in {type_name(value.dtype)} (rounded)"
    return None


def narrow_numerics(
    original: onnx.ModelProto,
    norm_values: Mapping[str, tuple[str, list[str]]],
    arrays: Mapping[str, np.ndarray],
    fused_outputs: Mapping[str, np.ndarray],
) -> dict[str, NarrowNumerics]:
    """For each fused norm (its node name -> (the original's Y, the original's X/Skip)), the original subgraph's
    narrow-type problems on `arrays` (the original's values of those inputs, one sample), and its error and the
    fused op's (`fused_outputs`, by node name) against the float64 evaluation of the subgraph."""
    from onnx_norm.rewrite.evaluate import EvaluationError, evaluate

    model = ir.serde.deserialize_model(original)
    values = {v.name: v for node in model.graph for v in node.outputs}
    values |= {v.name: v for v in model.graph.inputs}
    result: dict[str, NarrowNumerics] = {}
    for key, (y_name, input_names) in norm_values.items():
        y = values.get(y_name)
        stops = {values[n]: np.asarray(arrays[n]) for n in input_names if n in values and n in arrays}
        nodes = None if y is None or len(stops) != len(input_names) else _replaced_nodes(y, set(stops))
        if not nodes:
            continue
        outputs = [v for node in nodes for v in node.outputs]
        try:
            own = evaluate(outputs, stops)
            exact = evaluate(outputs, stops, widen=True)
        except (EvaluationError, ValueError, TypeError, IndexError) as err:
            logger.info("cannot evaluate the original of %s in its own types: %s", key, err)
            continue
        problems = [p for node in nodes if (p := _zero_epsilon(node))]
        overflows = 0
        for value, a, b in zip(outputs, own, exact, strict=True):
            node = value.producer()
            dtype = _float_type(np.asarray(a).dtype)  # the values' types: the loaded model may carry none
            if node is not None and dtype is not None:
                problems.extend(_problems(node, a, b, dtype))
                overflows += _overflows(a, b)
        y_exact = exact[outputs.index(y)] if y in outputs else None
        original_error = fused_error = None
        if y_exact is not None:
            with np.errstate(all="ignore"):
                original_error = float(np.max(np.abs(own[outputs.index(y)].astype(np.float64) - y_exact)))
                fused = fused_outputs.get(key)
                if fused is not None and np.shape(fused) == np.shape(y_exact):
                    fused_error = float(np.max(np.abs(np.asarray(fused).astype(np.float64) - y_exact)))
        result[key] = NarrowNumerics(problems, original_error, fused_error, overflows)
    return result


#: The residual-stream RMS `inspect` evaluates fp16/bf16 norms at by default: trained LLMs carry activations of a few
#: hundred to a few thousand in their residual stream (docs/accuracy.md, "fp16 norm repair").
REALISTIC_RMS = 1000.0
_ROWS = 4  # rows drawn per norm (the non-normalized dims are 1 but the first)


def _subgraph_io(nodes: list[ir.Node]) -> tuple[list[ir.Value], ir.Value | None]:
    """The non-constant inputs the nodes read from outside (X, Skip) and their last output read outside (Y)."""
    inside = set(nodes)
    inputs: dict[ir.Value, None] = {}
    for node in nodes:
        for value in node.inputs:
            producer = None if value is None else value.producer()
            constant = value is None or value.const_value is not None or getattr(producer, "op_type", "") == "Constant"
            if not constant and producer not in inside:
                inputs.setdefault(value)
    outside = [
        v
        for node in nodes
        for v in node.outputs
        if v.is_graph_output() or any(user not in inside for user, _ in v.uses())
    ]
    return list(inputs), (outside[-1] if outside else None)


def _draw(value: ir.Value, axes: list[int], rms: float, rng: np.random.Generator) -> np.ndarray | None:
    """X at residual RMS `rms` in X's type: static normalized dims, _ROWS rows; None when a normalized dim is
    symbolic or the type unknown."""
    shape = value.shape
    if shape is None or value.dtype is None:
        return None
    dims = []
    for axis, dim in enumerate(shape):
        if axis in axes:
            if not isinstance(dim, int):
                return None
            dims.append(dim)
        else:
            dims.append(_ROWS if not dims else 1)
    values = np.clip(rng.standard_normal(dims) * rms, -60000, 60000)
    return values.astype(value.dtype.numpy())


def overflows_at(model: onnx.ModelProto, records: list, rms: float = REALISTIC_RMS, seed: int = 0) -> dict[int, str]:
    """{index of a record: what overflowed}: the original fp16/bf16 norms of `records` (the rewrite report's, found
    in the main graph by node name) evaluated op by op in their own types on X (and Skip) drawn at residual RMS
    `rms`, as an fp16-native kernel computes them. A norm that cannot be evaluated is left out (logged)."""
    from onnx_norm.rewrite.evaluate import EvaluationError, evaluate

    graph = ir.serde.deserialize_model(model).graph
    by_name = {node.name: node for node in graph if node.name}
    order = {node: index for index, node in enumerate(graph)}
    main = f"graph {graph.name!r}" if graph.name else "graph"  # how the rewrite report names the main graph
    rng = np.random.default_rng(seed)
    found: dict[int, str] = {}
    for index, record in enumerate(records):
        nodes = [by_name.get(name) for name in record.replaced_nodes]
        if record.dtype not in ("fp16", "bf16") or record.graph != main or None in nodes:
            continue
        nodes = sorted(nodes, key=order.__getitem__)  # type: ignore[arg-type]
        inputs, y = _subgraph_io(nodes)  # type: ignore[arg-type]
        scale = rms / np.sqrt(max(len(inputs), 1))  # X + Skip at the RMS asked for
        arrays = {v: _draw(v, record.axes, scale, rng) for v in inputs}
        if y is None or any(a is None for a in arrays.values()):
            logger.info("norm %s: no static shape to evaluate it at", record.replaced_nodes[0])
            continue
        outputs = [v for node in nodes for v in node.outputs]
        try:
            own = evaluate(outputs, arrays)
            exact = evaluate(outputs, arrays, widen=True)
        except (EvaluationError, ValueError, TypeError, IndexError) as err:
            logger.info("cannot evaluate norm %s in its own types: %s", record.replaced_nodes[0], err)
            continue
        steps = [
            f"{v.producer().op_type} {v.name!r}"
            for v, a, b in zip(outputs, own, exact, strict=True)
            if _overflows(a, b)
        ]
        if steps:
            more = f" (and {len(steps) - 1} later step(s))" if len(steps) > 1 else ""
            found[index] = f"{steps[0]} overflows to inf{more}"
    return found
