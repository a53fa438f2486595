"""External data of models handed to ONNX Runtime: never read into Python memory, never re-serialised.

A ModelProto read for the parity gate or the bench keeps its external tensors as references
(`model_io.resolve_external_data` makes their locations absolute, so that the proto no longer depends on where it
was read from). A session of such a proto is made from a small header file in a temporary directory; each external
tensor is handed to ONNX Runtime as an OrtValue over a read-only memory map of its data file
(`SessionOptions.add_initializer`, which ORT uses without copying); the header names hard links to the data files
beside it (ORT refuses absolute locations and links that leave the model's folder, and still reads an overridden
tensor where it folds constants). One `SharedWeights` serves several sessions: the weights are in memory once,
whatever the number of sessions.

ONNX Runtime's CPU kernels pre-pack constant MatMul weights into a copy of their own; with the weights shared that
copy would be made per session and the memory map stay resident besides, so sessions made here turn pre-packing off
(`session.disable_prepacking`). Sessions made from a model's own path (ORT loads it as users do) are not affected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mmap
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from onnx_norm import model_io
from onnx_norm.errors import InputError
from onnx_norm.ops.reference import np_dtype

logger = logging.getLogger(__name__)

GIB = 2**30
#: Bytes read at a time when two data files are compared.
_CHUNK = 16 << 20


class WeightsError(ValueError):
    """External data that cannot be used: a missing or short data file."""


@dataclasses.dataclass(frozen=True)
class ExternalRef:
    """Where an external tensor's bytes are: an absolute file path, an offset and a length."""

    file: str
    offset: int
    length: int


def handed_over(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """The external initializers of the main graph: the ones a session gets as OrtValues (`add_initializers`).
    ORT reads the other external tensors (in subgraphs, functions and attributes: `model_io.external_tensors`) itself,
    from the data files the session's header names."""
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            yield tensor


def reference(tensor: onnx.TensorProto) -> ExternalRef:
    info = {entry.key: entry.value for entry in tensor.external_data}
    itemsize = np_dtype(tensor.data_type).itemsize
    count = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
    length = int(info["length"]) if "length" in info else count * itemsize
    return ExternalRef(info.get("location", ""), int(info.get("offset", 0)), length)


def _set_location(tensor: onnx.TensorProto, location: str) -> None:
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes of one tensor's data, external or not, without reading it."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return reference(tensor).length
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    return int(np.prod(tensor.dims, dtype=np.int64)) * np_dtype(tensor.data_type).itemsize


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the main graph's initializers, external or not, without reading any."""
    return sum(tensor_bytes(tensor) for tensor in model.graph.initializer)


#: Memory a command needs beyond the weights it holds at once (activations, ONNX Runtime's arenas, Python).
HEADROOM = GIB // 2


_HALF_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


#: With half-precision weights cast where used, how many of the largest ones count as in fp32 at once: a node's
#: Cast runs right before it, and ORT may run the Casts of a few independent nodes (q/k/v, gate/up) back to back.
_CAST_AT_ONCE = 4


def session_copies(model: onnx.ModelProto, provider: str, *, at_run: bool = False) -> int:
    """Bytes a CPU session of `model` holds of its own whatever is shared: ONNX Runtime's CPU provider runs fp16 and
    bf16 MatMuls in fp32 and converts their weights once, at load, into fp32 initializers of twice the size (a 3.8
    GiB fp16 model takes 7.8 GiB in one session). An upper bound: every half-precision initializer counts.
    `at_run` (sessions with `RuntimeConfig.half_weights_at_run`): the weights are cast where used, so only the fp32
    copies of the few largest exist at once, while a run lasts."""
    if provider != "cpu":
        return 0
    sizes = sorted(tensor_bytes(tensor) for tensor in model.graph.initializer if tensor.data_type in _HALF_TYPES)
    return 2 * sum(sizes[-_CAST_AT_ONCE:] if at_run else sizes)


#: fp32 copies of half-precision weights (summed over a session) above which the parity gate and the bench keep
#: the weights in their type and cast them where used (`RuntimeConfig.half_weights_at_run`): past it the copies
#: alone are more than the 1 GiB of headroom the memory budget of issue 20 (1.5 W + 1 GiB) leaves.
HALF_COPIES_LIMIT = GIB


def half_weights_at_run(models: Sequence[onnx.ModelProto], provider: str) -> bool:
    """Whether sessions of `models` should cast their half-precision weights where used instead of holding fp32
    copies: on the CPU provider, when one model's copies pass HALF_COPIES_LIMIT."""
    return max((session_copies(model, provider) for model in models), default=0) > HALF_COPIES_LIMIT


def available_memory() -> int:
    """Bytes this process can still get: MemAvailable, or less where a cgroup limit says so (a container)."""
    available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


def check_memory(resident: int, what: str) -> None:
    """InputError, before anything is allocated, when `resident` bytes of weights plus HEADROOM do not fit in
    the memory available: one line with both numbers, instead of an OOM kill halfway through."""
    needed, available = resident + HEADROOM, available_memory()
    if needed > available:
        raise InputError(
            f"{what} needs about {needed / GIB:.1f} GiB of memory ({resident / GIB:.1f} GiB of weights resident at "
            f"once, {HEADROOM / GIB:.1f} GiB to run), but only {available / GIB:.1f} GiB is available"
        )


def same_bytes(a: ExternalRef, b: ExternalRef) -> bool:
    """Whether two external tensors hold the same bytes (read a chunk at a time: nothing stays resident)."""
    if a.length != b.length:
        return False
    if (a.file, a.offset) == (b.file, b.offset):
        return True
    with open(a.file, "rb") as fa, open(b.file, "rb") as fb:
        done = 0
        while done < a.length:
            size = min(_CHUNK, a.length - done)
            if os.pread(fa.fileno(), size, a.offset + done) != os.pread(fb.fileno(), size, b.offset + done):
                return False
            done += size
    return True


class SharedWeights:
    """Read-only memory maps of data files and OrtValues over them, made once and shared by every session that is
    given this object: a tensor at the same file and offset, or one registered as `alias` of another, is one
    OrtValue. Keep it alive as long as its sessions (each session also holds a reference)."""

    def __init__(self) -> None:
        self._maps: dict[str, mmap.mmap] = {}
        self._values: dict[ExternalRef, ort.OrtValue] = {}
        self._aliases: dict[ExternalRef, ExternalRef] = {}

    def alias(self, ref: ExternalRef, same_as: ExternalRef) -> None:
        """Serve `ref` with the OrtValue of `same_as` (the caller checked they hold the same bytes)."""
        self._aliases[ref] = same_as

    def value(self, tensor: onnx.TensorProto) -> ort.OrtValue:
        """The OrtValue of an external tensor: a view of the mapped file, or an aligned copy of its bytes when its
        offset is not a multiple of its element size (back-to-back tensors after an odd-sized one). WeightsError
        for a type whose bytes are not one numpy element per value (strings, 4-bit types)."""
        ref = reference(tensor)
        ref = self._aliases.get(ref, ref)
        if ref in self._values:
            return self._values[ref]
        count = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
        dtype = np_dtype(tensor.data_type) if tensor.data_type != onnx.TensorProto.STRING else None
        if dtype is None or count * dtype.itemsize != ref.length:
            raise WeightsError(f"external tensor {tensor.name!r}: its type cannot be handed to ONNX Runtime")
        if ref.file not in self._maps:
            with open(ref.file, "rb") as file:
                self._maps[ref.file] = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        data = np.frombuffer(self._maps[ref.file], np.uint8, ref.length, ref.offset)
        if ref.offset % dtype.itemsize:
            aligned = np.empty(count, dtype)
            aligned.view(np.uint8)[:] = data
            data = aligned.view(np.uint8)
        value = ort.OrtValue.ortvalue_from_numpy(data.view(dtype).reshape(tuple(tensor.dims)))
        self._values[ref] = value
        return value


#: Bytes of external tensors outside the main graph's initializers a session header may hold inline.
_INLINE_LIMIT = GIB


@contextlib.contextmanager
def session_file(model: onnx.ModelProto) -> Iterator[Path]:
    """A file of `model`'s header whose external locations name its data files relative to it, for the duration
    of the block (ORT refuses absolute locations, locations outside the model's folder and links that lead there).
    The header goes into a temporary directory with hard links to the data files; where the data lies on another
    file system it goes, under a hidden temporary name, into the folder of the data files. The data must be real:
    ORT still reads an overridden initializer where it folds constants. External tensors that are not handed over
    (in subgraphs, functions, attributes) are written into the header: ORT reads those itself, and refuses a data
    file with several hard links for them. `model` is left as it was."""
    files = sorted({reference(tensor).file for tensor in handed_over(model)})
    with tempfile.TemporaryDirectory(prefix="onnx_norm_session_") as tmp:
        names: dict[str, str] = {}
        try:
            for index, file in enumerate(files):
                names[file] = f"weights{index}.data"
                os.link(file, Path(tmp) / names[file])
            header = Path(tmp) / "model.onnx"
        except OSError:
            folders = {str(Path(file).parent) for file in files}
            if len(folders) != 1:
                raise WeightsError("the external data files are in several folders on another file system") from None
            names = {file: Path(file).name for file in files}
            header = Path(folders.pop()) / f".onnx_norm_{os.getpid()}_{id(model)}.onnx"
        _write_header(model, header, names)
        try:
            yield header
        finally:
            header.unlink(missing_ok=True)


def _write_header(model: onnx.ModelProto, header: Path, names: dict[str, str]) -> None:
    """Writes `model` to `header` with its handed-over tensors located by `names` and its other external tensors
    inline; `model` is restored after."""
    inner = model_io.external_tensors(model, initializers=False)
    if sum(reference(tensor).length for tensor in inner) > _INLINE_LIMIT:
        raise WeightsError(
            f"the model's external tensors in subgraphs or functions take more than {_INLINE_LIMIT / GIB:.0f} GiB"
        )
    saved: list[tuple[onnx.TensorProto, onnx.TensorProto]] = []
    try:
        for tensor in [*handed_over(model), *inner]:
            backup = onnx.TensorProto()
            backup.CopyFrom(tensor)
            saved.append((tensor, backup))
        for tensor in handed_over(model):
            _set_location(tensor, names[reference(tensor).file])
        for tensor in inner:
            ref = reference(tensor)
            with open(ref.file, "rb") as file:
                tensor.raw_data = os.pread(file.fileno(), ref.length, ref.offset)
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
        header.write_bytes(model.SerializeToString())
    finally:
        for tensor, backup in saved:
            tensor.CopyFrom(backup)


def add_initializers(options: ort.SessionOptions, model: onnx.ModelProto, shared: SharedWeights) -> list[object]:
    """Hands every external tensor of `model` to `options` from `shared`; returns the OrtValues (the session
    must hold them). Pre-packing is turned off: it would copy the shared weights per session."""
    values = []
    for tensor in handed_over(model):
        values.append(shared.value(tensor))
        options.add_initializer(tensor.name, values[-1])
    options.add_session_config_entry("session.disable_prepacking", "1")
    return values


def has_external_data(model: onnx.ModelProto) -> bool:
    """Whether any tensor of `model` (subgraphs, functions and attributes included) is external."""
    return bool(model_io.external_tensors(model))
