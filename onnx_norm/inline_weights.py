"""Reading a model whose weights are inline (no external data) without holding the file's bytes and the parsed
message at once.

`onnx.load` reads the whole file into one bytes object and parses it; protobuf copies every `raw_data` into the
message, so a model of W bytes of weights peaks at 2 W while it loads (the rest of `optimize` stays near 1 W).
`read_model` walks the protobuf wire format of the file through a read-only memory map instead: everything but the
large `raw_data` payloads of the main graph's initializers is copied into a skeleton and parsed (small), then each
payload is read from the file and put into its tensor one at a time. The message is the one `onnx.load` gives
(tests compare the two). Payloads in subgraphs and functions, tensors spelled with typed fields and anything
unusual (a repeated `graph` or `raw_data` field) are left in the skeleton, i.e. read as `onnx.load` reads them.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import onnx

#: `raw_data` payloads from this size on are read one at a time.
LARGE_PAYLOAD = 1 << 20
# Field numbers of onnx.proto3 (ModelProto.graph, GraphProto.initializer, TensorProto.raw_data) and the
# length-delimited wire type.
_GRAPH, _INITIALIZER, _RAW_DATA = 7, 5, 9
_LEN = 2


class WireFormatError(ValueError):
    """The file is not a well-formed protobuf message."""


def _varint(view: mmap.mmap | bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end and shift < 64:
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise WireFormatError(f"truncated or overlong varint at byte {pos}")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(view: mmap.mmap, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, start of the key, start of the payload, end) of each field in [start, end)."""
    pos = start
    while pos < end:
        key, payload = _varint(view, pos, end)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, stop = _varint(view, payload, end)
        elif wire == 1:
            stop = payload + 8
        elif wire == _LEN:
            length, payload = _varint(view, payload, end)
            stop = payload + length
        elif wire == 5:
            stop = payload + 4
        else:  # groups: never written by ONNX
            raise WireFormatError(f"wire type {wire} at byte {pos}")
        if stop > end:
            raise WireFormatError(f"field {field} at byte {pos} runs past its message")
        yield field, wire, pos, payload, stop
        pos = stop


def _delimited(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | _LEN) + _encode_varint(len(payload)) + payload


def _tensor_without_payload(view: mmap.mmap, start: int, end: int) -> tuple[bytes, int, int] | None:
    """A tensor's fields without its one raw_data field, and where that payload is; None if it has no single one."""
    head = bytearray()
    found: list[tuple[int, int]] = []
    for field, wire, key, payload, stop in _fields(view, start, end):
        if field == _RAW_DATA and wire == _LEN:
            found.append((payload, stop - payload))
        else:
            head += view[key:stop]
    return (bytes(head), *found[0]) if len(found) == 1 else None


def _graph_skeleton(view: mmap.mmap, start: int, end: int) -> tuple[bytes, list[tuple[int, int, int]]]:
    """The graph's bytes with its large initializer payloads left out, and (initializer index, offset, length)."""
    out = bytearray()
    payloads: list[tuple[int, int, int]] = []
    index = 0
    for field, wire, key, payload, stop in _fields(view, start, end):
        split = None
        if field == _INITIALIZER and wire == _LEN:
            if stop - payload >= LARGE_PAYLOAD:
                split = _tensor_without_payload(view, payload, stop)
            index += 1
        if split is None:
            out += view[key:stop]
            continue
        head, offset, length = split
        out += _delimited(_INITIALIZER, head)
        payloads.append((index - 1, offset, length))
    return bytes(out), payloads


def _skeleton(view: mmap.mmap) -> tuple[bytes, list[tuple[int, int, int]]] | None:
    out = bytearray()
    payloads: list[tuple[int, int, int]] | None = None
    for field, wire, key, payload, stop in _fields(view, 0, len(view)):
        if field == _GRAPH and wire == _LEN:
            if payloads is not None:
                return None  # a repeated graph field merges: left to protobuf
            graph, payloads = _graph_skeleton(view, payload, stop)
            out += _delimited(_GRAPH, graph)
        else:
            out += view[key:stop]
    return bytes(out), payloads or []


def read_model(path: str | os.PathLike, *, payloads: bool = True) -> onnx.ModelProto:
    """The ModelProto in `path` without its external data, as `onnx.load(path, load_external_data=False)` reads
    it, holding at most one large payload besides the message; with `payloads=False` the large inline payloads are
    left out (their tensors have no data: for reading the structure, e.g. the external data files a model names).
    WireFormatError or protobuf's DecodeError when the file is not a well-formed message."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            raise WireFormatError(f"{Path(path).name} is empty")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            skeleton = _skeleton(view)
        if skeleton is None:
            return onnx.load(str(path), load_external_data=False)
        proto = onnx.ModelProto()
        proto.ParseFromString(skeleton[0])
        for index, offset, length in skeleton[1] if payloads else ():
            data = os.pread(file.fileno(), length, offset)  # no mapping: the pages stay out of this process
            if len(data) != length:
                raise WireFormatError(f"initializer {index}: {length} bytes announced, {len(data)} in the file")
            proto.graph.initializer[index].raw_data = data
            del data
    return proto
