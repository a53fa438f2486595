"""Whether two models can stand for each other in a comparison: the same graph inputs and outputs, by name, element
type and rank. `bench` and `verify` time or compare an original against its optimized version; two unrelated
models (a LLaMA against an optimized BERT) would give a number that means nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from onnx_norm.dtypes import type_name

#: (name, element type, rank or None) of each graph input or output.
Signature = list[tuple[str, int, int | None]]


def _values(values: list[onnx.ValueInfoProto]) -> Signature:
    found = []
    for value in values:
        tensor = value.type.tensor_type
        rank = len(tensor.shape.dim) if tensor.HasField("shape") else None
        found.append((value.name, tensor.elem_type, rank))
    return found


def signature(path: str | os.PathLike) -> tuple[Signature, Signature]:
    """The graph inputs (initializers excluded) and outputs of the model file, read without its weights."""
    model = onnx.load(str(path), load_external_data=False)
    if not model.HasField("graph"):  # an empty file parses as an empty model
        raise ValueError(f"{path}: no graph")
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    return _values(inputs), _values(list(model.graph.output))


def _describe(item: tuple[str, int, int | None]) -> str:
    name, elem_type, rank = item
    return f"{name!r} ({type_name(elem_type)}, rank {'?' if rank is None else rank})"


def _difference(kind: str, original: Signature, optimized: Signature) -> str | None:
    by_name = {item[0]: item for item in optimized}
    missing = [item for item in original if item[0] not in by_name]
    names = {item[0] for item in original}
    extra = [item for item in optimized if item[0] not in names]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"the original's {', '.join(map(_describe, missing))} missing from the optimized model")
        if extra:
            parts.append(f"the optimized model's {', '.join(map(_describe, extra))} not in the original")
        return f"different {kind}: " + "; ".join(parts)
    for item in original:
        other = by_name[item[0]]
        # A rank unknown on either side is no evidence of a difference.
        if item[1] != other[1] or (item[2] is not None and other[2] is not None and item[2] != other[2]):
            return f"{kind[:-1]} {_describe(item)} in the original is {_describe(other)} in the optimized model"
    return None


def mismatch(original: str | os.PathLike, optimized: str | os.PathLike) -> str | None:
    """Why the two model files do not correspond (inputs or outputs differ in name, element type or rank), or
    None when they do."""
    try:
        ins, outs = signature(original)
        other_ins, other_outs = signature(optimized)
    except Exception:  # not readable as ONNX: the loader says so, in its own words, when the model is loaded
        return None
    problem = _difference("inputs", ins, other_ins) or _difference("outputs", outs, other_outs)
    if problem is None:
        return None
    return f"{Path(original).name} and {Path(optimized).name} are not the same model: {problem}"
