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
            ir.save(model, staged)
        staged_data = staging / data_name
        if staged_data.exists():
            os.replace(staged_data, directory / data_name)
        os.replace(staged, path)
    except OSError as err:
        raise ModelSaveError(f"{path}: cannot write: {err}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
