"""Fused norms at export time: `torch.onnx.export` writes our ops for `aten.rms_norm` and `aten.layer_norm`.

Two routes, one result:

- the dynamo exporter: `torch.onnx.export(model, args, dynamo=True, custom_translation_table=translation_table())`
  translates the two aten ops to `onnx_norm::RMSNorm` / `onnx_norm::LayerNorm` (the table also keeps them from
  being decomposed first);
- the TorchScript exporter: `register_torchscript_symbolics(opset)` registers the same translations as custom
  symbolics (`torch.onnx.register_custom_op_symbolic`), which also lets it export `aten::rms_norm` below opset 23.

Either export then goes through `finalize`, which does what a per-op translation cannot see: it folds a residual
`Add` feeding a norm into the Skip op (`SkipRMSNorm` / `SkipLayerNorm`, the sum kept as the op's `Sum` output where
something else reads it) and attaches the model-local function bodies (`onnx_norm.ops.functions`) that keep the
model runnable without our library. `export` does all of it in one call. The result equals, op for op, what
`onnx_norm.optimize` makes of a plain export that decomposes the norm (dynamo's for `rms_norm`, TorchScript's below
opset 17 for `layer_norm`); tests/integrations/test_integrations_torch.py checks that.

Norm modules written out in Python (Hugging Face's `LlamaRMSNorm`, `Qwen2RMSNorm`, `GemmaRMSNorm`,
`T5LayerNorm`) never reach `aten.rms_norm`: the export writes their ops, decomposed. `export` therefore runs the
rewrite (`onnx_norm.optimize`) on the finalized model too, and logs how many norms each step fused, or why none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from onnx_norm.dtypes import ANALYSED_FLOAT_TYPES, FLOAT_TYPES
from onnx_norm.ops.reference import np_dtype
from onnx_norm.ops.schema import DOMAIN, LAYER_NORM, OPS, OPSET_VERSION, RMS_NORM, OpSignature

logger = logging.getLogger(__name__)

#: aten ops translated (TorchScript names).
TRANSLATED = ("aten::rms_norm", "aten::layer_norm")


def _skip_variant(name: str) -> OpSignature | None:
    """The Skip op of a norm op: the one whose inputs are the norm's with Skip after X (read from OPS, so that a
    family with a Skip variant needs no edit here); of the same kind, so that an op of another family whose inputs
    read the same (X, Scale) gets no Skip op of the RMSNorm's."""
    base = OPS[name]
    inputs = (base.inputs[0], "Skip", *base.inputs[1:])
    return next((op for op in OPS.values() if op.skip and op.kind == base.kind and op.inputs == inputs), None)


#: Norm op -> its Skip op, for folding a residual Add into the norm.
_SKIP_OPS: dict[str, OpSignature] = {name: skip for name in OPS if (skip := _skip_variant(name)) is not None}


def _default_eps(elem_type: int) -> float:
    """`aten.rms_norm`'s epsilon when none is given: the machine epsilon of the input's type (float32's for a type
    the norms do not compute in)."""
    import ml_dtypes  # finfo of bfloat16 too

    known = elem_type if elem_type in ANALYSED_FLOAT_TYPES else int(ir.DataType.FLOAT)
    return float(ml_dtypes.finfo(np_dtype(known)).eps)


def _exporter_schema(name: str) -> onnx.defs.OpSchema:
    """The exporter's view of one of our ops: its inputs, Y (the one output a translation uses: the exporter gives a
    node every output its schema declares) and the attributes set here. Not registered with onnx."""
    signature = OPS[name]
    param = onnx.defs.OpSchema.FormalParameter
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    inputs = [
        param(n, "T", "", param_option=optional if n in signature.optional_inputs else single) for n in signature.inputs
    ]
    types = [f"tensor({onnx.TensorProto.DataType.Name(t).lower()})" for t in FLOAT_TYPES]
    attribute = onnx.defs.OpSchema.Attribute
    kind = onnx.defs.OpSchema.AttrType
    return onnx.defs.OpSchema(
        name,
        DOMAIN,
        OPSET_VERSION,
        inputs=inputs,
        outputs=[param("Y", "T", "")],
        type_constraints=[("T", types, "")],
        attributes=[attribute("axis", kind.INT, ""), attribute("epsilon", kind.FLOAT, "")],
    )


def translation_table() -> dict[Callable[..., Any], Callable[..., Any]]:
    """`custom_translation_table` for the dynamo exporter: `aten.rms_norm` and `aten.layer_norm` to our ops."""
    import onnxscript
    import torch

    norm = onnxscript.values.Opset(DOMAIN, OPSET_VERSION)
    rms, layer = (onnxscript.values.Op(norm, name, _exporter_schema(name)) for name in (RMS_NORM.name, LAYER_NORM.name))

    def rms_norm(input: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None) -> Any:
        if eps is None:
            eps = _default_eps(int(input.dtype))
        return rms(input, weight, axis=-len(normalized_shape), epsilon=float(eps))

    def layer_norm(
        input: Any,
        normalized_shape: Any,
        weight: Any = None,
        bias: Any = None,
        eps: float = 1e-5,
        cudnn_enable: bool = True,
    ) -> Any:
        del cudnn_enable
        return layer(input, weight, bias, axis=-len(normalized_shape), epsilon=float(eps))

    return {torch.ops.aten.rms_norm.default: rms_norm, torch.ops.aten.layer_norm.default: layer_norm}


def _torchscript_node(g: Any, op_name: str, inputs: list[Any], shape: list[int], eps: float | None) -> Any:
    x = inputs[0]
    if eps is None:
        eps = _default_eps(_torchscript_elem_type(x))
    # Absent optional inputs are TorchScript None values, which the exporter writes as empty names; trailing ones
    # are dropped so that the node reads like the rewrite's.
    while inputs and inputs[-1].node().mustBeNone():
        inputs.pop()
    out = g.op(f"{DOMAIN}::{op_name}", *inputs, axis_i=-len(shape), epsilon_f=float(eps))
    # The exporter cannot infer the type of a custom op's output; without it, what follows loses its types.
    out.setType(x.type())
    return out


def _torchscript_symbolics() -> dict[str, Callable[..., Any]]:
    from torch.onnx.symbolic_helper import parse_args

    @parse_args("v", "is", "v", "f")
    def rms_norm(g: Any, input: Any, normalized_shape: list[int], weight: Any, eps: float | None) -> Any:
        return _torchscript_node(g, RMS_NORM.name, [input, weight], normalized_shape, eps)

    @parse_args("v", "is", "v", "v", "f", "b")
    def layer_norm(g: Any, input: Any, normalized_shape: list[int], weight: Any, bias: Any, eps: float, _: bool) -> Any:
        return _torchscript_node(g, LAYER_NORM.name, [input, weight, bias], normalized_shape, eps)

    return {"aten::rms_norm": rms_norm, "aten::layer_norm": layer_norm}


def _torchscript_elem_type(value: Any) -> int:
    import torch

    dtype = value.type().dtype() if hasattr(value.type(), "dtype") else None
    names = {torch.float16: ir.DataType.FLOAT16, torch.bfloat16: ir.DataType.BFLOAT16}
    return int(names.get(dtype, ir.DataType.FLOAT))


def register_torchscript_symbolics(opset_version: int) -> None:
    """Registers our translations of `aten::rms_norm` and `aten::layer_norm` with the TorchScript exporter."""
    import torch

    for aten, symbolic in _torchscript_symbolics().items():
        torch.onnx.register_custom_op_symbolic(aten, symbolic, opset_version)


def unregister_torchscript_symbolics(opset_version: int) -> None:
    import torch

    for aten in TRANSLATED:
        torch.onnx.unregister_custom_op_symbolic(aten, opset_version)


@contextlib.contextmanager
def torchscript_symbolics(opset_version: int) -> Iterator[None]:
    """Our symbolics registered for the duration of the block (the registration is process-wide)."""
    register_torchscript_symbolics(opset_version)
    try:
        yield
    finally:
        unregister_torchscript_symbolics(opset_version)


def _fold_residual(graph: ir.Graph, node: ir.Node) -> bool:
    """Replaces `norm(Add(a, b))` by the Skip op, as the rewrite's `skip.fold_residual` does; False if not."""
    from onnx_norm.rewrite import skip as residual

    base, skip_op = OPS[node.op_type], _SKIP_OPS[node.op_type]
    x = node.inputs[base.inputs.index("X")]
    addends = residual.residual_addends(x) if x is not None else None
    if addends is None:
        return False
    add, a, b = addends
    y_index, sum_index = skip_op.outputs.index("Y"), skip_op.outputs.index("Sum")
    extra = [out for name, out in zip(base.outputs, node.outputs, strict=False) if name not in skip_op.outputs]
    if any(out.uses() or out.is_graph_output() for out in extra):
        return False  # the Skip ops have no Mean/InvStdDev outputs
    keeps_sum = x.is_graph_output() or any(use.node is not node for use in x.uses())
    skip = ir.Node(
        DOMAIN,
        skip_op.name,
        [a, b, *node.inputs[1:]],
        attributes=list(node.attributes.values()),
        num_outputs=(sum_index if keeps_sum else y_index) + 1,
        name=node.name,
    )
    graph.insert_before(node, skip)
    y, old_y = skip.outputs[y_index], node.outputs[base.outputs.index("Y")]
    y.shape, y.type = old_y.shape, old_y.type
    ir.convenience.replace_all_uses_with(old_y, y, replace_graph_outputs=True)
    renames = [(y, old_y.name)]
    if keeps_sum:
        total = skip.outputs[sum_index]
        total.shape, total.type = x.shape, x.type
        ir.convenience.replace_all_uses_with(x, total, replace_graph_outputs=True)
        renames.append((total, x.name))
    graph.remove(node, safe=True)
    if not any(out.uses() or out.is_graph_output() for out in add.outputs):
        graph.remove(add, safe=True)
    for value, name in renames:
        value.name = name
    return True


def _infer_types(model: ir.Model) -> None:
    """Shapes and types for every value. onnx's inference stops at our ops (it has no schema for them), so each
    round gives their outputs X's shape and type and runs it again, until nothing is left without a type: the
    TorchScript exporter records none for intermediate values."""
    import onnx_ir.passes.common as common_passes

    norms = [(node, OPS[node.op_type]) for node in model.graph if node.domain == DOMAIN and node.op_type in OPS]
    for _ in range(len(norms) + 1):
        common_passes.ShapeInferencePass(strict_mode=False, data_prop=True)(model)
        changed = False
        for node, signature in norms:
            x = node.inputs[signature.inputs.index("X")]
            y = node.outputs[signature.outputs.index("Y")]
            if x is not None and x.type is not None and y.type is None:
                y.type, y.shape = x.type, x.shape
                changed = True
        if not changed:
            return


def fold_residuals(model: ir.Model) -> int:
    """Folds residual Adds into our Skip ops in the main graph; the number folded."""
    count = 0
    for node in list(model.graph):
        if node.domain == DOMAIN and node.op_type in _SKIP_OPS and _fold_residual(model.graph, node):
            count += 1
    return count


def finalize(model: Any) -> Any:
    """Folds residual Adds into Skip ops and attaches the function bodies; in place where the model is an
    `ir.Model` or a dynamo `ONNXProgram` (whose `.model` is rewritten), a new ModelProto for a ModelProto, an
    `ir.Model` for a path. Returns the model."""
    from onnx_norm import model_io
    from onnx_norm.ops.functions import attach_functions

    ir_model = model.model if hasattr(model, "model") and isinstance(model.model, ir.Model) else model_io.load(model)
    _infer_types(ir_model)
    folded = fold_residuals(ir_model)
    attach_functions(ir_model)
    logger.info("folded %d residual Add(s) into Skip ops", folded)
    if isinstance(model, onnx.ModelProto):
        return ir.serde.serialize_model(ir_model)
    return model if hasattr(model, "model") else ir_model


def _our_norms(model: ir.Model) -> int:
    return sum(1 for node in ir.traversal.RecursiveGraphIterator(model.graph) if node.domain == DOMAIN)


def _rewrite_after_export(model: ir.Model, translated: int) -> None:
    """The rewrite on the exported model, for the norms the translations could not see (written out in Python, as
    Hugging Face writes RMSNorm); logs what each step fused, and why nothing was when nothing was."""
    from onnx_norm.rewrite import optimize
    from onnx_norm.rewrite.native import native_kind

    _, report = optimize(model)
    logger.info(
        "%d norm(s) translated at export (aten.rms_norm / aten.layer_norm), %d fused by the rewrite after it "
        "(norms written out in Python: decomposed in the export)",
        translated,
        len(report.norms),
    )
    if translated or report.norms:
        return
    native = sum(1 for node in ir.traversal.RecursiveGraphIterator(model.graph) if native_kind(node) is not None)
    if native:
        logger.warning(
            "no norm fused: the exporter wrote %d native normalization op(s), kept as they are "
            "(onnx_norm.optimize(..., take_over_native=True) moves them onto our ops)",
            native,
        )
    else:
        logger.warning(
            "no norm fused: the model has no aten.rms_norm/aten.layer_norm call and the rewrite recognised no "
            "decomposed norm in the export (%d near-miss(es); `onnx-norm inspect --explain` lists them)",
            len(report.near_misses),
        )


def export(
    model: Any,
    args: tuple[Any, ...],
    path: str | os.PathLike,
    *,
    dynamo: bool = True,
    rewrite: bool = True,
    **kwargs: Any,
) -> ir.Model:
    """`torch.onnx.export` with our translations, `finalize`d, the rewrite run on what the translations could not
    see (`rewrite`, on by default), saved to `path`; returns the model.

    `kwargs` go to `torch.onnx.export` (`opset_version`, `dynamic_shapes`/`dynamic_axes`, names...). TorchScript
    exports default to opset 17.
    """
    import torch

    from onnx_norm import model_io

    if dynamo:
        program = torch.onnx.export(model, args, dynamo=True, custom_translation_table=translation_table(), **kwargs)
        result = finalize(program).model
    else:
        opset = kwargs.setdefault("opset_version", 17)
        kwargs.setdefault("custom_opsets", {DOMAIN: OPSET_VERSION})
        with tempfile.TemporaryDirectory() as tmp, torchscript_symbolics(opset):
            plain = Path(tmp) / "model.onnx"
            torch.onnx.export(model, args, str(plain), dynamo=False, **kwargs)
            result = finalize(onnx.load(str(plain)))
            result = ir.serde.deserialize_model(result)
    if rewrite:
        _rewrite_after_export(result, _our_norms(result))
    model_io.save(result, path)
    return result
