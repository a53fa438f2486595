"""Loading and saving models, and what a model holds: the one home for both.

- Loading: `load` gives an `onnx_ir.Model` (the rewrite's kind), `load_proto` a ModelProto (the parity gate's and
  the bench's kind: external tensors as references, never read), `read_file` a `ModelFile` (a file's ModelProto
  read and checked once, with its path) that both accept without reading the file again. A path, an
  `onnx.ModelProto`, an `onnx_ir.Model` or a `ModelFile` in; `like` gives the result as the kind given.
- Paths are loaded with onnx-ir, which memory-maps external data instead of pulling every weight into one protobuf.
- Saving is atomic (everything is written next to the destination, then renamed into place) and switches to
  external data, with a path relative to the model, when the model already used it or its tensors would not fit in
  the 2 GB protobuf limit.
- Traversal: every node (`proto_nodes`, `graph_nodes`, `subgraphs`), every tensor (`named_tensors`,
  `external_tensors`), the files behind a model (`model_files`).
- External data: checked before anything reads it (`check_external_data`), its locations made absolute for sessions
  (`resolve_external_data`; the sessions' memory maps are `onnx_norm.weights`').
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import onnx
import onnx_ir as ir

from onnx_norm import inline_weights
from onnx_norm.dtypes import is_onnx_domain, onnx_opset
from onnx_norm.errors import InputError, ort_message
from onnx_norm.ops.schema import native_ops

logger = logging.getLogger(__name__)


#: Above this many bytes of tensors a model is saved with external data (protobuf's hard limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
#: Protobuf refuses to serialize a message of 2 GiB or more: a model saved without external data must fit.
PROTOBUF_LIMIT = 2**31 - 1
#: With external data (auto), tensors of at most this many bytes (scalars, shapes) stay in the model file.
INLINE_BYTES = 256


@dataclasses.dataclass(frozen=True)
class ModelFile:
    """A model file read once (`read_file`): its ModelProto, checked and sorted, external tensors as references
    relative to `path`'s folder, and the path (sessions made from it load the file as users do). `load` and
    `load_proto` take it without reading the file again: a command that rewrites a model and then verifies it reads
    the model once."""

    path: pathlib.Path
    proto: onnx.ModelProto

    def __str__(self) -> str:  # how messages name it: as the path it was read from
        return str(self.path)


ModelLike = str | os.PathLike | onnx.ModelProto | ir.Model | ModelFile


class ModelLoadError(Exception):
    """The model cannot be read: missing, unreadable, not ONNX, or broken."""


class ModelSaveError(Exception):
    """The model cannot be written where asked."""


def load(model: ModelLike) -> ir.Model:
    """An `ir.Model` for any accepted kind of input (an `ir.Model` is returned as is). A path or a ModelProto must
    pass `check` (ONNX's checker), so that a broken model is refused here and not "optimized" into another."""
    if isinstance(model, ir.Model):
        _check_ir_external_data(model)
        return model
    if isinstance(model, onnx.ModelProto):
        check(model, "the ModelProto")
        check_external_data(model, where="the ModelProto")  # relative to the working directory, as onnx-ir reads it
        try:
            return _sorted_ir(_import_ort_domains_ir(ir.serde.deserialize_model(model)))
        except Exception as err:
            raise ModelLoadError(f"cannot convert the ModelProto: {err}") from err
    if isinstance(model, (str, os.PathLike)):
        model = read_file(model)
    if isinstance(model, ModelFile):
        return _ir_of_file(model)
    raise TypeError(f"expected a path, an onnx.ModelProto or an onnx_ir.Model, got {type(model).__name__}")


def _ir_of_file(model: ModelFile) -> ir.Model:
    """The `ir.Model` of a file's ModelProto. Its tensors are views of the proto's (onnx-ir copies none), so the
    proto serves the parity gate after the rewrite: the rewrite builds new tensors, never changes these."""
    try:
        loaded = ir.serde.deserialize_model(model.proto)
    except Exception as err:
        raise ModelLoadError(f"{model.path}: not a readable ONNX model ({type(err).__name__}: {err})") from err
    # As ir.load does: external tensors are memory-mapped from files relative to the model.
    ir.external_data.set_base_dir(loaded.graph, model.path.parent)
    _read_hard_links_as_ort(loaded)
    return _import_ort_domains_ir(loaded)  # read_proto sorted its nodes already


def read_file(path: str | os.PathLike, *, checked: bool = True) -> ModelFile:
    """The model file at `path`, read once (`read_proto`: ModelLoadError naming the file when it cannot be used)."""
    path = pathlib.Path(path)
    return ModelFile(path, read_proto(path, checked=checked))


def load_proto(model: object, *, resolve_external: bool = False, checked: bool = True) -> onnx.ModelProto:
    """A ModelProto from a path, a `ModelFile`, a ModelProto or an onnx_ir.Model (the parity gate's and the
    bench's loader); InputError for a file that is missing, unreadable, not ONNX, or (when `checked`) refused by
    ONNX's checker (`check`; a ModelFile was checked when it was read).

    External tensors are never read. With `resolve_external` their locations are made absolute (relative to the
    model's file; to the working directory for a ModelProto) and their files checked (InputError when one is
    missing or short), so that sessions can hand them to ONNX Runtime (onnx_norm.weights). A ModelProto given with
    external tensors is then copied, not changed; a ModelFile's proto is resolved in place (it is the loader's own,
    and the `ir.Model` made from it keeps its own locations)."""
    base: str | os.PathLike = "."
    try:
        if isinstance(model, onnx.ModelProto):
            if checked:
                check(model, "the ModelProto")
            proto, where = model, "the ModelProto"
        elif isinstance(model, ModelFile):
            proto, where, base = model.proto, str(model.path), model.path.parent
        elif isinstance(model, ir.Model):
            proto, where = serialize_ir(model), "the model"
        elif isinstance(model, (str, os.PathLike)):
            path = pathlib.Path(model)
            proto, where, base = read_proto(path, checked=checked), str(path), path.parent
        else:
            raise TypeError(f"expected a path, onnx.ModelProto or onnx_ir.Model, got {type(model).__name__}")
        if resolve_external:
            if proto is model and external_tensors(proto):
                proto = _copy(proto)  # the caller's proto keeps its locations (its large tensors are external)
            resolve_external_data(proto, base, where=where)
    except ModelLoadError as err:
        raise InputError(str(err)) from None
    return proto


def resolve_external_data(
    model: onnx.ModelProto, base_dir: str | os.PathLike, *, where: str = "the model"
) -> onnx.ModelProto:
    """Makes the locations of `model`'s external tensors absolute (relative to `base_dir`) after checking that each
    file holds the tensor's bytes (`check_external_data`; ModelLoadError naming the file and the tensor otherwise),
    so that the proto no longer depends on where it was read from. Returns `model` (changed in place)."""
    check_external_data(model, base_dir=base_dir, where=where)
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = os.path.abspath(os.path.join(base_dir, entry.value))
    return model


def serialize_ir(model: ir.Model) -> onnx.ModelProto:
    """The ModelProto of an onnx_ir.Model, its external tensors (subgraphs included) as references with absolute
    locations (each ExternalTensor knows the folder it was read from)."""
    proto = ir.serde.serialize_model(model)
    external = [
        value.const_value
        for graph in model.graphs()
        for value in graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor)
    ]
    files = {tensor.location: os.path.abspath(os.path.join(tensor.base_dir, tensor.location)) for tensor in external}
    for tensor in external_tensors(proto):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value in files:
                entry.value = files[entry.value]
    return proto


#: Files from this size on are read by `inline_weights.read_model`: below it the file's bytes cost little.
INLINE_READER_FROM = 64 << 20


def read_proto(path: str | os.PathLike, *, checked: bool = True) -> onnx.ModelProto:
    """The ModelProto in a file, without its external data, checked with `check` (unless `checked` is False);
    ModelLoadError with one line naming the file when it is missing, not a file, empty, truncated, not ONNX, or
    not a valid model, or when its external data cannot be read (`check_external_data`: before anything reads it)."""
    path = pathlib.Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, not an ONNX model")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"{path}: permission denied")
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{path}: empty file, not an ONNX model")
    try:
        if path.stat().st_size >= INLINE_READER_FROM:
            proto = inline_weights.read_model(path)  # inline weights: 1 W while loading instead of 2 W
        else:
            proto = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # protobuf's DecodeError, OSError, ...: all mean "not a model we can read"
        raise ModelLoadError(f"{path}: not a readable ONNX model ({type(err).__name__}: {_one_line(err)})") from err
    if not proto.ir_version or not proto.HasField("graph"):
        raise ModelLoadError(f"{path}: not an ONNX model (no ir_version or no graph)")
    sort_proto(proto)  # ONNX Runtime sorts on load; so does every reader of this copy
    check_external_data(proto, model_file=path)
    if checked:
        check(proto, str(path))
    return proto


#: Ops ONNX Runtime registers in the ONNX domain although ONNX does not define them there (or not at the model's
#: opset): models that use them run, so the checker is not asked about them. They are the op records' native ops
#: with ONNX Runtime's contrib semantics (not `single_type`) in the ONNX domain.
ORT_ONNX_DOMAIN_OPS = frozenset(
    native.op_type for _, native in native_ops() if not native.single_type and is_onnx_domain(native.domain)
)
_UNCHECKED_DOMAIN = "onnx_norm.unchecked"
# Domains ONNX Runtime registers itself, each at version 1 only: it loads a model whose nodes use one without
# importing it (its transformers optimizer writes such models), so `load` imports them instead of refusing the
# model, and onnx's checker and shape inference then read the model as ONNX Runtime does.
ORT_DOMAINS = frozenset({"com.microsoft", "com.microsoft.nchwc", "com.microsoft.experimental"})
ORT_DOMAIN_VERSION = 1


def check(model: onnx.ModelProto, name: str) -> None:
    """ONNX's checker on `model` (without shape inference); ModelLoadError with its message on one line.

    Relaxed where ONNX Runtime runs what the checker refuses: ONNX Runtime's own ops in the ONNX domain
    (ORT_ONNX_DOMAIN_OPS) are checked as custom ops, inputs and outputs may lack a shape. External data is
    not read: the checker would look for it relative to the working directory, so a copy with a one-element
    stand-in for each external tensor is checked (the files themselves are checked when the model is loaded).
    A model too large for one protobuf is not checked (the checker cannot serialize it)."""
    if not model.ir_version or not model.HasField("graph"):
        raise ModelLoadError(f"{name}: not an ONNX model (no ir_version or no graph)")
    target = _without_large_initializers(model) or model
    if target.ByteSize() > PROTOBUF_LIMIT:  # (upb computes it by serialising: asked of the light copy)
        logger.debug("%s: too large for onnx.checker in memory; not checked", name)
        return
    if external_tensors(target):
        if target is model:
            target = onnx.ModelProto()
            target.CopyFrom(model)
        for tensor in external_tensors(target):
            _stand_in(tensor)
    target = _as_ort_reads(target, copied=target is not model)
    moved = _hide_ort_ops(target)
    imported = _import_ort_domains(target)
    # A graph input or output of unknown rank (no shape field) is valid ONNX and runs, but the checker wants the
    # field: it gets an empty one for the check.
    shapeless = [
        value.type.tensor_type
        for value in [*target.graph.input, *target.graph.output]
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape")
    ]
    for tensor_type in shapeless:
        tensor_type.shape.SetInParent()
    try:
        onnx.checker.check_model(target)
    except (onnx.checker.ValidationError, ValueError) as err:
        _refuse_unless_ort_loads(model, name, err)
    finally:
        for tensor_type in shapeless:
            tensor_type.ClearField("shape")
        for node, domain in moved:
            node.domain = domain
        if moved:
            _drop_opset(target, _UNCHECKED_DOMAIN)
        for imports, opset in imported:
            imports.remove(opset)


# What ONNX Runtime loads although onnx's checker refuses it: nodes out of topological order (ORT sorts them on
# load, and its own fusion-test generators append nodes after their consumers), graph outputs and value_info
# without a type (ORT infers them). Anything else the checker refuses is asked of ORT itself before refusing.


def sort_proto(model: onnx.ModelProto) -> bool:
    """Sorts the nodes of every graph of `model` (subgraphs and functions too) topologically, in place, as ONNX
    Runtime does on load; a sorted graph keeps its order, and a cycle is left for the checker to name. Returns
    whether any node moved."""
    moved = False
    for nodes in _node_lists(model):
        order = _topological_order(nodes)
        if order is not None:
            reordered = [nodes[i] for i in order]
            del nodes[:]
            nodes.extend(reordered)
            moved = True
    return moved


def _node_lists(model: onnx.ModelProto) -> Iterator[Any]:
    """The node list of the main graph, of every subgraph and of every model-local function. Lazily: sorting a list
    copies its nodes, so a subgraph is reached through its graph's nodes only after that graph was sorted."""
    yield from (graph.node for graph in _graphs(model))
    yield from (function.node for function in model.functions)


def _graphs(model: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """The main graph and every subgraph (of If/Loop/Scan nodes, in the main graph or in functions)."""
    yield model.graph
    for node in proto_nodes(model):
        yield from subgraphs(node)


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs a node holds in its attributes (If's branches, Loop's and Scan's bodies)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from the scopes around it (ONNX subgraphs see outer values without declaring them)."""
    local = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    local |= {name for node in graph.node for name in node.output}
    used = {name for node in graph.node for name in node.input if name}
    for node in graph.node:
        for sub in subgraphs(node):
            used |= outer_names(sub)
    return used - local


def _reads(node: onnx.NodeProto) -> set[str]:
    """The names a node reads: its inputs, and every name its subgraphs read (outer-scope values among them)."""
    names = {name for name in node.input if name}
    for sub in subgraphs(node):
        for inner in graph_nodes(sub):
            names.update(name for name in inner.input if name)
    return names


def topological_nodes(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` in a stable topological order (as they are when already in order, or when they form a cycle)."""
    order = _topological_order(nodes)
    return list(nodes) if order is None else [nodes[i] for i in order]


def _topological_order(nodes: Any) -> list[int] | None:
    """A stable topological order of `nodes` (Kahn's, lowest index first), or None when they are already in order
    or form a cycle."""
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    needs = [{producer[n] for n in _reads(node) if producer.get(n, i) != i} for i, node in enumerate(nodes)]
    if all(j < i for i, need in enumerate(needs) for j in need):
        return None
    waiting = [len(need) for need in needs]
    dependents: dict[int, list[int]] = {}
    for i, need in enumerate(needs):
        for j in need:
            dependents.setdefault(j, []).append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in dependents.get(i, ()):
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, k)
    return order if len(order) == len(nodes) else None


def _typeless(value: onnx.ValueInfoProto) -> bool:
    return value.type.WhichOneof("value") is None


def _untyped_values(model: onnx.ModelProto) -> bool:
    return any(_typeless(v) for graph in _graphs(model) for v in [*graph.output, *graph.value_info]) or any(
        _typeless(v) for function in model.functions for v in function.value_info
    )


def _as_ort_reads(model: onnx.ModelProto, *, copied: bool) -> onnx.ModelProto:
    """`model` for the checker as ONNX Runtime reads it: nodes sorted, value_info without a type dropped, graph
    outputs without a type given an undefined tensor type. A copy when anything changes (`copied`: `model` is
    already one)."""
    unsorted = any(_topological_order(nodes) is not None for nodes in _node_lists(model))
    if not unsorted and not _untyped_values(model):
        return model
    if not copied:
        model = _copy(model)
    sort_proto(model)
    graphs = list(_graphs(model))
    for owner in [*graphs, *model.functions]:
        for value in [v for v in owner.value_info if _typeless(v)]:
            owner.value_info.remove(value)
    for graph in graphs:
        for value in graph.output:
            if _typeless(value):
                value.type.tensor_type.elem_type = onnx.TensorProto.UNDEFINED
    return model


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _refuse_unless_ort_loads(model: onnx.ModelProto, name: str, err: BaseException) -> None:
    """Raises ModelLoadError for a model the checker refused (`err`) unless ONNX Runtime loads it; the line says
    whether ORT refuses it too. A model with external data is not asked (its weights are not in `model`)."""
    message = f"{name}: not a valid ONNX model: {_one_line(err)}"
    if external_tensors(model):
        raise ModelLoadError(message) from err
    refusal = _ort_refusal(model)
    if refusal is not None:
        raise ModelLoadError(f"{message} (ONNX Runtime refuses it too: {refusal})") from err
    logger.warning("%s: onnx's checker refuses the model (%s), but ONNX Runtime loads it", name, _one_line(err))


def _ort_refusal(model: onnx.ModelProto) -> str | None:
    """Why ONNX Runtime refuses to load `model` (no optimisation, our library registered when built), or None."""
    import onnxruntime as ort

    from onnx_norm import library

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    if library.library_available():
        options = library.session_options(options)
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # ORT's Fail/InvalidGraph/InvalidArgument share no base class
        return ort_message(err)
    return None


def _sorted_ir(model: ir.Model) -> ir.Model:
    """`model` with its graphs and functions in topological order (`sort_proto`, on a model given as a ModelProto,
    which the checker saw sorted in a copy); one already in order is left as it is."""
    for owner in [model.graph, *model.functions.values()]:
        seen: set[ir.Node] = set()
        for node in ir.traversal.RecursiveGraphIterator(owner):
            producers = [value.producer() for value in node.inputs if value is not None]
            if any(p is not None and p.graph is node.graph and p not in seen for p in producers):
                logger.info("nodes out of topological order (ONNX Runtime sorts them on load): sorted")
                owner.sort()
                break
            seen.add(node)
    return model


#: Main-graph initializers from this size on are checked as stand-ins (the checker gets a serialised copy of the
#: model: a 1 GiB model would be held three times).
STAND_IN_BYTES = 1 << 20


def _copy_fields(source: Any, target: Any, skip: str) -> None:
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _without_large_initializers(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of `model` for the checker with the main graph's large inline initializers as stand-ins (their data
    is not copied), or None when it has none."""
    if not any(len(tensor.raw_data) >= STAND_IN_BYTES for tensor in model.graph.initializer):
        return None
    target = onnx.ModelProto()
    _copy_fields(model, target, "graph")
    _copy_fields(model.graph, target.graph, "initializer")
    for tensor in model.graph.initializer:
        if len(tensor.raw_data) < STAND_IN_BYTES:
            target.graph.initializer.append(tensor)
            continue
        stand_in = target.graph.initializer.add(name=tensor.name, data_type=tensor.data_type)
        stand_in.raw_data = bytes(max(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize, 1))
    return target


def _stand_in(tensor: onnx.TensorProto) -> None:
    """Turns an external tensor into an inline scalar of its type, for the checker only."""
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]
    del tensor.dims[:]
    tensor.raw_data = bytes(max(itemsize, 1))


def _hide_ort_ops(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    """Moves ONNX Runtime's ONNX-domain ops that ONNX lacks at the model's opset into a custom domain (the checker
    skips those); returns what to move back."""
    opset = onnx_opset({o.domain: o.version for o in model.opset_import}) or 0
    moved = []
    for node in proto_nodes(model):
        if not is_onnx_domain(node.domain) or node.op_type not in ORT_ONNX_DOMAIN_OPS:
            continue
        try:
            onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            moved.append((node, node.domain))
            node.domain = _UNCHECKED_DOMAIN
    if moved:
        model.opset_import.append(onnx.helper.make_opsetid(_UNCHECKED_DOMAIN, 1))
        for function in model.functions:
            function.opset_import.append(onnx.helper.make_opsetid(_UNCHECKED_DOMAIN, 1))
    return moved


def _unimported_ort_domains(node_domains: Iterable[str], imported: Iterable[str]) -> list[str]:
    """The ONNX Runtime domains (ORT_DOMAINS) among `node_domains` that `imported` lacks: the one rule behind
    `_import_ort_domains` (on the ModelProto, for the checker) and `_import_ort_domains_ir` (on the loaded model)."""
    return sorted({domain for domain in node_domains if domain in ORT_DOMAINS} - set(imported))


def _import_ort_domains(model: onnx.ModelProto) -> list[tuple[Any, onnx.OperatorSetIdProto]]:
    """Adds an import (ORT_DOMAIN_VERSION) of each ONNX Runtime domain that the graph or a function uses without
    one; returns what was added, to take out after the check."""
    added = []
    bodies = [(model.opset_import, graph_nodes(model.graph)), *((f.opset_import, f.node) for f in model.functions)]
    for imports, nodes in bodies:
        for domain in _unimported_ort_domains((n.domain for n in nodes), (o.domain for o in imports)):
            imports.append(onnx.helper.make_opsetid(domain, ORT_DOMAIN_VERSION))
            added.append((imports, imports[-1]))
    return added


def _import_ort_domains_ir(model: ir.Model) -> ir.Model:
    """`model` with an import (ORT_DOMAIN_VERSION) of each ONNX Runtime domain its nodes use without one."""
    bodies: list[tuple[Any, Iterable[ir.Node]]] = [(model, ir.traversal.RecursiveGraphIterator(model.graph))]
    bodies += [(function, function) for function in model.functions.values()]
    for owner, nodes in bodies:
        for domain in _unimported_ort_domains((node.domain for node in nodes), owner.opset_imports):
            logger.info("the model uses %s without importing it: imported at version %d", domain, ORT_DOMAIN_VERSION)
            owner.opset_imports[domain] = ORT_DOMAIN_VERSION
    return model


def _drop_opset(model: onnx.ModelProto, domain: str) -> None:
    for imports in [model.opset_import, *(f.opset_import for f in model.functions)]:
        for opset in [o for o in imports if o.domain == domain]:
            imports.remove(opset)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def check_external_data(
    model: onnx.ModelProto,
    *,
    model_file: str | os.PathLike | None = None,
    base_dir: str | os.PathLike = ".",
    where: str | None = None,
) -> None:
    """ModelLoadError, in one line naming the data file and the tensor, unless every external tensor of `model`
    (subgraphs, functions and node attributes included) can be read: its file exists, and its offset and length
    (or, without a length, the bytes its type and shape take) lie within it. Nothing is read: ONNX Runtime, onnx-ir
    and the rewrite's constant folding read the bytes later and would fail there, with a traceback or a message
    naming neither. The one check every loader runs (`read_proto`, `load`, `resolve_external_data`).

    With `model_file` the locations are relative to its folder and held to ONNX Runtime's rules for a model read
    from a file (which onnx and onnx-ir share): not absolute, not outside the folder, not through a symbolic link
    that leads out of it. Without, they are relative to `base_dir` (absolute ones are taken as they are: a
    ModelProto in memory, whose sessions get their data through `weights`)."""
    if model_file is not None:
        model_file = pathlib.Path(model_file)
        base_dir = model_file.parent
    where = where or (str(model_file) if model_file is not None else "the model")
    sizes: dict[str, int] = {}
    for label, tensor in named_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            expected = _expected_bytes(tensor.data_type, tensor.dims)
            _check_tensor(Where(where, label, base_dir, model_file), info, expected, sizes)


@dataclasses.dataclass(frozen=True)
class Where:
    """An external tensor for `check_external_data`'s messages: the model (as shown), the tensor's label, the
    folder its location is relative to and, for a model read from a file, that file."""

    model: str
    label: str
    base_dir: str | os.PathLike
    model_file: pathlib.Path | None = None


def _check_tensor(where: Where, info: dict[str, str], expected: int | None, sizes: dict[str, int]) -> None:
    """One external tensor (`info`: its external_data entries; `expected`: the bytes its type and shape take, if
    known); `sizes` caches the sizes of the data files seen."""
    head = f"{where.model}: cannot read its external data"
    location = info.get("location", "")
    if not location:
        raise ModelLoadError(f"{head}: {where.label} names no file (no 'location')")
    file = os.path.join(where.base_dir, location)
    prefix = f"{head}: {location!r} of {where.label}"
    if where.model_file is not None:
        _check_location(location, file, where.model_file, prefix)
    if file not in sizes:
        sizes[file] = _data_file_size(file, prefix, where.model_file)
    offset, length = _offset_and_length(f"{head}: {where.label} in {location!r}", info, expected)
    size = sizes[file]
    if offset > size or (length is not None and length > 0 and offset + length > size):
        empty = " (an empty file)" if size == 0 else ""
        needs = f"needs bytes {offset} to {offset + length}" if length is not None else f"starts at byte {offset}"
        raise ModelLoadError(f"{head}: {location!r} holds {size} bytes{empty}, {where.label} {needs}")


def _offset_and_length(where: str, info: dict[str, str], expected: int | None) -> tuple[int, int | None]:
    """The offset and length of an external tensor: byte counts >= 0, the length the one its type and shape take
    (ONNX Runtime refuses any other: "external data size mismatch"), that one where none is given (as ONNX Runtime
    and onnx-ir read it)."""
    values = {}
    for key in ("offset", "length"):
        try:
            values[key] = int(info[key]) if key in info else None
        except ValueError:
            values[key] = -1
        if values[key] is not None and values[key] < 0:
            raise ModelLoadError(f"{where} has {key} {info[key]!r}; it must be a byte count >= 0")
    length = values["length"]
    if length is not None and expected is not None and length != expected:
        raise ModelLoadError(f"{where} has length {length}, but its type and shape take {expected} bytes")
    return values["offset"] or 0, expected if length is None else length


def _expected_bytes(data_type: int, dims: Iterable[int]) -> int | None:
    """Bytes a tensor of this type and shape takes (4-bit types packed two to a byte); None where it is not
    fixed (strings) or not known."""
    try:
        bits = ir.DataType(data_type).bitwidth
    except (ValueError, TypeError):  # STRING, UNDEFINED, a type this onnx-ir does not know
        return None
    count = 1
    for dim in dims:
        count *= dim
    return (count * bits + 7) // 8


def _check_location(location: str, file: str, model_file: pathlib.Path, prefix: str) -> None:
    """ONNX Runtime's rules for the data of a model read from a file: a relative location that stays inside the
    model's folder, also once symbolic links are followed."""
    refused = "which ONNX Runtime and onnx refuse"
    if os.path.isabs(location):
        raise ModelLoadError(f"{prefix} is an absolute path, {refused}: give it relative to the model's folder")
    folder = os.path.abspath(model_file.parent)
    if os.path.commonpath([os.path.normpath(os.path.abspath(file)), folder]) != folder:
        raise ModelLoadError(
            f"{prefix} is outside the model's folder ({os.path.normpath(os.path.abspath(file))}), {refused}: "
            "move the data file into the model's folder"
        )
    if not os.path.lexists(file):
        return  # named as missing by `_data_file_size`
    real, real_folder = os.path.realpath(file), os.path.realpath(model_file.parent)
    if os.path.commonpath([real, real_folder]) != real_folder:
        raise ModelLoadError(
            f"{prefix} is a symbolic link to {real}, outside the model's folder, {refused}: copy the data file into "
            "the model's folder"
        )


def _data_file_size(file: str, prefix: str, model_file: pathlib.Path | None) -> int:
    """The size of an external data file; ModelLoadError when it is missing, not a file or unreadable."""
    if not os.path.exists(file):
        if model_file is None:
            raise ModelLoadError(f"{prefix} is missing (looked for at {os.path.abspath(file)})")
        link = model_file.is_symlink()
        beside = f"; the model file is a symbolic link to {os.path.realpath(model_file)}" if link else ""
        raise ModelLoadError(f"{prefix} is missing (looked for beside {model_file}{beside})")
    if not os.path.isfile(file):
        raise ModelLoadError(f"{prefix} is not a file")
    if not os.access(file, os.R_OK):
        raise ModelLoadError(f"{prefix}: permission denied")
    return os.stat(file).st_size


def _check_ir_external_data(model: ir.Model) -> None:
    """`check_external_data` for the external tensors of an `ir.Model` given as it is (read by onnx-ir, or built
    by a program): each knows its folder, location, offset and length."""
    sizes: dict[str, int] = {}
    for label, tensor in _external_ir_tensors(model):
        info = {"location": tensor.location, "offset": str(tensor.offset)}
        if tensor.length is not None:
            info["length"] = str(tensor.length)
        try:
            expected: int | None = tensor.nbytes
        except Exception:  # a type without a fixed size (onnx-ir raises for strings)
            expected = None
        _check_tensor(Where("the model", label, tensor.base_dir), info, expected, sizes)


def _external_ir_tensors(model: ir.Model) -> Iterator[tuple[str, ir.ExternalTensor]]:
    for value in _initializers(model):
        if isinstance(value.const_value, ir.ExternalTensor):
            yield repr(value.name), value.const_value
    for owner in [model.graph, *model.functions.values()]:
        for node in ir.traversal.RecursiveGraphIterator(owner):
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                    label = f"attribute {attr.name!r} of {node.op_type} node {node.name!r}"
                    yield f"{attr.value.name!r} ({label})" if attr.value.name else f"the {label}", attr.value


def _read_hard_links_as_ort(model: ir.Model) -> None:
    """A hard-linked data file is read as ONNX Runtime reads it: onnx-ir refuses one inside a model's folder, so
    such a tensor is re-made with its absolute path (no folder to contain)."""
    for value in _initializers(model):
        tensor = value.const_value
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        real = os.path.realpath(pathlib.Path(tensor.base_dir) / tensor.location)
        if os.stat(real).st_nlink > 1:
            value.const_value = ir.ExternalTensor(
                real, tensor.offset, tensor.length, tensor.dtype, shape=tensor.shape, name=tensor.name
            )


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
    return any(isinstance(value.const_value, ir.ExternalTensor) for value in _initializers(model))


def _initializers(model: ir.Model) -> Iterator[ir.Value]:
    for graph in model.graphs():
        yield from graph.initializers.values()


def data_file(path: str | os.PathLike) -> pathlib.Path:
    """The external data file `save` writes next to `path` (`<name>.data`) when it writes one."""
    path = pathlib.Path(path)
    return path.parent / f"{path.name}.data"


def _in_memory(tensor: ir.ExternalTensor) -> ir.Tensor:
    """A copy of an external tensor in memory. The file stays mapped: arrays taken from it may still be alive
    (closing the map under them is onnx-ir's `BufferError: cannot close exported pointers exist`)."""
    try:
        array = tensor.numpy().copy()
    except (OSError, ValueError) as err:
        raise ModelSaveError(f"cannot read the external data of {tensor.name!r} ({tensor.location}): {err}") from err
    return ir.Tensor(array, name=tensor.name, dtype=tensor.dtype)


@contextlib.contextmanager
def _inlined(model: ir.Model, max_bytes: int | None) -> Iterator[None]:
    """Within the block, external tensors of at most `max_bytes` (all for None) are in-memory copies, and so are
    external tensors in attributes (onnx-ir's save moves only initializers); the model is restored afterwards."""
    restore: list[tuple[ir.Value | tuple[ir.Node, str], object]] = []
    try:
        for value in _initializers(model):
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and (max_bytes is None or tensor.nbytes <= max_bytes):
                restore.append((value, tensor))
                value.const_value = _in_memory(tensor)
        graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
        for graph in graphs:
            for node in ir.traversal.RecursiveGraphIterator(graph):
                for name, attr in list(node.attributes.items()):
                    if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                        restore.append(((node, name), attr))
                        node.attributes[name] = ir.AttrTensor(name, _in_memory(attr.value))
        yield
    finally:
        for owner, original in reversed(restore):
            if isinstance(owner, ir.Value):
                owner.const_value = original  # type: ignore[assignment]
            else:
                node, name = owner
                node.attributes[name] = original  # type: ignore[assignment]


def save(
    model: ModelLike,
    path: str | os.PathLike,
    *,
    external_data: bool | None = None,
    data_name: str | None = None,
    shown_as: str | os.PathLike | None = None,
) -> None:
    """Writes `model` (an `ir.Model`, a ModelProto, or a path to copy) to `path` atomically.

    `external_data`: None (auto) writes the tensors above INLINE_BYTES to `<name>.data` (relative to the model;
    `data_name` names another file beside it) when the model already used external data or its tensors exceed
    EXTERNAL_DATA_THRESHOLD; True writes every non-empty tensor there; False writes every tensor inline, and refuses
    a model whose tensors cannot fit in one protobuf. The model passed in is not modified, and its external data is
    never written over in place. A failure is a ModelSaveError naming `shown_as` (a caller saving into a staging
    folder of its own names the output the user asked for), else `path`.
    """
    ir_model = model if isinstance(model, ir.Model) else load(model)
    path = pathlib.Path(path)
    shown = path if shown_as is None else shown_as
    directory = path.parent if str(path.parent) else pathlib.Path(".")
    if not directory.is_dir():
        raise ModelSaveError(f"{shown}: directory {directory} does not exist")
    if path.is_dir():
        raise ModelSaveError(f"{shown}: is a directory")
    total = tensor_bytes(ir_model)
    threshold = 0 if external_data else INLINE_BYTES
    if external_data is None:
        external_data = _uses_external_data(ir_model) or total > EXTERNAL_DATA_THRESHOLD
    if not external_data and total > PROTOBUF_LIMIT:
        raise ModelSaveError(
            f"{shown}: the tensors take {total / 2**30:.2f} GiB, more than one protobuf can hold (2 GiB); "
            "save them as external data"
        )
    data_name = data_name or data_file(path).name
    try:
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=directory))
    except OSError as err:
        raise ModelSaveError(f"{shown}: cannot write in {directory}: {err.strerror or err}") from err
    try:
        staged = staging / path.name
        with _inlined(ir_model, threshold if external_data else None):
            if external_data:
                if total > EXTERNAL_DATA_THRESHOLD:
                    logger.info("saving %s with external data %s (tensors exceed the protobuf limit)", shown, data_name)
                ir.save(ir_model, staged, external_data=data_name, size_threshold_bytes=threshold)
            else:
                _save_inline(ir_model, staged)
        staged_data = staging / data_name
        if staged_data.exists() and staged_data.stat().st_size == 0:
            staged_data.unlink()  # nothing went external: no empty data file beside the model
        if staged_data.exists():
            os.replace(staged_data, directory / data_name)
        os.replace(staged, path)
    except OSError as err:
        raise ModelSaveError(f"{shown}: cannot write: {err.strerror or err}") from err
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
        for sub in subgraphs(node):
            yield from graph_nodes(sub)


def _tensors(
    graph: onnx.GraphProto, where: str = "", *, initializers: bool = True
) -> Iterator[tuple[str, onnx.TensorProto]]:
    """(label, tensor) for every tensor of `graph` and its subgraphs (without `graph`'s own initializers when
    `initializers` is false); `where` ends the labels of a subgraph's."""
    if initializers:
        for tensor in graph.initializer:
            yield f"{tensor.name!r}{where}", tensor
    for sparse in graph.sparse_initializer:
        yield f"the values of sparse initializer {sparse.values.name!r}{where}", sparse.values
        yield f"the indices of sparse initializer {sparse.values.name!r}{where}", sparse.indices
    for node in graph.node:
        yield from _attribute_tensors(node)


def _attribute_tensors(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    # A Constant's tensor often has no name of its own: the node names it.
    owner = f"{node.op_type} node {node.name or (node.output[0] if node.output else '')!r}"
    for attr in node.attribute:
        label = f"attribute {attr.name!r} of {owner}"
        if attr.HasField("t"):
            yield (f"{attr.t.name!r} ({label})" if attr.t.name else f"the {label}"), attr.t
        for tensor in attr.tensors:
            yield (f"{tensor.name!r} ({label})" if tensor.name else f"a tensor of {label}"), tensor
        if attr.HasField("g"):
            yield from _tensors(attr.g, f" (in the {attr.name!r} subgraph of {owner})")
        for sub in attr.graphs:
            yield from _tensors(sub, f" (in a {attr.name!r} subgraph of {owner})")


def named_tensors(model: onnx.ModelProto, *, initializers: bool = True) -> Iterator[tuple[str, onnx.TensorProto]]:
    """(label, tensor) for every TensorProto of a model: initializers, sparse ones, attributes, in subgraphs and
    functions (without the main graph's initializers when `initializers` is false). The label names the tensor for
    a message: its name, and the node and attribute that hold it."""
    yield from _tensors(model.graph, initializers=initializers)
    for function in model.functions:
        for node in function.node:
            for label, tensor in _attribute_tensors(node):
                yield f"{label} (in function {function.name!r})", tensor


def all_tensors(model: onnx.ModelProto, *, initializers: bool = True) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of a model (see `named_tensors`)."""
    return (tensor for _, tensor in named_tensors(model, initializers=initializers))


def external_tensors(model: onnx.ModelProto, *, initializers: bool = True) -> list[onnx.TensorProto]:
    """Every tensor of `model` stored as external data (see `all_tensors`)."""
    tensors = all_tensors(model, initializers=initializers)
    return [tensor for tensor in tensors if tensor.data_location == onnx.TensorProto.EXTERNAL]


def external_locations(model: onnx.ModelProto) -> set[str]:
    """The `location` of every tensor stored as external data (graph, subgraphs, attributes, functions)."""
    locations = set()
    for tensor in external_tensors(model):
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), None)
        if location:
            locations.add(location)
    return locations


def model_files(path: str | os.PathLike) -> list[pathlib.Path]:
    """The model file and every external data file it refers to (whether they exist or not). A file that is not a
    readable model gives just itself: reading it fails later with its own message."""
    path = pathlib.Path(path)
    try:
        proto = inline_weights.read_model(path, payloads=False)  # the structure only: no inline weights read
    except Exception:  # not a model: the load step names the problem
        return [path]
    return [path, *(path.parent / location for location in sorted(external_locations(proto)))]
