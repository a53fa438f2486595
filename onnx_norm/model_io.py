"""Loading and saving models: a path, an `onnx.ModelProto` or an `onnx_ir.Model` in, the same kind out.

Paths are loaded with onnx-ir, which memory-maps external data instead of pulling every weight into one protobuf.
Saving is atomic (everything is written next to the destination, then renamed into place) and switches to external
data, with a path relative to the model, when the model already used it or its tensors would not fit in the 2 GB
protobuf limit.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import onnx
import onnx_ir as ir

logger = logging.getLogger(__name__)

ModelLike = str | os.PathLike | onnx.ModelProto | ir.Model

#: Above this many bytes of tensors a model is saved with external data (protobuf's hard limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


class ModelLoadError(Exception):
    """The model cannot be read: missing, unreadable, not ONNX, or broken."""


class ModelSaveError(Exception):
    """The model cannot be written where asked."""


def load(model: ModelLike) -> ir.Model:
    """An `ir.Model` for any accepted kind of input (an `ir.Model` is returned as is)."""
    if isinstance(model, ir.Model):
        return model
    if isinstance(model, onnx.ModelProto):
        try:
            return ir.serde.deserialize_model(model)
        except Exception as err:
            raise ModelLoadError(f"cannot convert the ModelProto: {err}") from err
    if isinstance(model, (str, os.PathLike)):
        path = pathlib.Path(model)
        if not path.exists():
            raise ModelLoadError(f"{path}: no such file")
        if path.is_dir():
            raise ModelLoadError(f"{path}: is a directory, not an ONNX model")
        if not os.access(path, os.R_OK):
            raise ModelLoadError(f"{path}: permission denied")
        try:
            loaded = ir.load(path)
        except Exception as err:
            raise ModelLoadError(f"{path}: not a readable ONNX model ({type(err).__name__}: {err})") from err
        if not loaded.graph.opset_imports and len(loaded.graph) == 0:
            raise ModelLoadError(f"{path}: not an ONNX model (no graph, no opset imports)")
        _check_external_data(loaded, path)
        return loaded
    raise TypeError(f"expected a path, an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}")


def _check_external_data(model: ir.Model, path: pathlib.Path) -> None:
    """Fails early, with the file named, when external data the model refers to is missing."""
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor):
            location = pathlib.Path(tensor.base_dir) / tensor.location
            if not location.exists():
                raise ModelLoadError(f"{path}: external data file {tensor.location!r} of {value.name!r} is missing")


def clone(model: ir.Model) -> ir.Model:
    """An independent copy (tensors are shared, never modified by the rewrites)."""
    return ir.serde.deserialize_model(ir.serde.serialize_model(model))


def like(original: ModelLike, model: ir.Model) -> onnx.ModelProto | ir.Model:
    """`model` as the kind of `original`: a ModelProto for a ModelProto, else the ir.Model."""
    if isinstance(original, onnx.ModelProto):
        return ir.serde.serialize_model(model)
    return model


def tensor_bytes(model: ir.Model) -> int:
    """Bytes of all initializers (main graph and functions), without loading external data."""
    total = 0
    graphs = [model.graph, *(f.graph for f in model.functions.values())]
    for graph in graphs:
        for value in graph.initializers.values():
            if value.const_value is not None:
                total += value.const_value.nbytes
    return total


def _uses_external_data(model: ir.Model) -> bool:
    return any(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values())


def save(model: ir.Model, path: str | os.PathLike, *, external_data: bool | None = None) -> None:
    """Writes `model` to `path` atomically; external data (`<name>.data`, relative) when needed or asked."""
    path = pathlib.Path(path)
    directory = path.parent if str(path.parent) else pathlib.Path(".")
    if not directory.is_dir():
        raise ModelSaveError(f"{path}: directory {directory} does not exist")
    if external_data is None:
        external_data = _uses_external_data(model) or tensor_bytes(model) > EXTERNAL_DATA_THRESHOLD
    data_name = f"{path.name}.data"
    try:
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=directory))
    except OSError as err:
        raise ModelSaveError(f"{path}: cannot write in {directory}: {err}") from err
    try:
        staged = staging / path.name
        if external_data:
            if tensor_bytes(model) > EXTERNAL_DATA_THRESHOLD:
                logger.info("saving %s with external data %s (tensors exceed the protobuf limit)", path, data_name)
            ir.save(model, staged, external_data=data_name)
        else:
            _save_inline(model, staged)
        staged_data = staging / data_name
        if staged_data.exists():
            os.replace(staged_data, directory / data_name)
        os.replace(staged, path)
    except OSError as err:
        raise ModelSaveError(f"{path}: cannot write: {err}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)


#: Initializers from this size on are written one at a time by `_save_inline`.
STREAMED_TENSOR_BYTES = 1 << 20


def _save_inline(model: ir.Model, path: pathlib.Path) -> None:
    """`ir.save` without external data, but with the main graph's large initializers serialised one at a time.

    Serialising the whole model at once holds the weights three times (the model, its ModelProto, the bytes);
    protobuf fields may come in any order and a repeated field may be written piecewise, so the model is written
    without them and each initializer appended to the graph field, holding one tensor at a time."""
    large = [
        v
        for v in model.graph.initializers.values()
        if v.const_value is not None and v.const_value.nbytes >= STREAMED_TENSOR_BYTES
    ]
    if not large:
        ir.save(model, path)
        return
    tensors = [(v, v.const_value) for v in large]
    serde_logger = logging.getLogger(ir.serde.__name__)
    level = serde_logger.level
    serde_logger.setLevel(logging.ERROR)  # "initializer without a constant value": the ones written below
    try:
        for value in large:
            value.const_value = None
        proto = ir.serde.serialize_model(model)
    finally:
        serde_logger.setLevel(level)
        for value, tensor in tensors:
            value.const_value = tensor
    graph = proto.graph.SerializeToString()
    proto.ClearField("graph")
    head = proto.SerializeToString()

    def tensor_proto(value: ir.Value, tensor) -> onnx.TensorProto:
        made = ir.serde.serialize_tensor(tensor)
        made.name = value.name
        return made

    sizes = [tensor_proto(v, t).ByteSize() for v, t in tensors]
    fields = sum(1 + len(_varint(size)) + size for size in sizes)
    with open(path, "wb") as file:
        file.write(head)
        file.write(b"\x3a" + _varint(len(graph) + fields))  # ModelProto.graph: field 7, length-delimited
        file.write(graph)
        for (value, tensor), size in zip(tensors, sizes, strict=True):
            data = tensor_proto(value, tensor).SerializeToString()
            assert len(data) == size
            file.write(b"\x2a" + _varint(size))  # GraphProto.initializer: field 5, length-delimited
            file.write(data)
            del data


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        if number:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def proto_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node of a ModelProto: the main graph, the subgraphs of If/Loop/Scan nodes, model-local functions."""
    yield from graph_nodes(model.graph)
    for function in model.functions:
        yield from function.node


def graph_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """All nodes of `graph` and of the subgraphs in its If/Loop/Scan nodes."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from graph_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from graph_nodes(sub)
