"""Model-local ONNX functions for the fused norm ops (semantics: docs/ops.md).

A model optimised for the `onnx-norm` target stays runnable where our kernel library is not installed: every
`onnx_norm` node gets a model-local function with the same domain and name, written with standard ONNX ops,
which runtimes inline when they have no kernel for the node. ONNX Runtime prefers a registered kernel over a
model-local function, so with the library registered the same model runs our kernels.

One function cannot serve every node of an op: which optional inputs and outputs are present and which rounding
steps apply change the structure of the body, not just constants in it. Attribute references cannot express that,
so each distinct node signature gets its own function overload (`NodeProto.overload`, IR version >= 10), and the
node is pointed at it. The body also bakes in `axis` and `epsilon`: attribute references to them would need
opset >= 12 for `Constant(value_float)` and >= 18 for dynamic reduction axes, while the models we rewrite start
at opset 9. An op used with a single signature gets the default overload "" (runtimes without overload support,
and IR < 10, then work too).

Bodies are written in the model's default-domain opset (the checker wants function and model opsets to agree):
float32 arithmetic on Cast inputs, `Cast` pairs for the rounding attributes, reductions over the last `-axis`
dims with keepdims (which gives the statistics their shape).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import numpy as np
import onnx
import onnx_ir as ir

from onnx_norm.dtypes import onnx_opset, type_name
from onnx_norm.ops.body import Body
from onnx_norm.ops.schema import DOMAIN, FLOAT_TYPES, OPS, OPSET_VERSION, NormAttributes

logger = logging.getLogger(__name__)

#: IR version that introduced function overloads.
MIN_IR_VERSION = 10
#: Oldest default-domain opset a body can be written in: opset 9's Flatten, Cast and Slice (attributes before 10)
#: cover every body; paddle.onnx.export still writes opset 9 by default.
MIN_BODY_OPSET = 9
#: Opset used by `function_proto` when the signature does not say.
DEFAULT_BODY_OPSET = 18


@dataclasses.dataclass(frozen=True)
class FunctionSignature:
    """Everything that decides the body of one function: the op, which optional inputs/outputs a node
    has, the element type of X and the attribute values."""

    op: str
    inputs: tuple[bool, ...]  # presence of each input of the op's schema, in schema order
    outputs: tuple[bool, ...]  # presence of each output
    x_type: int
    attrs: NormAttributes = dataclasses.field(default_factory=NormAttributes)
    opset: int = DEFAULT_BODY_OPSET  # default-domain opset the body is written in (not part of the overload)
    rank: int | None = None  # rank of X, used (and part of the overload) only for a non-negative axis

    def __post_init__(self) -> None:
        schema = OPS.get(self.op)
        if schema is None:
            raise ValueError(f"unknown onnx_norm op {self.op!r}; expected one of {sorted(OPS)}")
        if len(self.inputs) != len(schema.inputs) or len(self.outputs) != len(schema.outputs):
            raise ValueError(
                f"{self.op} signature needs {len(schema.inputs)} input flags and {len(schema.outputs)} output flags, "
                f"got {len(self.inputs)} and {len(self.outputs)}"
            )
        missing = [
            name
            for name, present in zip(schema.inputs, self.inputs, strict=True)
            if not present and name not in schema.optional_inputs
        ]
        if missing:
            raise ValueError(f"{self.op} needs its required inputs {missing}")
        if not self.outputs[0]:
            raise ValueError(f"{self.op} needs its output Y")
        for what, value in (("X", self.x_type), *self._type_attrs()):
            if value not in FLOAT_TYPES and not (value == 0 and what != "X"):
                raise ValueError(f"{self.op}: {what} element type {value} is not one of float, float16, bfloat16")
        if self.rank is not None and not -self.rank <= self.attrs.axis < self.rank:
            raise ValueError(f"axis {self.attrs.axis} is out of range for rank {self.rank}")
        if self.opset < MIN_BODY_OPSET:
            raise ValueError(f"function bodies need default opset >= {MIN_BODY_OPSET}, got {self.opset}")
        uses_bf16 = ir.DataType.BFLOAT16 in (self.x_type, *(v for _, v in self._type_attrs()))
        if uses_bf16 and self.opset < 13:
            raise ValueError(f"bfloat16 Casts need default opset >= 13, got {self.opset}")

    def _type_attrs(self) -> tuple[tuple[str, int], ...]:
        a = self.attrs
        return (
            ("normalized_type", a.normalized_type),
            ("multiply_type", a.multiply_type),
            ("output_type", a.output_type),
        )

    @property
    def overload(self) -> str:
        """A readable, unique name for this signature: present inputs and outputs, then type and attributes."""
        schema = OPS[self.op]
        ins = "_".join(n for n, p in zip(schema.inputs, self.inputs, strict=True) if p)
        outs = "_".join(n for n, p in zip(schema.outputs, self.outputs, strict=True) if p)
        a = self.attrs

        def t(v: int) -> str:
            return type_name(v) if v else "0"

        rank = f"_rank{self.rank}" if a.axis >= 0 and self.rank is not None else ""
        # The attributes an op adds to the shared ones, by name.
        shared = {field.name for field in dataclasses.fields(NormAttributes)}
        extra = "".join(f"_{k}{v}" for k, v in dataclasses.asdict(a).items() if k not in shared)
        return (
            f"{ins}__{outs}__x{t(self.x_type)}_axis{a.axis}{rank}_eps{float(np.float32(a.epsilon))!r}"
            f"_n{t(a.normalized_type)}_m{t(a.multiply_type)}_o{t(a.output_type)}{extra}"
        )

    @classmethod
    def from_node(cls, node: ir.Node, opset: int = DEFAULT_BODY_OPSET) -> FunctionSignature:
        """The signature of an `onnx_norm` node; raises ValueError naming the node if it is malformed."""
        where = f"node {node.name!r} ({node.domain}::{node.op_type})"
        schema = OPS.get(node.op_type)
        if node.domain != DOMAIN or schema is None:
            raise ValueError(f"{where} is not an onnx_norm op")
        if len(node.inputs) > len(schema.inputs) or len(node.outputs) > len(schema.outputs):
            raise ValueError(f"{where} has more inputs or outputs than {schema.name} defines")
        inputs = tuple(i < len(node.inputs) and node.inputs[i] is not None for i in range(len(schema.inputs)))
        outputs = tuple(i < len(node.outputs) and bool(node.outputs[i].name) for i in range(len(schema.outputs)))
        x = node.inputs[0] if node.inputs else None
        if x is None:
            raise ValueError(f"{where} has no input X")
        if x.dtype is None:
            raise ValueError(f"{where}: the element type of X ({x.name!r}) is unknown; run shape inference first")
        defaults = schema.attributes()
        values = {}
        for field in dataclasses.fields(schema.attributes):
            attr = node.attributes.get(field.name)
            values[field.name] = getattr(defaults, field.name) if attr is None else attr.value
        unknown = set(node.attributes) - set(values)
        if unknown:
            raise ValueError(f"{where} has unknown attributes {sorted(unknown)}")
        rank = len(x.shape) if x.shape is not None and values["axis"] >= 0 else None
        try:
            return cls(schema.name, inputs, outputs, int(x.dtype), schema.attributes(**values), opset, rank)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None


def _formals(sig: FunctionSignature) -> tuple[list[ir.Value], dict[str, ir.Value], int]:
    """(the formal inputs, the present ones by name, the number of formal outputs).

    ONNX Runtime binds a call's inputs and outputs to the formals by position, so the formals run up to the last
    present one; an absent one in between is a formal that the body ignores (inputs) or computes anyway (outputs,
    left unbound by the call)."""
    schema = OPS[sig.op]
    n_in = max(i for i, p in enumerate(sig.inputs) if p) + 1
    n_out = max(i for i, p in enumerate(sig.outputs) if p) + 1
    formals = [ir.Value(name=name) for name in schema.inputs[:n_in]]
    present = {v.name: v for v, p in zip(formals, sig.inputs, strict=False) if p}
    return formals, present, n_out  # type: ignore[misc]


def _outputs(body: Body, results: dict[str, ir.Value], n_out: int) -> list[ir.Value]:
    """The formal outputs in schema order, named (a FunctionProto refers to values by name only)."""
    outputs = []
    for name in body.record.outputs[:n_out]:
        value = results[name]
        value.name = name
        outputs.append(value)
    return outputs


def build_function(sig: FunctionSignature, overload: str | None = None) -> ir.Function:
    """The model-local function for one signature, as an onnx-ir function of domain onnx_norm, with the
    given overload name (by default the signature's own)."""
    record = OPS[sig.op]
    body = Body(record, sig)
    formals, formal, n_out = _formals(sig)
    results: dict[str, ir.Value] = {}
    record.body(body, formal, results, n_out)
    graph = ir.Graph(
        formals,
        _outputs(body, results, n_out),
        nodes=body.tape.nodes,
        opset_imports={"": sig.opset},
        name=f"{sig.op}_{sig.overload}",
    )
    # Name every intermediate value: a FunctionProto refers to values by name only.
    for i, node in enumerate(graph):
        node.name = f"n{i}_{node.op_type}"
        for j, out in enumerate(node.outputs):
            if not out.name:
                out.name = f"v{i}_{j}"
    overload = sig.overload if overload is None else overload
    return ir.Function(DOMAIN, sig.op, overload, graph=graph, attributes=[])


def function_proto(signature: FunctionSignature, overload: str | None = None) -> onnx.FunctionProto:
    """The model-local function for one signature as an `onnx.FunctionProto` (overload: see `build_function`)."""
    return ir.serde.serialize_function(build_function(signature, overload))


def _norm_nodes(model: ir.Model) -> Iterator[tuple[ir.Node, ir.Function | None]]:
    """Every onnx_norm node with the model-local function that holds it (None for the main graph)."""
    owners: list[tuple[ir.Graph | ir.Function, ir.Function | None]] = [(model.graph, None)]
    owners += [(f, f) for f in model.functions.values() if f.domain != DOMAIN]
    for graph, owner in owners:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            if node.domain == DOMAIN:
                yield node, owner


def _overloads(
    found: list[tuple[ir.Node, FunctionSignature, ir.Function | None]],
) -> dict[FunctionSignature, str]:
    """The overload name of each signature. An op used with one signature only gets the default overload "",
    which needs no IR 10 and no overload support. ONNX Runtime (1.31) also loses the overload of a node inside
    a model-local function when it inlines that function, so where nodes inside functions use one signature
    of an op, that signature gets "" too."""
    by_op: dict[str, dict[FunctionSignature, bool]] = {}
    for _, sig, owner in found:
        inside = by_op.setdefault(sig.op, {})
        inside[sig] = inside.get(sig, False) or owner is not None
    names: dict[FunctionSignature, str] = {}
    for op, sigs in by_op.items():
        nested = [sig for sig, inside in sigs.items() if inside]
        if len(sigs) == 1:
            default = next(iter(sigs))
        elif len(nested) == 1:
            default = nested[0]
        else:
            default = None
            if nested:
                logger.warning(
                    "%d signatures of %s::%s are used inside model-local functions; ONNX Runtime 1.31 cannot "
                    "run such nodes without the onnx_norm library because it drops their overloads when inlining",
                    len(nested),
                    DOMAIN,
                    op,
                )
        for sig in sigs:
            names[sig] = "" if sig == default else sig.overload
    return names


def attach_functions(model: ir.Model) -> None:
    """Adds a model-local function for every `onnx_norm` node signature in the model, its subgraphs and its
    other functions, points each node at its overload, and removes `onnx_norm` functions nothing uses.

    Raises ValueError, naming the node, when a node is not a valid onnx_norm op or its input type is unknown.
    """
    opset = onnx_opset(model.opset_imports) or DEFAULT_BODY_OPSET
    if opset < MIN_BODY_OPSET:
        raise ValueError(
            f"the model's default opset is {opset}; onnx_norm function bodies need opset >= {MIN_BODY_OPSET}"
        )
    found = [(node, FunctionSignature.from_node(node, opset), owner) for node, owner in _norm_nodes(model)]
    overloads = _overloads(found)
    for key in [k for k, f in model.functions.items() if f.domain == DOMAIN]:
        # Rebuilt from scratch: the nodes or the model's opset may have changed since the last call.
        del model.functions[key]
    for sig, overload in overloads.items():
        model.functions[(DOMAIN, sig.op, overload)] = build_function(sig, overload)
        logger.debug("added function %s::%s overload %r", DOMAIN, sig.op, overload)
    for node, sig, owner in found:
        node.overload = overloads[sig]
        if owner is not None:
            owner.opset_imports[DOMAIN] = OPSET_VERSION
    if found:
        model.opset_imports.setdefault("", opset)
        model.opset_imports[DOMAIN] = OPSET_VERSION
        if any(overloads.values()) and model.ir_version < MIN_IR_VERSION:
            # Overloads need IR 10; nothing else in a model changes meaning between IR versions 7 and 10.
            model.ir_version = MIN_IR_VERSION
