"""The modulated norm of diffusion transformers (adaLN): `norm(x) * (1 + scale) + shift`, scale and shift per sample.

DiT, PixArt, SD3, Flux and Wan normalise (LayerNorm without affine, or RMSNorm) and then modulate with vectors that
a Linear computes from the conditioning, chunked and unsqueezed to `[B, 1, H]`. Exported, that is the norm, an
`Add(1, scale)`, a `Mul` and an `Add` over the whole activation; the onnx-norm target fuses the four into one
`ModulatedLayerNorm` / `ModulatedRMSNorm` (docs/ops.md). The recogniser is anchored at the final Add:

    Add(Mul(n, Add(1, scale)), shift)     any operand order, the 1 any constant scalar 1

where `n` ends a norm the built-in recognisers find (match.find_norm, its own constant scale/bias folded in), or is
the Y of a native norm op (ONNX's LayerNormalization, as torch's dynamo exporter writes nn.LayerNorm, and
RMSNormalization; ONNX Runtime's LayerNormalization/SimplifiedLayerNormalization), read with the take-over's
semantics (native.py), and scale/shift have X's rank, ones between the batch and the normalised dims, and the
normalised dims themselves.
Near-misses (`inspect --explain`): a modulation that varies along the sequence, one without the `1 +`, a shape
that is unknown, a native norm whose Mean/InvStdDev are read or that the take-over cannot read (its reason). The
onnx and ort targets have no such op: there the match is a near-miss with their reason and the inner norm is fused
alone by the built-in families in the next sweep (a native one stays as it is).

A native norm in float16/bfloat16 rounds where its definition does: ONNX's function body after the normalisation,
the scale multiply and the bias add (the op's `normalized_type = multiply_type = T`, exact); ONNX Runtime's contrib
ops once, at the end. The op rounds after every affine step, so a contrib op with both a scale and a bias in a
narrow type is not reproduced (one rounding apart): a near-miss. ONNX Runtime's own kernel for the ONNX op also
rounds once, not as the op's definition does; against it the fused op, like the take-over's LayerNorm, may differ
by a unit in the last place of the scale product (more units of the output where the bias cancels it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import NARROW_TYPES, is_onnx_domain, onnx_opset, type_name
from onnx_norm.ops.modulated import MODULATED_LAYER_NORM, MODULATED_RMS_NORM, modulated_norm
from onnx_norm.ops.numerics import normalize
from onnx_norm.ops.schema import DOMAIN, OPSET_VERSION, NormAttributes
from onnx_norm.ops.signature import OpSignature
from onnx_norm.rewrite import casts, constants, match, native
from onnx_norm.rewrite.family import FusionRule, Lowering, NormFamily
from onnx_norm.rewrite.spec import NormSpec
from onnx_norm.rewrite.structure import NearMiss

#: Inner norm kind -> the op that replaces the match (its record's kind is this family's).
_OPS = {"layer": MODULATED_LAYER_NORM, "rms": MODULATED_RMS_NORM}
_FLOAT = int(ir.DataType.FLOAT)


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = None if value is None else value.producer()
    if node is None or node.op_type != op_type or not is_onnx_domain(node.domain) or len(node.inputs) != 2:
        return None
    return node


_LAYOUT = ("Unsqueeze", "Reshape")


def _one_plus(gate: ir.Value) -> tuple[list[ir.Node], ir.Value] | None:
    """(its nodes, s) when `gate` is `1 + s` or `s + 1`, the 1 any constant of value 1 and s computed, or that
    unsqueezed or reshaped (`(1 + scale)[:, None, :]`, AdaLayerNormContinuous): s is then the [B, H] chunk."""
    layout = gate.producer()
    if (
        layout is not None
        and layout.op_type in _LAYOUT
        and is_onnx_domain(layout.domain)
        and layout.inputs[0] is not None
    ):
        found = _one_plus(layout.inputs[0])
        return None if found is None else ([*found[0], layout], found[1])
    add = _producer(gate, "Add")
    if add is None:
        return None
    a, b = add.inputs
    for one, s in ((a, b), (b, a)):
        if s is not None and not constants.is_constant(s) and constants.scalar(one) == 1.0:
            return [add], s
    return None


def _per_sample(value: ir.Value, x: ir.Value, axis: int, *, squeezed: bool = False) -> str | None:
    """Why `value` is not a modulation of X's rows ([B or 1, 1, ..., 1, *normalised dims]; with `squeezed`, the
    [B, *normalised dims] a layout op turned into that), or None when it is."""
    if value.shape is None or x.shape is None:
        return "the modulation's shape is unknown"
    shape, x_shape = list(value.shape), list(x.shape)
    first = len(x_shape) + axis
    rank = 1 - axis if squeezed else len(x_shape)
    if len(shape) != rank:
        return f"the modulation has shape {shape}, not [B, 1, ..., H] of X's rank (it is not per sample)"
    if any(d != 1 for d in shape[1 : rank + axis]):
        return "modulation varies along the sequence (only per-sample modulation [B, 1, ..., H] is fused)"
    if any(d == 1 and x_shape[first + i] != 1 for i, d in enumerate(shape[rank + axis :])):
        return "the modulation broadcasts inside the normalised row"
    return None


def _native_inner(node: ir.Node, n: ir.Value) -> match.Candidate:
    """The native norm op `node` whose Y is `n`, as a candidate, read as the take-over reads it."""
    graph = node.graph
    opset = (onnx_opset(graph.opset_imports) if graph is not None else None) or 0
    spec = native.native_spec(node, opset)
    if isinstance(spec, str):
        raise NearMiss(f"the {node.op_type} inside is not fused with its modulation: {spec}", n)
    if spec.x.shape is None:
        raise NearMiss(f"the rank of the {node.op_type}'s input is unknown", spec.x)
    rank = len(spec.x.shape)
    return match.Candidate(
        spec=spec,
        nodes=[node],
        axes=tuple(range(rank + spec.attrs.axis, rank)),
        perm=None,
        new_constants={},
        variant=f"native {node.op_type}",
        cast_placement=casts.describe(spec.x.dtype, None, spec.attrs),  # type: ignore[arg-type]
        x_value=spec.x,
    )


def _inner(n: ir.Value, kind: str) -> match.Candidate | None:
    node = n.producer()
    if node is None:
        return None
    found = native.native_kind(node)
    if found is not None:  # a native norm op (its Y, not a statistic; no residual: the op has none)
        inner_kind, residual = found
        return _native_inner(node, n) if inner_kind == kind and not residual and node.outputs[0] is n else None
    try:
        inner = match.find_norm(node, kinds=frozenset({kind}), channels_first=False)
    except NearMiss:
        return None  # the built-in family reports it when it meets the norm itself
    if inner is None or inner.spec.skip is not None or inner.spec.y is not n:
        return None
    return inner


def _attributes(inner: match.Candidate, t: int) -> NormAttributes | str:
    """The op's attributes: the inner norm's, with the modulation's steps rounded to its type `t` (an fp16 graph
    computes `1 + s`, the Mul and the Add in fp16), and the normalised value rounded to `t` first when the norm has
    no affine (its output is `t`). The reason when no attribute set reproduces the graph."""
    # The modulation's steps are rounded where the graph rounds them, so the norm's own rounding is read as the
    # graph has it.
    a = inner.spec.graph_attrs or inner.spec.attrs
    if t not in NARROW_TYPES:
        if a.multiply_type in (0, _FLOAT):
            return a
        return "the norm rounds its scale multiply to another type than the modulation's"
    spec = inner.spec
    if a.multiply_type == 0 and spec.scale is not None and spec.bias is not None:
        # Rounded once after scale and bias (ONNX Runtime's contrib LayerNormalization, or a norm computed wide and
        # cast at its end); the op rounds after each affine step: up to one unit in the last place apart.
        return f"the norm rounds to {type_name(t)} once after its scale and bias; the modulated op rounds after each"
    affine = spec.scale is not None or spec.bias is not None
    normalized = a.normalized_type or (0 if affine else t)
    return dataclasses.replace(a, normalized_type=normalized, multiply_type=t)


def _candidate(anchor: ir.Node, shift: ir.Value, mul: ir.Node, n: ir.Value, gate: ir.Value, kind: str):
    inner = _inner(n, kind)
    if inner is None:
        return None
    x, axis = inner.spec.x, inner.spec.attrs.axis
    if inner.spec.mean is not None or inner.spec.inv_std is not None:
        raise NearMiss("the norm's statistics are read elsewhere; the modulated op has no statistics outputs", n)
    plus = _one_plus(gate)
    if plus is None:
        if constants.is_constant(gate) or _per_sample(gate, x, axis) is not None:
            return None  # a constant scale is the inner norm's; anything else is not a modulation
        raise NearMiss("no 1 + scale: the norm is multiplied by the modulation itself; only the norm is fused", gate)
    gate_nodes, scale = plus
    for value, squeezed in ((gate, False), (scale, len(gate_nodes) > 1), (shift, False)):
        reason = _per_sample(value, x, axis, squeezed=squeezed)
        if reason is not None:
            raise NearMiss(reason, value)
    # The norm's Y is of its output type or X's (docs/ops.md); shape inference leaves the types of ONNX Runtime's
    # contrib ops, and of what follows them, unknown.
    y_type = n.dtype or ir.DataType(inner.spec.attrs.output_type or inner.spec.x_type)
    t = int(y_type)
    if {scale.dtype, shift.dtype, anchor.outputs[0].dtype or y_type} != {y_type}:
        return None
    attrs = _attributes(inner, t)
    missing = [] if isinstance(attrs, str) else attrs.unsupported_by(_OPS[kind])
    if missing:
        attrs = f"{_OPS[kind].name} has no attribute {', '.join(missing)}; only the norm is fused"
    if isinstance(attrs, str):
        raise NearMiss(attrs, n)
    spec = dataclasses.replace(
        inner.spec,
        kind=_OPS[kind].kind,
        y=anchor.outputs[0],
        attrs=attrs,
        extra_inputs={"mod_scale": scale, "mod_shift": shift},
    )
    return dataclasses.replace(inner, spec=spec, nodes=[*inner.nodes, *gate_nodes, mul, anchor])


def _find(anchor: ir.Node, kind: str) -> match.Candidate | None:
    """The modulated norm ending at the Add `anchor`, for an inner norm of `kind`."""
    if len(anchor.inputs) != 2 or len(anchor.outputs) != 1:
        return None
    a, b = anchor.inputs
    for product, shift in ((a, b), (b, a)):
        mul = _producer(product, "Mul")
        if mul is None or shift is None or constants.is_constant(shift):
            continue
        p, q = mul.inputs
        for n, gate in ((p, q), (q, p)):
            if n is None or gate is None or constants.is_constant(n):
                continue
            found = _candidate(anchor, shift, mul, n, gate, kind)
            if found is not None:
                return found
    return None


def _reference(kind: str):
    def reference(
        x: np.ndarray, params: Mapping[str, np.ndarray | None], attrs: NormAttributes
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        rms = kind == "rms"
        scale, bias = params.get("scale"), params.get("bias")
        y = modulated_norm(x, scale, bias, params["mod_scale"], params["mod_shift"], attrs, rms=rms)
        _, inv, mean = normalize(x, None, None, attrs, rms=rms)
        return y, inv, mean

    return reference


def _emitter(signature: OpSignature):

    def emit(op, spec: NormSpec, opset: int) -> list[ir.Value]:
        given = {
            "X": spec.x,
            "Scale": spec.scale,
            "Bias": spec.bias,
            "ModScale": spec.extra_inputs["mod_scale"],
            "ModShift": spec.extra_inputs["mod_shift"],
        }
        params = [given[name] for name in ("Scale", "Bias", "ModScale", "ModShift") if given[name] is not None]
        if len({v.dtype for v in params}) > 1:
            # The library declares one type for all four (docs/ops.md): widen them to float32, exactly.
            for name in ("Scale", "Bias", "ModScale", "ModShift"):
                value = given[name]
                if value is not None and value.dtype != ir.DataType.FLOAT:
                    given[name] = op.Cast(value, to=_FLOAT)
        inputs = [given[name] for name in signature.inputs]
        return [op.op(signature.name, *inputs, _domain=DOMAIN, _version=OPSET_VERSION, **spec.attrs.as_dict())]

    return emit


def _unsupported(spec: NormSpec, opset: int) -> str | None:
    if spec.row_groups:
        return f"the norm's scale or bias varies per row group {list(spec.row_groups)}; the modulated ops take one row"
    if spec.attrs.output_type and (spec.x.shape is None):
        return "Y takes another type than X and X's rank is unknown (the library's shape inference needs it)"
    return None


def _family(inner_kind: str) -> NormFamily:
    signature = _OPS[inner_kind]
    kind = signature.kind
    what = "LayerNorm" if inner_kind == "layer" else "RMSNorm"
    return NormFamily(
        kind=kind,
        summary=f"modulated {what}: {what}(x) * (1 + scale) + shift, scale and shift per sample (adaLN)",
        rules=(FusionRule(f"{kind}_norm", kind),),
        reference=_reference(inner_kind),
        lowerings={
            "onnx-norm": Lowering(emit=_emitter(signature), unsupported=_unsupported),
            "onnx": f"ONNX has no modulated {what}; the {what} inside is fused alone (a native one is kept)",
            "ort": f"ONNX Runtime has no modulated {what}; the {what} inside is fused alone (a native one is kept)",
        },
        find=lambda anchor: _find(anchor, inner_kind),
        anchor_ops=frozenset({"Add"}),
        sweep=-1,  # before the built-in families fuse the norm inside
    )


#: AdaLayerNorm and AdaRMSNorm: one family per inner norm.
FAMILIES = (_family("layer"), _family("rms"))
