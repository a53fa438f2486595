"""Whether two models can stand for each other in a comparison: the same graph inputs and outputs, by name, element
type and rank. `bench` and `verify` time or compare an original against its optimized version; two unrelated
models (a LLaMA against an optimized BERT) would give a number that means nothing.

One check for every caller: `bench()` refuses a pair whose inputs or outputs differ (`check`, InputError), which
the CLI prints as its one line (exit 2), and `inputs.check_same_inputs` (verify's: a missing output is a failed
comparison there, not an input error) is this check on the inputs alone. Whether the two also compute the same
thing is for bench's parity check (`onnx_norm.bench_check`) and verify's gate.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from onnx_norm.dtypes import type_name
from onnx_norm.errors import InputError

#: (name, element type, rank or None) of each graph input or output.
Signature = list[tuple[str, int, int | None]]


def _values(values: list[onnx.ValueInfoProto]) -> Signature:
    found = []
    for value in values:
        tensor = value.type.tensor_type
        rank = len(tensor.shape.dim) if tensor.HasField("shape") else None
        found.append((value.name, tensor.elem_type, rank))
    return found


def signature(model: onnx.ModelProto) -> tuple[Signature, Signature]:
    """The graph inputs (initializers excluded) and outputs of a model."""
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
            changed = f"{kind[:-1]} {_describe(item)} in the original is {_describe(other)} in the optimized model"
            return f"different {kind}: {changed}"
    return None


def name_of(model: object, role: str) -> str:
    """How the line names a model: its file name, or `the original model` for one given in memory."""
    if isinstance(model, (str, os.PathLike)):
        return Path(model).name
    return f"the {role} model"


def mismatch(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    names: tuple[object, object] = (None, None),
    *,
    outputs: bool = True,
) -> str | None:
    """Why the two models do not correspond (their inputs, and with `outputs` their outputs, differ in name, element
    type or rank), or None when they do. `names`: what the models were given as (a path names its file)."""
    ins, outs = signature(original)
    other_ins, other_outs = signature(optimized)
    found = _difference("inputs", ins, other_ins)
    if found is None and outputs:
        found = _difference("outputs", outs, other_outs)
    if found is None:
        return None
    return f"{name_of(names[0], 'original')} and {name_of(names[1], 'optimized')} are not the same model: {found}"


def check(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    names: tuple[object, object] = (None, None),
    *,
    outputs: bool = True,
) -> None:
    """InputError with `mismatch`'s line unless the two models correspond."""
    found = mismatch(original, optimized, names, outputs=outputs)
    if found is not None:
        raise InputError(found)
