"""Raising a model's default-domain opset before the rewrite (`optimize(opset=N)`, `--opset N`), as an onnx-ir pass
(in place): ONNX's standard norm ops need opsets the usual exports do not import (17 to 23, each op's record says
which: `ops/*.py`'s natives), and `--target onnx` never raises one by itself (a new opset changes
other ops too). The conversion is onnx's version converter's (`onnx.version_converter.convert_version`); onnx-norm
only hands it the model without its external data and puts the model back together around what it returns.

Only raised, never lowered. What the converter cannot do (an op it has no adapter for, a model too large for one
protobuf, model-local functions, which it drops) is an `OpsetError`: one line, before anything is written."""

from __future__ import annotations

import logging
import re

import onnx
import onnx_ir as ir

from onnx_norm.dtypes import onnx_opset
from onnx_norm.model_io import PROTOBUF_LIMIT, ModelLoadError, check

__all__ = ["OpsetError", "RaiseOpsetPass", "check_opset", "max_opset"]

logger = logging.getLogger(__name__)


class OpsetError(ModelLoadError):
    """The model's opset cannot be raised as asked (a ModelLoadError: the CLI's exit 2, one line)."""


def max_opset() -> int:
    """The newest default-domain opset the installed onnx knows (its converter converts up to it)."""
    return int(onnx.defs.onnx_opset_version())


def check_opset(opset: object) -> int:
    """`opset` as an int between 1 and `max_opset()`; ValueError naming the bound otherwise."""
    if isinstance(opset, bool) or not isinstance(opset, int):
        raise ValueError(f"opset must be an integer, got {opset!r}")
    newest = max_opset()
    if not 1 <= opset <= newest:
        raise ValueError(f"opset {opset} is not one the installed onnx {onnx.__version__} knows (1 to {newest})")
    return opset


class RaiseOpsetPass(ir.passes.InPlacePass):
    """Raises the model's default-domain opset to `opset` with onnx's version converter, in place (the model keeps
    its identity: its graph is replaced by the converted one). `raised` is (from, to) after a run that raised it,
    None after one that found the model at `opset` already. A model above `opset` is an OpsetError."""

    def __init__(self, opset: int) -> None:
        super().__init__()
        self.opset = check_opset(opset)
        self.raised: tuple[int, int] | None = None

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.raised = None
        before = onnx_opset(model.opset_imports)
        if before is None:  # no ONNX op in the model: nothing to convert, the import is all it needs
            model.opset_imports[""] = self.opset
            self.raised = (0, self.opset)
            return ir.passes.PassResult(model, modified=True)
        if before > self.opset:
            raise OpsetError(
                f"cannot lower the model's default opset {before} to {self.opset}: the opset is only raised"
            )
        if before == self.opset:
            return ir.passes.PassResult(model, modified=False)
        _refuse_functions(model, before, self.opset)
        converted = _convert(model, before, self.opset)
        _put_back(model, converted)
        self.raised = (before, self.opset)
        logger.info("raised the default opset from %d to %d (onnx's version converter)", before, self.opset)
        return ir.passes.PassResult(model, modified=True)


def _refuse_functions(model: ir.Model, before: int, opset: int) -> None:
    """The converter drops model-local functions (onnx 1.23): a function whose body uses ONNX ops would be left
    at the old opset or lost, so such a model is refused. Functions without ONNX ops are kept as they are."""
    for function in model.functions.values():
        if onnx_opset(function.opset_imports) is not None:
            raise OpsetError(
                f"cannot raise the opset from {before} to {opset}: model-local function {function.domain}::"
                f"{function.name} uses ONNX ops, and onnx's version converter does not convert functions"
            )


def _inline_bytes(model: ir.Model) -> int:
    """Bytes of the tensors held in the model itself (external ones stay references in the converter's copy)."""
    total = 0
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is not None and not isinstance(tensor, ir.ExternalTensor):
                total += tensor.nbytes
    return total


def _convert(model: ir.Model, before: int, opset: int) -> onnx.ModelProto:
    """The converter's result for `model` (external tensors as references, never read), checked with
    `model_io.check`; OpsetError on one line when the converter cannot take the model or refuses it."""
    head = f"cannot raise the opset from {before} to {opset}"
    inline = _inline_bytes(model)
    if inline > PROTOBUF_LIMIT:
        raise OpsetError(
            f"{head}: onnx's version converter takes the model as one protobuf, and its tensors take "
            f"{inline / 2**30:.2f} GiB (the limit is 2 GiB); save the model with external data first"
        )
    proto = ir.serde.serialize_model(model)
    try:
        converted = onnx.version_converter.convert_version(proto, opset)
    except Exception as err:  # the converter's C++ assertions arrive as RuntimeError, others as what they are
        raise OpsetError(f"{head}: onnx's version converter: {_converter_message(err)}") from None
    try:
        check(converted, f"the model converted to opset {opset}")
    except ModelLoadError as err:
        raise OpsetError(f"{head}: {err}") from None
    return converted


def _converter_message(err: BaseException) -> str:
    """The converter's message without the source file and the assertion around it, on one line."""
    text = " ".join(str(err).split())
    match = re.search(r"Assertion `.*?` failed: (.*)", text)
    return match.group(1) if match else text or type(err).__name__


def _put_back(model: ir.Model, converted: onnx.ModelProto) -> None:
    """The converted graph into `model`, its external tensors the original ones (same file, same folder, the
    memory map onnx-ir may hold); the model's functions, metadata and producer stay."""
    originals = {
        value.name: value.const_value
        for graph in model.graphs()
        for value in graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor)
    }
    folders = {tensor.base_dir for tensor in originals.values()}
    new = ir.serde.deserialize_model(converted)
    if len(folders) == 1:  # tensors in attributes (Constant nodes) read from the same folder
        ir.external_data.set_base_dir(new.graph, folders.pop())
    for graph in new.graphs():
        for value in graph.initializers.values():
            original = originals.get(value.name or "")
            tensor = value.const_value
            if original is not None and isinstance(tensor, ir.ExternalTensor) and tensor.location == original.location:
                value.const_value = original
    model.graph = new.graph
    # The IR version the new opset came with (the converter keeps the old one: IR 7 at opset 17, which onnx's
    # checker and ONNX Runtime accept, but the files onnx writes at that opset say 8).
    needed = onnx.helper.find_min_ir_version_for(list(converted.opset_import), ignore_unknown=True)
    model.ir_version = max(model.ir_version, new.ir_version, needed)
