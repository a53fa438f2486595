"""The shape steps of FuseNormsPass, as onnx-ir passes (in place): `InferShapesPass` gives the matchers ranks and
static normalised dims (onnx's inference, then ONNX Runtime's symbolic inference where onnx's left reductions or
native norms without shapes, then model-local function bodies), and `RestoreShapesPass` takes what only the
symbolic inference added back out of the model before it is written."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from onnx_norm.dtypes import is_onnx_domain
from onnx_norm.rewrite import constants, loops, native, shape_values
from onnx_norm.rewrite.reductions import REDUCTIONS
from onnx_norm.rewrite.run_state import RunState, Shapes

logger = logging.getLogger(__name__)

#: Fills in shapes onnx's inference left unknown, in place (default: ONNX Runtime's, `infer_symbolic_shapes`).
SymbolicInference = Callable[[ir.Model], None]


class InferShapesPass(ir.passes.InPlacePass):
    """Infers shapes in place for the matchers (`infer_shapes`); the run's `stored_shapes` keep the shapes the model
    recorded before ONNX Runtime's symbolic inference changed them (empty when it did not run), for
    RestoreShapesPass.

    The result says modified=False: shapes are annotations the fusions read, not a change of what the model
    computes (FuseNormsPass reports a model as modified only when it fused or took over a norm)."""

    def __init__(
        self, state: RunState | None = None, *, native_norms: bool = False, symbolic: SymbolicInference | None = None
    ) -> None:
        super().__init__()
        self.state = state if state is not None else RunState.for_target()
        self.native_norms = native_norms
        self.symbolic = symbolic

    @property
    def stored(self) -> Shapes:
        return self.state.stored_shapes

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.state.stored_shapes = infer_shapes(model, self.native_norms, self.symbolic)
        return ir.passes.PassResult(model, modified=False)


class RestoreShapesPass(ir.passes.InPlacePass):
    """Puts back, in place, the shapes an InferShapesPass stored in the run's state (`restore_shapes`);
    modified=False, as there."""

    def __init__(self, state: RunState) -> None:
        super().__init__()
        self.state = state

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        restore_shapes(model, self.state.stored_shapes)
        return ir.passes.PassResult(model, modified=False)


def infer_shapes(model: ir.Model, native_norms: bool = False, symbolic: SymbolicInference | None = None) -> Shapes:
    """onnx shape inference on a copy without large initializers; on failure keep the shapes the model has.

    Then ONNX Runtime's symbolic inference where onnx's left norm inputs without shapes (reductions, and with
    `native_norms` the inputs of native norm ops to take over: onnx's inference stops at ONNX Runtime's contrib
    ops); what that one changed is returned (the previous shapes) so that `restore_shapes` can take it back out
    of the written model.
    """
    assumed, _ = loops.type_bodies(model)
    # Data propagation finds the shapes behind computed Reshapes, but on some exports (Cohere's attention) it
    # infers dims that contradict each other; strict mode detects that, and the run without it is kept instead.
    inference_logger = logging.getLogger(common_passes.ShapeInferencePass.__module__)
    level = inference_logger.level
    inference_logger.setLevel(logging.ERROR)
    try:
        strict = onnx_inference(model, strict_mode=True, data_prop=True)
    except Exception:  # the pass logs and returns unmodified on failure; this is for anything else
        strict = ir.passes.PassResult(model, False)
    finally:
        inference_logger.setLevel(level)
    if not strict.modified:
        try:
            onnx_inference(model, strict_mode=False, data_prop=False)
        except Exception as err:  # shape inference is best effort: unknown shapes make candidates near-misses
            logger.warning("shape inference failed, continuing with the shapes stored in the model: %s", err)
    _give_kept_dims(model)
    # Loop bodies take their types from what inference found in front of the Loop, and what follows the Loop its
    # shapes from the body: a few rounds (one per nesting level in practice).
    for _ in range(_LOOP_ROUNDS):
        # Outputs first: an inner Loop's output is what its enclosing body returns, which checks that body.
        outputs = loops.loop_output_shapes(model)
        assumed, changed = loops.check(assumed)
        new, typed = loops.type_bodies(model)
        assumed += new
        if not (outputs or changed or typed):
            break
        _infer_again(model)
    else:
        loops.check(assumed, narrow=False)  # the last round's assumptions, which inference has now used
    stored: Shapes = {}
    if _reductions_without_shape(model.graph) or (native_norms and _native_norms_without_shape(model.graph)):
        stored = _stored_shapes(model)
        (symbolic or infer_symbolic_shapes)(model)
        _give_kept_dims(model)  # the names it found reach the views and element-wise ops onnx's left unnamed
    for function in model.functions.values():
        try:
            _infer_function_shapes(model, function)
        except Exception as err:  # same: a function without shapes only yields near-misses
            logger.info("no shapes for function %s::%s: %s", function.domain, function.name, err)
    return stored


_LOOP_ROUNDS = 3


def _give_kept_dims(model: ir.Model) -> None:
    """Dims inference leaves unknown that the graph's own shape arithmetic gives, and inference again: each round's
    dims reach the next layer's Reshape or Slice only after inference ran again, so a few rounds."""
    for _ in range(_KEPT_DIMS_ROUNDS):
        graph = model.graph
        if not (_reshapes_to_own_shape(graph) | _slices_keep_other_dims(graph) | shape_values.give_shapes(graph)):
            break
        _infer_again(model)


def onnx_inference(model: ir.Model, *, strict_mode: bool, data_prop: bool) -> ir.passes.PassResult:
    """onnx-ir's ShapeInferencePass, keeping the values that are not tensors what they are.

    onnx-ir 1.1 merges what onnx infers by element type only (`value.dtype = ...`), which makes a value without a
    declared type a tensor even where onnx inferred a sequence or an optional (SequenceInsert's output, say): the
    written model then declares a tensor there and ONNX Runtime refuses it. A value declared as such gets its
    declared type back; an undeclared one gets the kind its producer's schema allows, when that allows one kind."""
    before = {value: value.type for value in _all_values(model)}
    result = common_passes.ShapeInferencePass(strict_mode=strict_mode, data_prop=data_prop)(model)
    for value, declared in before.items():
        inferred = value.type
        if not isinstance(inferred, ir.TensorType) or isinstance(declared, ir.TensorType):
            continue
        if declared is not None:
            value.type = declared
            continue
        kind = _schema_output_kind(value, model.opset_imports)
        if kind == "seq":
            value.type = ir.SequenceType(ir.TensorType(inferred.dtype))
        elif kind == "optional":
            value.type = ir.OptionalType(ir.TensorType(inferred.dtype))
    return result


def _all_values(model: ir.Model) -> list[ir.Value]:
    values: list[ir.Value] = []
    for graph in [model.graph, *model.functions.values()]:
        values.extend(graph.inputs)
        for node in ir.traversal.RecursiveGraphIterator(graph):
            values.extend(v for v in node.outputs if v is not None)
    return values


def _schema_output_kind(value: ir.Value, opsets: dict[str, int]) -> str | None:
    """ "seq", "optional" or "tensor" when every type the producer's schema allows for this output is of that kind;
    None when it allows several (If, Loop) or the op has no schema here."""
    node = value.producer()
    if node is None or value.index() is None:
        return None
    domain = "" if is_onnx_domain(node.domain) else node.domain
    try:
        schema = onnx.defs.get_schema(node.op_type, opsets.get(domain, opsets.get("ai.onnx", 1)), domain)
    except onnx.defs.SchemaError:
        return None
    outputs = schema.outputs
    if not outputs:
        return None
    formal = outputs[min(value.index() or 0, len(outputs) - 1)]
    allowed = next((c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == formal.type_str), None)
    kinds = {_kind(text) for text in (allowed if allowed is not None else [formal.type_str])}
    return kinds.pop() if len(kinds) == 1 else None


def _kind(type_str: str) -> str:
    if type_str.startswith("seq("):
        return "seq"
    if type_str.startswith("optional("):
        return "optional"
    return "tensor" if type_str.startswith("tensor(") else "other"


def _infer_again(model: ir.Model) -> None:
    """onnx's inference once more, after shapes were given to values it had left unknown."""
    try:
        onnx_inference(model, strict_mode=False, data_prop=False)
    except Exception as err:  # best effort, as above
        logger.info("shape inference after giving shapes to unknown values failed: %s", err)


def _reshapes_to_own_shape(graph: ir.Graph) -> bool:
    """Gives `Reshape(a, Shape(a))` and `Expand(a, Shape(a))` (a no-op some exporters write) the shape of `a`, which
    onnx's inference leaves unknown when `a` has symbolic dims; True when it set any."""
    changed = False
    for node in graph:
        if node.op_type not in ("Reshape", "Expand") or not is_onnx_domain(node.domain) or len(node.inputs) < 2:
            continue
        source, target = node.inputs[0], node.inputs[1]
        shape_node = None if target is None else target.producer()
        if source is None or source.shape is None or shape_node is None or shape_node.op_type != "Shape":
            continue
        if shape_node.inputs[0] is not source or shape_node.attributes.get("start") or "end" in shape_node.attributes:
            continue
        output = node.outputs[0]
        if output.shape is None or _vague(output.shape):
            output.shape = ir.Shape(list(source.shape))
            if output.type is None and source.type is not None:
                output.type = source.type
            changed = True
    return changed


#: Rounds of dims given by _reshapes_to_own_shape/_slices_keep_other_dims/shape_values and inference run again (one
#: per layer that needs them, at most; more layers keep what inference alone finds).
_KEPT_DIMS_ROUNDS = 8


def _slices_keep_other_dims(graph: ir.Graph) -> bool:
    """Gives a Slice whose starts or ends are computed at run time the input's dims on the axes it does not slice
    (its `axes` constant): onnx's inference then knows only the rank, and a batch dim lost there (transformers'
    Mamba slices its conv output by the sequence length) makes every Add after it one that might broadcast, which
    the Skip fold must refuse. True when it set any dim."""
    changed = False
    for node in graph:
        if node.op_type != "Slice" or not is_onnx_domain(node.domain) or len(node.inputs) < 4:
            continue
        source, axes_value, output = node.inputs[0], node.inputs[3], node.outputs[0]
        axes = None if axes_value is None else constants.int_list(axes_value)
        if source is None or source.shape is None or axes is None or output.shape is None:
            continue
        rank = len(source.shape)
        if len(output.shape) != rank:
            continue
        sliced = {axis % rank for axis in axes}
        dims = [source.shape[i] if i not in sliced else output.shape[i] for i in range(rank)]
        if any(dims[i] != output.shape[i] and isinstance(dims[i], int) for i in range(rank)):
            output.shape = ir.Shape(dims)
            changed = True
    return changed


#: Models with more tensor bytes than this are not serialised again for ONNX Runtime's symbolic shape inference.
_SYMBOLIC_INFERENCE_MAX_BYTES = 1 << 30


def _reductions_without_shape(graph: ir.Graph) -> bool:
    """True when some reduction reads a value without a shape, or with dims onnx could only call `unk__N`."""
    return any(
        node.op_type in REDUCTIONS and node.inputs and node.inputs[0] is not None and _vague(node.inputs[0].shape)
        for node in graph
    )


def _native_norms_without_shape(graph: ir.Graph) -> bool:
    """True when a native norm op's input (or skip input) has no shape, or one with `unk__N` dims."""
    for node in graph:
        kind = native.native_kind(node)
        if kind is not None and any(value is not None and _vague(value.shape) for value in node.inputs[: 1 + kind[1]]):
            return True
    return False


def _run_symbolic_inference(inference_class: Any, proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """`SymbolicShapeInference.infer_shapes` without its side effect: when inference stops short, that
    function writes `sym_shape_infer_temp.onnx` and one external-data file per weight into the working
    directory before raising. A partial result is still useful to the matchers, so keep it instead."""
    if not any(is_onnx_domain(op.domain) and op.version >= 7 for op in proto.opset_import):
        return None
    # Merging lets inference go past dims it cannot prove equal (BERT's Min(max_positions, sequence) vs
    # sequence): dims that a valid input makes equal anyway. Only the matchers see the result.
    inference = inference_class(2**31 - 1, True, False, 0)
    inference._preprocess(proto)
    while inference.run_:
        inference._infer_impl()
    inference._update_output_from_vi()
    return inference.out_mp_


def infer_symbolic_shapes(model: ir.Model) -> None:
    """ONNX Runtime's symbolic shape inference, which follows the data-dependent Reshapes of attention blocks that
    onnx's inference gives up on. It fills in shapes the model does not have yet (for the matchers only)."""
    from onnx_norm.model_io import tensor_bytes

    if tensor_bytes(model) > _SYMBOLIC_INFERENCE_MAX_BYTES:
        return
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        return
    proto = ir.serde.serialize_model(model)
    try:
        inferred = _run_symbolic_inference(SymbolicShapeInference, proto)
    except Exception as err:  # best effort, like onnx's inference
        logger.info("symbolic shape inference failed: %s", err)
        return
    if inferred is None:
        return
    values = {v.name: v for node in model.graph for v in node.outputs if v.name}
    for info in inferred.graph.value_info:
        value = values.get(info.name)
        if value is None or not _vague(value.shape) or not info.type.tensor_type.HasField("shape"):
            continue
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in info.type.tensor_type.shape.dim
        ]
        value.shape = ir.Shape(dims)
        if value.type is None and info.type.tensor_type.elem_type:
            value.type = ir.TensorType(ir.DataType(info.type.tensor_type.elem_type))


def _intermediate_values(model: ir.Model):
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            for value in node.outputs:
                if value.name and not value.is_graph_output():
                    yield value


def _stored_shapes(model: ir.Model) -> Shapes:
    """The shapes and types the model itself records for its intermediate values."""
    return {value.name: (value.shape, value.type) for value in _intermediate_values(model)}  # type: ignore[misc]


def restore_shapes(model: ir.Model, stored: Shapes) -> None:
    """Puts back the shapes the model recorded before our inference (rewritten values keep their names).

    The inferred shapes serve the matchers only: ONNX Runtime plans memory with stored shapes, and an inference
    that merged dims it could not prove equal must not leak into the written model.
    """
    for value in _intermediate_values(model):
        if value.name in stored:
            # Element types are kept: inference cannot get them wrong, and the model-local functions need them.
            value.shape = stored[value.name][0]


def _vague(shape: ir.Shape | None) -> bool:
    """No shape, or dims onnx's inference could only name `unk__N` (which match nothing else)."""
    if shape is None:
        return True
    return any(not isinstance(d, int) and (d.value is None or str(d.value).startswith("unk__")) for d in shape)


def _call_sites(model: ir.Model, function: ir.Function) -> list[ir.Node]:
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    calls = []
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            if (node.domain, node.op_type, node.overload) == function.identifier():
                calls.append(node)
    return calls


def _infer_function_shapes(model: ir.Model, function: ir.Function) -> None:
    """Shapes inside a model-local function, inferred from the types at its call sites when they all agree.

    onnx shape inference does not annotate function bodies, and the matchers need ranks and static normalised dims.
    """
    import onnx

    calls = _call_sites(model, function)
    if not calls:
        return
    input_types: list[onnx.TypeProto] = []
    for index in range(len(function.inputs)):
        seen = set()
        for call in calls:
            actual = call.inputs[index] if index < len(call.inputs) else None
            if actual is None or actual.type is None:
                return
            seen.add((actual.dtype, None if actual.shape is None else tuple(str(d) for d in actual.shape)))
        if len(seen) != 1:
            return  # called with different types or shapes: the body has no single shape
        first = calls[0].inputs[index]
        assert first is not None
        shape = None if first.shape is None else [d if isinstance(d, int) else None for d in first.shape]
        input_types.append(onnx.helper.make_tensor_type_proto(int(first.dtype), shape))
    proto = ir.serde.serialize_function(function)
    graph = onnx.helper.make_graph(
        list(proto.node),
        "body",
        [onnx.helper.make_value_info(name, t) for name, t in zip(proto.input, input_types, strict=False)],
        [onnx.helper.ValueInfoProto(name=name) for name in proto.output],
    )
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in function.opset_imports.items()]
    body_model = onnx.helper.make_model(
        graph, opset_imports=opsets, functions=[ir.serde.serialize_function(f) for f in model.functions.values()]
    )
    inferred = onnx.shape_inference.infer_shapes(body_model, strict_mode=False)
    infos = {info.name: info for info in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    values = {v.name: v for v in function.inputs}
    for node in function:
        for output in node.outputs:
            values[output.name] = output
    for name, info in infos.items():
        value = values.get(name)
        if value is None or not info.type.HasField("tensor_type"):
            continue
        tensor_type = info.type.tensor_type
        if value.type is None and tensor_type.elem_type:
            value.type = ir.TensorType(ir.DataType(tensor_type.elem_type))
        if value.shape is None and tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim]
            value.shape = ir.Shape(dims)
