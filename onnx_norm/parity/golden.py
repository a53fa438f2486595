"""The float64 golden model: an upcast copy of the original, run by ONNX Runtime (with float32 islands for the few
ops that lack a double kernel) or by onnx's ReferenceEvaluator."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnx_norm.dtypes import FLOAT_TYPES, is_onnx_domain
from onnx_norm.inputs import is_float
from onnx_norm.parity.tolerances import GoldenMethod
from onnx_norm.rewrite import expansions, families  # noqa: F401  (families register their expansions)
from onnx_norm.sessions import RuntimeConfig, SessionError, create_session, run_model

logger = logging.getLogger(__name__)


#: Float initializers from this size on (and every external one) stay in their type in the float64 copy, each
#: cast to float64 by a node of its own just before its first use: ORT then holds one of them in float64 at a time
#: instead of a float64 copy of all the weights (two to four times their size).
CAST_AT_USE_BYTES = 1 << 20
#: The forms of the golden evaluation, as the report names them.
FORM_WHOLE = "whole model in float64"
FORM_CAST_AT_USE = "whole model in float64, large weights kept in their type and cast to float64 where used"


def upcast_to_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` in which every float16/bfloat16/float32 tensor, cast and constant is float64 (large and
    external initializers through a Cast where they are used: `CAST_AT_USE_BYTES`). External tensors are not read."""
    upcast = onnx.ModelProto()
    upcast.CopyFrom(model)
    _upcast_graph(upcast.graph)
    for function in upcast.functions:
        for node in function.node:
            _upcast_node(node)
    return upcast


def _is_large(tensor: onnx.TensorProto) -> bool:
    if tensor.data_type not in FLOAT_TYPES:
        return False
    return tensor.data_location == TensorProto.EXTERNAL or len(tensor.raw_data) >= CAST_AT_USE_BYTES


def _names_used(node: onnx.NodeProto) -> set[str]:
    """The values a node reads, its subgraphs' reads of outer values included."""
    used = set(node.input)
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in graph.node:
                used |= _names_used(inner)
    return used


def _cast_at_use(graph: onnx.GraphProto) -> None:
    """Renames each large float initializer of `graph` (not one that is also a graph input) and inserts a Cast of it
    to float64, under its old name, right before the first node that reads it."""
    inputs = {value.name for value in graph.input}
    large = {tensor.name: tensor for tensor in graph.initializer if _is_large(tensor) and tensor.name not in inputs}
    if not large:
        return
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for name in sorted(_names_used(node) & large.keys()):
            stored = f"{name}__onnx_norm_stored"
            large.pop(name).name = stored
            nodes.append(
                onnx.helper.make_node("Cast", [stored], [name], name=f"{stored}_to_double", to=TensorProto.DOUBLE)
            )
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def _upcast_value_infos(values: Iterable[onnx.ValueInfoProto]) -> None:
    for value in values:
        tensor_type = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor_type.elem_type in FLOAT_TYPES:
            tensor_type.elem_type = TensorProto.DOUBLE


def _upcast_tensor(tensor: onnx.TensorProto) -> None:
    if tensor.data_type not in FLOAT_TYPES or tensor.name.endswith("__onnx_norm_stored"):
        return
    array = numpy_helper.to_array(tensor).astype(np.float64)
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


def _upcast_graph(graph: onnx.GraphProto) -> None:
    _cast_at_use(graph)  # in subgraphs too: an If or Loop body may hold external weights
    _upcast_value_infos(graph.input)
    _upcast_value_infos(graph.output)
    del graph.value_info[:]  # stale element types would contradict the upcast graph
    for tensor in graph.initializer:
        _upcast_tensor(tensor)
    for node in graph.node:
        _upcast_node(node)


def _upcast_node(node: onnx.NodeProto) -> None:
    for attr in list(node.attribute):
        if attr.type == onnx.AttributeProto.TENSOR:
            _upcast_tensor(attr.t)
        elif attr.type == onnx.AttributeProto.GRAPH:
            _upcast_graph(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for sub in attr.graphs:
                _upcast_graph(sub)
        elif (
            attr.type == onnx.AttributeProto.INT
            and attr.i in FLOAT_TYPES
            and (
                (node.op_type in ("Cast",) and attr.name == "to")
                or attr.name == "dtype"
                or (node.op_type == "LayerNormalization" and attr.name == "stash_type")
            )
        ):
            attr.i = TensorProto.DOUBLE
    if node.op_type == "Constant":
        for attr in list(node.attribute):
            if attr.name in ("value_float", "value_floats"):
                values = np.array(attr.f if attr.name == "value_float" else list(attr.floats), dtype=np.float64)
                node.attribute.remove(attr)
                node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(values)))


_MISSING_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\)")
_MAX_FLOAT32_FALLBACKS = 8


def _golden_session(upcast: onnx.ModelProto, threads: int | None) -> Any:
    """ORT session for the float64 copy. ORT lacks double kernels for a few ops: the norms among them are written
    out in float64 ops (rewrite/expansions.py), the others (Conv, Erf) run in float32 between Casts, which keeps
    the golden result far more precise than any fp16 graph."""
    model = upcast
    for _ in range(_MAX_FLOAT32_FALLBACKS):
        try:
            return create_session(
                # Priority order and no arena: each large weight's float64 copy exists from its Cast to its last use.
                model,
                RuntimeConfig("cpu", threads, "disabled", priority_order=True, cpu_arena=False),
                custom_ops=False,
            )
        except SessionError as err:
            missing = _MISSING_KERNEL.search(str(err))
            if missing is None:
                raise
            if missing.group(1) in expansions.EXPANSIONS:
                logger.info("no float64 kernel for %s in ONNX Runtime; written out in float64 ops", missing.group(1))
                model = expansions.expand(model, missing.group(1), _onnx_opset(model) or 0)
                continue
            slots = _narrowable(model, missing.group(1))
            if not slots:
                raise
            logger.info("no float64 kernel for %s in ONNX Runtime; evaluating it in float32", ", ".join(slots))
            model = _run_in_float32(model, slots)
    raise SessionError("too many ops without a float64 kernel")


Slots = tuple[list[bool], list[bool]]  # per formal input, per formal output: a float tensor


def _onnx_opset(model: onnx.ModelProto) -> int | None:
    return next((entry.version for entry in model.opset_import if is_onnx_domain(entry.domain)), None)


def _narrowable(model: onnx.ModelProto, op_type: str) -> dict[str, Slots]:
    """The op types to run in float32 when ORT has no float64 kernel for `op_type`: `op_type` itself, or, when no
    node of the model is one, the ops ORT expands into their ONNX function bodies (Gelu-20 into Erf and others);
    empty when one of them may read or write an integer, which a Cast to float32 could change. By op type, the
    inputs and outputs a Cast narrows and widens."""
    bodies = [model.graph.node, *(function.node for function in model.functions)]
    nodes = [node for body in bodies for node in body if is_onnx_domain(node.domain)]
    if any(node.op_type == op_type for node in nodes):
        candidates = [op_type]
    else:
        opset = _onnx_opset(model)
        candidates = sorted({node.op_type for node in nodes if op_type in _function_body_ops(node, opset)})
    slots: dict[str, Slots] = {}
    for candidate in candidates:
        found = _float_slots(model, candidate)
        if found is None:
            return {}
        slots[candidate] = found
    return slots


def _function_body_ops(node: onnx.NodeProto, opset: int | None) -> set[str]:
    """The op types of the ONNX function body `node`'s op expands into (for its attributes), empty for a primitive."""
    if not onnx.defs.has(node.op_type):
        return set()
    schema = onnx.defs.get_schema(node.op_type, opset) if opset else onnx.defs.get_schema(node.op_type)
    if schema.has_function:
        return {inner.op_type for inner in schema.function_body.node}
    if not schema.has_context_dependent_function:
        return set()
    double = onnx.helper.make_tensor_type_proto(TensorProto.DOUBLE, None).SerializeToString()
    try:
        body = onnx.FunctionProto.FromString(
            schema.get_context_dependent_function(node.SerializeToString(), [double] * len(node.input))
        )
    except Exception:  # a body onnx cannot build for these types: not the op to narrow
        return set()
    return {inner.op_type for inner in body.node}


_FLOAT_TENSORS = frozenset({"tensor(float16)", "tensor(float)", "tensor(double)", "tensor(bfloat16)"})


def _float_slots(model: onnx.ModelProto, op_type: str) -> Slots | None:
    """Which inputs and outputs of the default-domain op `op_type` are float tensors by its schema (a formal whose
    type constraint admits float types only: Conv's X, W, B), or None when one may hold another type too (Reshape's
    data, Cast's input), which only the graph's types could tell."""
    opset = _onnx_opset(model)
    try:
        schema = onnx.defs.get_schema(op_type, opset) if opset else onnx.defs.get_schema(op_type)
    except onnx.defs.SchemaError:
        return None
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def slots(formals: Sequence[Any]) -> list[bool] | None:
        kinds = [allowed.get(f.type_str, {f.type_str}) for f in formals]
        if any(not (kind <= _FLOAT_TENSORS or not kind & _FLOAT_TENSORS) for kind in kinds):
            return None
        return [kind <= _FLOAT_TENSORS for kind in kinds]

    inputs, outputs = slots(schema.inputs), slots(schema.outputs)
    return None if inputs is None or outputs is None else (inputs, outputs)


def _slot(flags: list[bool], index: int) -> bool:
    """A formal's flag; the inputs past the last formal are its variadic tail."""
    return flags[min(index, len(flags) - 1)] if flags else False


def _run_in_float32(model: onnx.ModelProto, slots: Mapping[str, Slots]) -> onnx.ModelProto:
    """The nodes of the op types in `slots`, in the main graph and in the model's functions (ORT inlines them), run
    in float32 between Casts: their float inputs narrowed, their float outputs widened back."""
    patched = onnx.ModelProto()
    patched.CopyFrom(model)
    bodies = [("", patched.graph.node)] + [(f"{i}_", f.node) for i, f in enumerate(patched.functions)]
    for tag, body in bodies:
        nodes = _narrowed(list(body), slots, tag)
        del body[:]
        body.extend(nodes)
    return patched


def _narrowed(body: list[onnx.NodeProto], slots: Mapping[str, Slots], tag: str) -> list[onnx.NodeProto]:
    """`body` with each default-domain node of an op type in `slots` between Casts to float32 and back. The new
    names hold the op type, so that a later round (another op type, the nodes at other positions) makes other ones."""
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(body):
        if node.op_type not in slots or not is_onnx_domain(node.domain):
            nodes.append(node)
            continue
        float_inputs, float_outputs = slots[node.op_type]
        prefix = f"onnx_norm_f32_{node.op_type}_{tag}"
        for i, name in enumerate(node.input):
            if name and _slot(float_inputs, i):
                nodes.append(onnx.helper.make_node("Cast", [name], [f"{prefix}{index}_in{i}"], to=TensorProto.FLOAT))
                node.input[i] = f"{prefix}{index}_in{i}"
        widened = []
        for i, name in enumerate(node.output):
            if name and _slot(float_outputs, i):
                cast = onnx.helper.make_node("Cast", [f"{prefix}{index}_out{i}"], [name], to=TensorProto.DOUBLE)
                widened.append(cast)
                node.output[i] = f"{prefix}{index}_out{i}"
        nodes.append(node)
        nodes.extend(widened)
    return nodes


def runtime_only_ops(model: onnx.ModelProto) -> list[str]:
    """The op types of the main graph that neither onnx defines nor the model defines as a function (ONNX Runtime's
    contrib ops, in its domains or in the default one): onnx.reference cannot evaluate them."""
    functions = {(function.domain, function.name) for function in model.functions}
    unknown = set()
    for node in model.graph.node:
        domain = "" if is_onnx_domain(node.domain) else node.domain
        if (node.domain, node.op_type) in functions or onnx.defs.has(node.op_type, domain):
            continue
        unknown.add(node.op_type if not domain else f"{domain}::{node.op_type}")
    return sorted(unknown)


class GoldenEvaluator:
    """Evaluates the original model in float64: ORT on the upcast copy, else onnx's ReferenceEvaluator."""

    def __init__(self, model: onnx.ModelProto, method: GoldenMethod, threads: int | None) -> None:
        self.method = "none"
        self.form = ""  # which form ran (FORM_*), for the report
        self._session = None
        self._reference = None
        if method == "none":
            return
        upcast = upcast_to_double(model)
        cast_at_use = any(node.name.endswith("__onnx_norm_stored_to_double") for node in upcast.graph.node)
        if method in ("auto", "ort"):
            try:
                self._session = _golden_session(upcast, threads)
                self.method, self.form = "ort", FORM_CAST_AT_USE if cast_at_use else FORM_WHOLE
                return
            except SessionError as err:
                if method == "ort":
                    raise
                logger.info("float64 copy does not run in ONNX Runtime (%s); using onnx.reference", err)
        if any(tensor.data_location == TensorProto.EXTERNAL for tensor in upcast.graph.initializer):
            # onnx.reference would read every weight into memory, in float64.
            if method == "reference":
                raise SessionError("onnx.reference cannot evaluate a model with external data in bounded memory")
            logger.warning("no float64 golden reference: ONNX Runtime cannot run the float64 copy")
            return
        from onnx.reference import ReferenceEvaluator

        unknown = runtime_only_ops(upcast)
        if unknown and method == "auto":
            # Expected, not a broken install: ONNX Runtime's own ops (the GenAI builder's GroupQueryAttention and
            # SimplifiedLayerNormalization, ORT's fusions) have no float64 kernel and no ONNX definition.
            logger.info(
                "no float64 golden reference: the model uses ONNX Runtime's own ops (%s), which have neither a "
                "float64 kernel nor an ONNX definition to evaluate; the models are compared with each other",
                ", ".join(unknown),
            )
            return
        try:
            self._reference = ReferenceEvaluator(upcast)
            self.method, self.form = "reference", f"{FORM_WHOLE} (onnx.reference)"
        except Exception as err:  # the reference evaluator raises for ops it does not implement
            if method == "reference":
                raise SessionError(f"onnx.reference cannot evaluate the model: {err}") from err
            logger.warning("no float64 golden reference for this model: %s", err)

    def run(self, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray] | None:
        upcast_feeds = {
            name: (value.astype(np.float64) if is_float(value.dtype) else value) for name, value in feeds.items()
        }
        if self._session is not None:
            try:
                return run_model(self._session, upcast_feeds, list(names), label="the float64 copy")
            except SessionError as err:
                # The golden result is a second opinion: without it the models are compared with each other only.
                logger.warning("%s", err)
                self._session = None
                self.method = "none"
                return None
        if self._reference is not None:
            try:
                values = self._reference.run(list(names), upcast_feeds)
            except Exception as err:
                logger.warning("onnx.reference failed on the float64 copy: %s", err)
                self._reference = None
                self.method = "none"
                return None
            return dict(zip(names, values, strict=True))
        return None
