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
from onnx_norm.ops.schema import ACTIVATIONS, DOMAIN, FLOAT_TYPES, OPS, OPSET_VERSION, NormAttributes

logger = logging.getLogger(__name__)

#: IR version that introduced function overloads.
MIN_IR_VERSION = 10
#: Oldest default-domain opset a body can be written in: opset 9's Flatten, Cast and Slice (attributes before 10)
#: cover every body; paddle.onnx.export still writes opset 9 by default.
MIN_BODY_OPSET = 9
#: Opset used by `function_proto` when the signature does not say.
DEFAULT_BODY_OPSET = 18

_FLOAT = int(ir.DataType.FLOAT)
_INT64_MAX = np.iinfo(np.int64).max


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
        # The attributes an op adds to the shared ones (GroupNorm's num_groups, activation), by name.
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


class _Body:
    """The tape one function body is written on, with the idioms every body uses: constants, casts, float32
    computation and rounding to a narrower type."""

    def __init__(self, sig: FunctionSignature) -> None:
        self.sig = sig
        self.tape = ir.tape.Tape()

    def op(self, op_type: str, inputs: list[ir.Value], attributes: dict | None = None) -> ir.Value:
        return self.tape.op(op_type, inputs, attributes or {})

    def const(self, array: np.ndarray) -> ir.Value:
        return self.op("Constant", [], {"value": ir.tensor(array)})

    def i64(self, *values: int) -> ir.Value:
        return self.const(np.array(values, np.int64))

    def slice(self, data: ir.Value, starts: list[int], ends: list[int], axes: list[int] | None = None) -> ir.Value:
        """Slice with constant bounds: inputs from opset 10, attributes before."""
        if self.sig.opset < 10:
            attributes = {"starts": starts, "ends": ends} | ({"axes": axes} if axes is not None else {})
            return self.op("Slice", [data], attributes)
        bounds = [self.i64(*starts), self.i64(*ends)] + ([self.i64(*axes)] if axes is not None else [])
        return self.op("Slice", [data, *bounds])

    def cast(self, v: ir.Value, to: int) -> ir.Value:
        return self.op("Cast", [v], {"to": ir.DataType(to)})

    def to_float(self, v: ir.Value, elem_type: int | None) -> ir.Value:
        return v if elem_type == _FLOAT else self.cast(v, _FLOAT)

    def round_to(self, v: ir.Value, elem_type: int) -> ir.Value:
        # Rounding to float32 of a float32 value is the identity.
        if elem_type in (0, _FLOAT):
            return v
        return self.cast(self.cast(v, elem_type), _FLOAT)

    def reduce_mean(self, v: ir.Value, axes: list[int]) -> ir.Value:
        if self.sig.opset >= 18:
            return self.op("ReduceMean", [v, self.const(np.array(axes, np.int64))], {"keepdims": 1})
        return self.op("ReduceMean", [v], {"axes": axes, "keepdims": 1})

    def statistics(self, x: ir.Value, axes: list[int], *, rms: bool) -> tuple[ir.Value, ir.Value | None, ir.Value]:
        """(centred x, mean or None, 1 / sqrt(variance + eps)) over `axes`."""
        if rms:
            mean, centred = None, x
        else:
            mean = self.reduce_mean(x, axes)
            centred = self.op("Sub", [x, mean])
        variance = self.reduce_mean(self.op("Mul", [centred, centred]), axes)
        eps = self.const(np.array(self.sig.attrs.epsilon, np.float32))
        inv = self.op("Reciprocal", [self.op("Sqrt", [self.op("Add", [variance, eps])])])
        return centred, mean, inv


@dataclasses.dataclass
class _Normalised:
    """What the normalisation step leaves: Y before its affine, and the statistics outputs (None when absent)."""

    y: ir.Value
    mean: ir.Value | None
    inv: ir.Value | None


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


def _input(body: _Body, formal: dict[str, ir.Value], results: dict[str, ir.Value]) -> tuple[ir.Value, ir.Value]:
    """(X in float32, the value whose shape is X's): the residual sum for the Skip ops (also their Sum output)."""
    sig, x = body.sig, formal["X"]
    if not OPS[sig.op].skip:
        return body.to_float(x, sig.x_type), x
    total = body.op("Add", [body.to_float(x, sig.x_type), body.to_float(formal["Skip"], sig.x_type)])
    s = total if sig.x_type == _FLOAT else body.cast(total, sig.x_type)
    results["Sum"] = s
    # The float32 sum is normalised, not the rounded Sum (docs/ops.md).
    return total, s


def _normalise_trailing(body: _Body, xf: ir.Value, axis: int, n_out: int) -> _Normalised:
    """A negative axis: the normalised dims are the last -axis ones whatever the rank; reducing over them with
    keepdims also gives the statistics their shape."""
    schema = OPS[body.sig.op]
    axes = list(range(axis, 0))
    centred, mean, inv = body.statistics(xf, axes, rms=schema.rms)
    y = body.op("Mul", [centred, inv])
    if any(n in ("Mean", "InvStdDev", "InvRMS") for n in schema.outputs[:n_out]):
        # ONNX Runtime (1.31) reduces an empty tensor to its input shape; keep one element per normalised dim.
        starts, ends = [0] * len(axes), [1] * len(axes)
        mean = None if mean is None else body.slice(mean, starts, ends, axes)
        inv = body.slice(inv, starts, ends, axes)
    return _Normalised(y, mean, inv)


def _normalise_flattened(body: _Body, xf: ir.Value, x_source: ir.Value, axis: int) -> _Normalised:
    """A non-negative axis of an input of unknown rank: flatten to [rows, N] and reduce over axis 1."""
    sig, schema = body.sig, OPS[body.sig.op]
    x_shape = body.op("Shape", [x_source])
    rows = body.op("Flatten", [xf], {"axis": axis})
    centred, mean, inv = body.statistics(rows, [1], rms=schema.rms)
    reshape_attrs = {"allowzero": 1} if sig.opset >= 14 else {}
    y = body.op("Reshape", [body.op("Mul", [centred, inv]), x_shape], reshape_attrs)
    if schema.modulated:  # the modulated ops have no statistics outputs
        return _Normalised(y, None, None)
    # Statistics keep X's leading dims and have 1 for every normalised dim.
    leading = body.slice(x_shape, [0], [axis])
    tail = body.slice(x_shape, [axis], [_INT64_MAX])
    ones = body.op("Add", [body.op("Mul", [tail, body.i64(0)]), body.i64(1)])
    stat_shape = body.op("Concat", [leading, ones], {"axis": 0})
    mean = None if mean is None else body.op("Reshape", [mean, stat_shape], reshape_attrs)
    return _Normalised(y, mean, body.op("Reshape", [inv, stat_shape], reshape_attrs))


def _affine(body: _Body, formal: dict[str, ir.Value], y: ir.Value, x_source: ir.Value) -> ir.Value:
    """Y rounded where the attributes say, times Scale, plus Bias, then the modulation of the modulated ops."""
    a = body.sig.attrs
    y = body.round_to(y, a.normalized_type)
    if "Scale" in formal:
        y = body.round_to(body.op("Mul", [y, body.cast(formal["Scale"], _FLOAT)]), a.multiply_type)
    if "Bias" in formal:
        y = body.round_to(body.op("Add", [y, body.cast(formal["Bias"], _FLOAT)]), a.multiply_type)
    if OPS[body.sig.op].modulated:
        y = _modulate(body, y, x_source, formal["ModScale"], formal["ModShift"])
    return y


def _modulate(body: _Body, y: ir.Value, x: ir.Value, mod_scale: ir.Value, mod_shift: ir.Value) -> ir.Value:
    """y * round_m(1 + ModScale) + ModShift, each step rounded to multiply_type, with ModScale/ModShift reshaped to
    [B or 1, 1, ..., 1, *normalised dims] (their first dim, 1 for X's dims up to `axis`, X's normalised dims):
    that covers both accepted shapes whatever X's rank, with reductions of nothing but Shape and Slice."""
    a = body.sig.attrs
    x_shape = body.op("Shape", [x])
    middle = body.slice(x_shape, [1], [a.axis])
    ones = body.op("Add", [body.op("Mul", [middle, body.i64(0)]), body.i64(1)])
    normalized = body.slice(x_shape, [a.axis], [_INT64_MAX])
    one = body.const(np.array(1.0, np.float32))
    m = a.multiply_type

    def broadcastable(v: ir.Value) -> ir.Value:
        batch = body.slice(body.op("Shape", [v]), [0], [1])
        shape = body.op("Concat", [batch, ones, normalized], {"axis": 0})
        return body.op("Reshape", [body.cast(v, _FLOAT), shape])

    factor = body.round_to(body.op("Add", [broadcastable(mod_scale), one]), m)
    y = body.round_to(body.op("Mul", [y, factor]), m)
    return body.round_to(body.op("Add", [y, broadcastable(mod_shift)]), m)


def _outputs(body: _Body, results: dict[str, ir.Value], n_out: int) -> list[ir.Value]:
    """The formal outputs in schema order, named (a FunctionProto refers to values by name only)."""
    outputs = []
    for name in OPS[body.sig.op].outputs[:n_out]:
        value = results[name]
        value.name = name
        outputs.append(value)
    return outputs


def _group_norm(body: _Body, formal: dict[str, ir.Value], results: dict[str, ir.Value]) -> None:
    """GroupNorm's Y: X as [N, G, -1] normalised over its last dim, then as [N, C, -1] for the per-channel affine
    (Scale and Bias as [C, 1]) and the activation, then X's shape again; no rank needed."""
    sig = body.sig
    a = sig.attrs
    num_groups = getattr(a, "num_groups", 1)
    x = formal["X"]
    groups = body.op("Reshape", [body.to_float(x, sig.x_type), body.i64(0, num_groups, -1)])
    centred, _, inv = body.statistics(groups, [2], rms=False)
    y = body.round_to(body.op("Mul", [centred, inv]), a.normalized_type)
    x_shape = body.op("Shape", [x])
    channels = body.op("Concat", [body.i64(0), body.slice(x_shape, [1], [2]), body.i64(-1)], {"axis": 0})
    y = body.op("Reshape", [y, channels])
    m = a.multiply_type
    for name, op_type in (("Scale", "Mul"), ("Bias", "Add")):
        if name in formal:
            column = body.op("Reshape", [body.cast(formal[name], _FLOAT), body.i64(-1, 1)])
            y = body.round_to(body.op(op_type, [y, column]), m)
    if getattr(a, "activation", 0) == ACTIVATIONS["silu"]:
        y = body.round_to(body.op("Mul", [y, body.round_to(body.op("Sigmoid", [y]), m)]), m)
    y = body.op("Reshape", [y, x_shape])
    out_type = a.output_type or sig.x_type
    results["Y"] = y if out_type == _FLOAT else body.cast(y, out_type)


def _norm(body: _Body, formal: dict[str, ir.Value], results: dict[str, ir.Value], n_out: int) -> None:
    """The norms' outputs: Y, the statistics of LayerNorm/RMSNorm and the Skip ops' Sum."""
    sig, schema = body.sig, OPS[body.sig.op]
    xf, x_source = _input(body, formal, results)
    axis = sig.attrs.axis
    if axis >= 0 and sig.rank is not None:
        axis -= sig.rank
    if axis < 0:
        normalised = _normalise_trailing(body, xf, axis, n_out)
    else:
        normalised = _normalise_flattened(body, xf, x_source, axis)
    y = _affine(body, formal, normalised.y, x_source)
    out_type = sig.attrs.output_type or sig.x_type
    results["Y"] = y if out_type == _FLOAT else body.cast(y, out_type)
    if normalised.mean is not None:
        results["Mean"] = normalised.mean
    if not schema.modulated:
        results["InvRMS" if schema.rms else "InvStdDev"] = normalised.inv


def build_function(sig: FunctionSignature, overload: str | None = None) -> ir.Function:
    """The model-local function for one signature, as an onnx-ir function of domain onnx_norm, with the
    given overload name (by default the signature's own)."""
    body = _Body(sig)
    formals, formal, n_out = _formals(sig)
    results: dict[str, ir.Value] = {}
    if sig.op == "GroupNorm":
        _group_norm(body, formal, results)
    else:
        _norm(body, formal, results, n_out)
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
