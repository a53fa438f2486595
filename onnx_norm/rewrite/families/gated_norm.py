"""The gated RMSNorm of Mamba2-style blocks: `rmsnorm(x * silu(z)) * w` (the gate before the statistic: Mamba2's
MambaRMSNormGated, NemotronH, Falcon-H1 with mamba_norm_before_gate=False) or `rmsnorm(x) * w * silu(z)` (after the
norm: Qwen3-Next's Qwen3NextRMSNormGated, Falcon-H1's default), over the whole last dim or over groups of it (x viewed
as [..., G, D / G] by a Reshape, normalised over its last dim, viewed back).

Exported, each is an RMSNorm that the built-in family fuses, plus a `Sigmoid` and two `Mul`s over the whole
activation (and a `Reshape` there and back with groups); the onnx-norm target fuses all of it into one
`GatedRMSNorm` (docs/ops.md). The recogniser is anchored at the chain's last node and walks back:

    [Cast] <- [Mul(., silu(z))] <- the norm's end          the gate after the norm
    the norm's input x' = Mul(x, silu(z))                   the gate before it (either operand order)
    silu(z) = Mul(z', Sigmoid(z')), z' = z or Cast(z) to float32 (`gate.to(float32)`)

where the norm is one the built-in recogniser finds (match.find_norm, with its casts and its constant scale), or,
in groups, `[Cast] [Mul(w)] [Cast] Reshape(back) [Mul(w viewed [G, D/G])] <norm over [..., G, D/G]>` whose input is
`Reshape(x', [..., G, D/G])`. The rounding points are read from the graph's types and checked by the proof against
the op's float64 reference. A match that a later node extends (the final Cast after the gate) is left to that node.
The onnx and ort targets have no such op: the match is a near-miss with their reason and the RMSNorm inside is fused
alone by the built-in family in the next sweep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

from onnx_norm.dtypes import NARROW_TYPES, is_onnx_domain
from onnx_norm.ops.gated_norm import GATED_RMS_NORM, GatedNormAttributes, gated_rms
from onnx_norm.ops.numerics import normalize, np_dtype, output
from onnx_norm.ops.schema import DOMAIN, OPSET_VERSION, NormAttributes
from onnx_norm.rewrite import constants, match, shape_values
from onnx_norm.rewrite.family import FusionRule, Lowering, NormFamily
from onnx_norm.rewrite.prove import concrete_shape
from onnx_norm.rewrite.reductions import is_float_cast
from onnx_norm.rewrite.spec import NormSpec
from onnx_norm.rewrite.structure import NearMiss, is_widening_cast

_FLOAT = int(ir.DataType.FLOAT)
#: How far back from the anchor the chain's own steps may reach (casts, the scale, the reshape back).
_MAX_STEPS = 6
#: What the chain can end with: the gate's or the scale's Mul, a Cast, the view in groups's Reshape back.
_ANCHORS = frozenset({"Mul", "Cast", "Reshape"})


def _node(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = None if value is None else value.producer()
    if node is None or node.op_type != op_type or not is_onnx_domain(node.domain):
        return None
    return node


def _uncast(value: ir.Value) -> tuple[ir.Value, list[ir.Node]]:
    """`value` under a Cast to a float type (the modules' `.to(float32)`), and that Cast."""
    node = value.producer()
    if node is not None and is_float_cast(node) and node.inputs[0] is not None:
        return node.inputs[0], [node]
    return value, []


def _silu(value: ir.Value) -> tuple[ir.Value, list[ir.Node]] | None:
    """(z, the nodes) when `value` is z' * Sigmoid(z') (either order), z' being z or a float Cast of z."""
    mul = _node(value, "Mul")
    if mul is None or len(mul.inputs) != 2:
        return None
    a, b = mul.inputs
    for z, s in ((a, b), (b, a)):
        sigmoid = _node(s, "Sigmoid")
        if z is not None and sigmoid is not None and sigmoid.inputs[0] is z and not constants.is_constant(z):
            source, casts = _uncast(z)
            return source, [*casts, sigmoid, mul]
    return None


def _gated(value: ir.Value) -> tuple[ir.Value, ir.Value, list[ir.Node]] | None:
    """(the gated data, z, the nodes) when `value` is data * silu(z), either operand order."""
    mul = _node(value, "Mul")
    if mul is None or len(mul.inputs) != 2 or len(mul.outputs) != 1:
        return None
    a, b = mul.inputs
    for data, g in ((a, b), (b, a)):
        silu = None if data is None or g is None else _silu(g)
        if silu is not None and silu[0] is not data:
            return data, silu[0], [*silu[1], mul]
    return None


@dataclasses.dataclass
class _Tail:
    """The chain in groups's steps after the norm over [..., G, D/G]: the Reshape back, the scale (its Mul and the
    constant), the narrow type a Cast between the norm and the scale rounds to, and every node."""

    reshape: ir.Node
    scale: ir.Value | None
    scale_mul: ir.Node | None
    normalized_type: int
    nodes: list[ir.Node]


def _scale_operand(node: ir.Node) -> tuple[ir.Value, ir.Value] | None:
    """(constant, computed) operands of a Mul by a constant."""
    if node.op_type != "Mul" or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    for c, v in ((a, b), (b, a)):
        if c is not None and v is not None and constants.is_constant(c) and not constants.is_constant(v):
            return c, v
    return None


def _grouped_tail(end: ir.Value) -> tuple[ir.Value, _Tail] | None:
    """(the norm's end over [..., G, D/G], the steps after it) walking back from `end` through Casts, at most one
    Mul by a constant and exactly one Reshape, as far as the norm; None without a Reshape."""
    value, nodes, reshape = end, [], None
    scale = scale_mul = None
    narrow = 0
    for _ in range(_MAX_STEPS):
        node = value.producer()
        if node is None or not is_onnx_domain(node.domain) or not node.inputs or node.inputs[0] is None:
            break
        operands = _scale_operand(node) if scale is None else None
        if is_float_cast(node):
            to = int(node.attributes["to"].value)
            narrow = to if to in NARROW_TYPES and scale is not None else narrow
        elif operands is not None:
            scale, scale_mul = operands[0], node
            value = operands[1]
            nodes.append(node)
            continue
        elif node.op_type == "Reshape" and reshape is None:
            reshape = node
        else:
            break
        nodes.append(node)
        value = node.inputs[0]
        if reshape is not None:
            break
    if reshape is None:
        return None
    return value, _Tail(reshape, scale, scale_mul, narrow, nodes)


def _group_affine(inputs: match.AffineInputs) -> match.Affine:
    """The affine of the norm over [..., G, D/G]: a constant weight viewed [G, D/G] (Falcon-H1's
    `weight.view(groups, d / groups) * x`), which varies across the rows of the view in groups but is one row of X's
    last dim, read as the [D] scale the op takes; anything else as the default strategy reads it."""
    layout = inputs.layout
    shape = layout.x_shape
    terms = inputs.scale_terms
    if inputs.bias is not None or len(terms) != 1 or terms[0][1] != 1 or inputs.correction != 1.0 or shape is None:
        return match.default_affine(inputs)
    array = constants.constant_array(terms[0][0])
    if array is None or array.ndim < 2 or layout.axes != (len(shape) - 1,) or layout.perm is not None:
        return match.default_affine(inputs)
    if any(d != 1 for d in array.shape[:-2]) or list(array.shape[-2:]) != list(shape[-2:]):
        return match.default_affine(inputs)
    return match.Affine(terms[0][0], None, {"scale": np.ascontiguousarray(array.reshape(-1))}, None)


def _inner(end: ir.Value, affine: match.AffineStrategy | None = None) -> match.Candidate | None:
    """The built-in RMSNorm ending at `end` over the last dim, alone (no residual, no bias, no statistics read)."""
    node = end.producer()
    if node is None:
        return None
    try:
        inner = match.find_norm(node, kinds=frozenset({"rms"}), channels_first=False, affine=affine)
    except NearMiss:
        return None  # the built-in family reports it when it meets the norm itself
    spec = None if inner is None else inner.spec
    if spec is None or spec.y is not end or spec.skip is not None or spec.bias is not None:
        return None
    if spec.attrs.axis != -1 or spec.inv_std is not None or inner.perm is not None:
        return None
    return inner


def _split(x4: ir.Value, tail: _Tail) -> tuple[ir.Value, int] | None:
    """(X, group size) when `x4` is X reshaped to [..., G, D/G] and the tail's Reshape restores X's shape."""
    split = _node(x4, "Reshape")
    if split is None or split.inputs[0] is None:
        return None
    x = split.inputs[0]
    back = tail.reshape.outputs[0]
    if x4.shape is None or x.shape is None or back.shape is None or len(x4.shape) != len(x.shape) + 1 or not x.shape:
        return None
    size, d = x4.shape[-1], x.shape[-1]
    if not isinstance(size, int) or not isinstance(d, int) or size < 1 or d % size or list(back.shape) != list(x.shape):
        return None
    if list(x4.shape[:-2]) != list(x.shape[:-1]):
        return None
    return x, size


@dataclasses.dataclass
class _Core:
    """The norm found, with what the gated op needs of it: its input (before the gate), the group size, the scale
    and the rounding points read from the graph, and every node from the input to the norm's end."""

    inner: match.Candidate
    x: ir.Value
    group_size: int
    scale: ir.Value | None
    new_scale: np.ndarray | None
    normalized_type: int
    multiply_type: int
    nodes: list[ir.Node]
    back: ir.Value | None = None  # in groups: the view back to X's shape


def _grouped_core(end: ir.Value) -> _Core | None:
    found = _grouped_tail(end)
    if found is None:
        return None
    norm_end, tail = found
    inner = _inner(norm_end, _group_affine)
    if inner is None or (inner.spec.scale is not None and tail.scale is not None):
        return None
    split = _split(inner.spec.x, tail)
    if split is None:
        return None
    x, size = split
    new_scale = None
    if inner.spec.scale is not None:  # a [1, D] weight view (one group) the norm's own affine took
        tail.scale = inner.spec.scale
    if tail.scale is not None:
        array = constants.constant_array(tail.scale)
        d = x.shape[-1] if x.shape is not None else None
        if array is None or array.size != d or (array.ndim > 1 and array.shape[-1] != size and array.ndim != 1):
            return None
        new_scale = np.ascontiguousarray(array.reshape(-1))
    mul_type = tail.scale_mul.outputs[0].dtype if tail.scale_mul is not None else None
    multiply = int(mul_type) if mul_type is not None and int(mul_type) in NARROW_TYPES else 0
    if tail.scale_mul is None:
        multiply = (inner.spec.graph_attrs or inner.spec.attrs).multiply_type
    normalized = max(tail.normalized_type, inner.spec.attrs.normalized_type)
    split_node = inner.spec.x.producer()
    assert split_node is not None
    nodes = [split_node, *inner.nodes, *tail.nodes]
    return _Core(inner, x, size, tail.scale, new_scale, normalized, multiply, nodes, tail.reshape.outputs[0])


def _plain_core(end: ir.Value) -> _Core | None:
    inner = _inner(end)
    if inner is None:
        return None
    a = inner.spec.graph_attrs or inner.spec.attrs
    return _Core(inner, inner.spec.x, 0, inner.spec.scale, None, a.normalized_type, a.multiply_type, inner.nodes)


def _core(end: ir.Value) -> _Core | None:
    return _grouped_core(end) or _plain_core(end)


def _strip_output_cast(y: ir.Value) -> tuple[ir.Value, list[ir.Node]]:
    node = y.producer()
    if node is not None and is_float_cast(node) and node.inputs[0] is not None:
        return node.inputs[0], [node]
    return y, []


def _match(anchor: ir.Node) -> match.Candidate | None:
    """The gated norm ending at `anchor`, either order, in groups or not."""
    if len(anchor.outputs) != 1 or not is_onnx_domain(anchor.domain) or anchor.op_type not in _ANCHORS:
        return None
    y = anchor.outputs[0]
    before_gate, out_cast = _strip_output_cast(y)
    after = _gated(before_gate)
    if after is not None:
        data, z, gate_nodes = after
        core, mid_cast = _core(data), []
        if core is None:
            end, mid_cast = _strip_output_cast(data)
            core = _core(end) if mid_cast else None
        if core is None:
            return None
        nodes = [*core.nodes, *mid_cast, *gate_nodes, *out_cast]
        x, order, product_like = core.x, 1, []
    else:
        core = _core(y)
        if core is None:
            return None
        product, product_cast = _uncast(core.x)
        gated = _gated(product)
        if gated is None:
            return None
        data, z, gate_nodes = gated
        x, x_cast = _uncast(data)
        nodes = [*x_cast, *gate_nodes, *product_cast, *core.nodes]
        order = 0
        product_like = [product, core.x, *([core.back] if core.back is not None else [])]
    return _candidate(anchor, core, x, z, order, list(dict.fromkeys(nodes)), product_like)


def _unwidened(x: ir.Value, nodes: list[ir.Node]) -> tuple[ir.Value, list[ir.Node]]:
    """X under a widening Cast that only the match reads (`x.to(float32)` of an fp16 X): the op reads the narrow X
    and computes in float32 anyway, exactly as the Cast would."""
    node = x.producer()
    inside = set(nodes)
    if node is None or not is_widening_cast(node) or node.inputs[0] is None or x.is_graph_output():
        return x, nodes
    if any(use.node not in inside for use in x.uses()):
        return x, nodes
    return node.inputs[0], [*nodes, node] if node not in inside else nodes


def _scale_in(array: np.ndarray, z: ir.Value) -> np.ndarray:
    """The new scale in Z's type when that holds it exactly (a narrow weight that the graph widened to float32):
    the library takes Z and Scale in one type, and a float32 Scale would widen Z too."""
    if z.dtype not in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        return array
    narrow = array.astype(np_dtype(int(z.dtype)))
    return narrow if np.array_equal(narrow.astype(array.dtype), array) else array


def _candidate(
    anchor: ir.Node,
    core: _Core,
    x: ir.Value,
    z: ir.Value,
    order: int,
    nodes: list[ir.Node],
    product_like: list[ir.Value],
) -> match.Candidate | None:
    """The candidate for the chain found; `product_like`: with the gate before the norm, the gated product and the
    values that keep its shape (its Cast, the view back from the groups), which have the product's broadcast
    shape, Z's."""
    y = anchor.outputs[0]
    x, nodes = _unwidened(x, nodes)
    if x.dtype is None or z.dtype is None:
        return None
    expanded = not shape_values.elements_equal(x.shape, z.shape)
    if expanded and (order == 1 or not _broadcasts_to(x.shape, z.shape)):
        return None
    if x.dtype.is_floating_point() is False or z.dtype.is_floating_point() is False:
        return None
    y_type = int(y.dtype) if y.dtype is not None else int(x.dtype)
    attrs = GatedNormAttributes(
        axis=-1,
        epsilon=core.inner.spec.attrs.epsilon,
        normalized_type=core.normalized_type if core.normalized_type in NARROW_TYPES else 0,
        multiply_type=core.multiply_type if core.multiply_type in NARROW_TYPES else 0,
        output_type=0 if y_type == int(x.dtype) else y_type,
        group_size=core.group_size,
        norm_before_gate=order,
    )
    spec = dataclasses.replace(
        core.inner.spec,
        kind=GATED_RMS_NORM.kind,
        x=x,
        scale=core.scale,
        y=y,
        attrs=attrs,
        graph_attrs=None,
        extra_inputs={"z": z},
    )
    new_constants = dict(core.inner.new_constants)
    if core.new_scale is not None:
        new_constants["scale"] = _scale_in(core.new_scale, z)
    assert z.shape is not None
    rank = len(z.shape)
    return dataclasses.replace(
        core.inner,
        spec=spec,
        nodes=nodes,
        axes=(rank - 1,),
        new_constants=new_constants,
        variant=_variant(order, core.group_size, expanded),
        x_value=x,
        proof_shape=concrete_shape(z.shape) if expanded else None,
        kept=[],
        aliases=[],
        same_shape=_same_shape(nodes, x, z, product_like),
    )


def _variant(order: int, group_size: int, expanded: bool) -> str:
    groups = f", groups of {group_size}" if group_size else ""
    expand = ", x expanded to the gate's shape" if expanded else ""
    return f"gated RMSNorm ({'norm before gate' if order else 'gate before norm'}{groups}{expand})"


def _broadcasts_to(x: ir.Shape | None, z: ir.Shape | None) -> bool:
    """True when `x * z` is known to have z's shape although x's is not known to be z's (the view of Mamba2's scan
    output whose last dim is a `-1` that no inference resolves): on every dim x has 1, or the same dim, or z has a
    size above 1, which x's must then be or broadcast to."""
    if x is None or z is None or len(x) != len(z):
        return False
    return all(
        a == 1 or shape_values.elements_equal(ir.Shape([a]), ir.Shape([b])) or (isinstance(b, int) and b > 1)
        for a, b in zip(x, z, strict=True)
    )


def _same_shape(
    nodes: list[ir.Node], x: ir.Value, z: ir.Value, product_like: list[ir.Value]
) -> dict[ir.Value, ir.Value]:
    """The replaced values known to have X's or Z's shape, each with the one of the two it has the shape of (for
    the `Shape`s outside the match that read them)."""
    same: dict[ir.Value, ir.Value] = dict.fromkeys(product_like, z)
    for node in nodes:
        for value in node.outputs:
            if value in same:
                continue
            if shape_values.elements_equal(value.shape, z.shape):
                same[value] = z
            elif shape_values.elements_equal(value.shape, x.shape):
                same[value] = x
    return same


def _find(anchor: ir.Node) -> match.Candidate | None:
    """The gated norm ending at `anchor`, unless its single consumer ends a longer one (the driver visits nodes in
    order: the chain is matched at its last node)."""
    found = _match(anchor)
    if found is None:
        return None
    uses = list(found.spec.y.uses())
    if len(uses) == 1 and not found.spec.y.is_graph_output():
        try:
            if _match(uses[0].node) is not None:
                return None
        except NearMiss:
            pass
    return found


def _reference(
    x: np.ndarray, params: Mapping[str, np.ndarray | None], attrs: NormAttributes
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    assert isinstance(attrs, GatedNormAttributes)
    y, _ = gated_rms(x, params["z"], params.get("scale"), attrs)  # type: ignore[arg-type]
    _, inv, _ = normalize(x, None, None, attrs, rms=True)
    return output(y, x, attrs), inv, None


def _emit(op, spec: NormSpec, opset: int) -> list[ir.Value]:
    gate = z = spec.extra_inputs["z"]
    scale = spec.scale
    if scale is not None and scale.dtype != z.dtype:
        # The library declares one type for Z and Scale (docs/ops.md): widen both to float32, exactly.
        z = z if z.dtype == ir.DataType.FLOAT else op.Cast(z, to=_FLOAT)
        scale = scale if scale.dtype == ir.DataType.FLOAT else op.Cast(scale, to=_FLOAT)
    x = spec.x
    if not shape_values.elements_equal(x.shape, gate.shape):
        # The match proved x * z to have Z's shape (`_broadcasts_to`), not X to have it: the op reads X broadcast
        # to Z's shape, exactly what the gate's Mul read.
        x = op.Expand(x, op.Shape(gate))
        x.dtype, x.shape = spec.x.dtype, gate.shape
    inputs = [x, z, *([scale] if scale is not None else [])]
    return [op.op(GATED_RMS_NORM.name, *inputs, _domain=DOMAIN, _version=OPSET_VERSION, **spec.attrs.as_dict())]


_REASON = "{} has no gated RMSNorm; the RMSNorm inside is fused alone (the gate stays as Sigmoid and Mul)"

FAMILY = NormFamily(
    kind=GATED_RMS_NORM.kind,
    summary="gated RMSNorm: rmsnorm(x * silu(z)) * w or rmsnorm(x) * w * silu(z), in groups or not (Mamba2)",
    rules=(FusionRule("gated_rms_norm", GATED_RMS_NORM.kind),),
    reference=_reference,
    lowerings={
        "onnx-norm": Lowering(emit=_emit),
        "onnx": _REASON.format("ONNX"),
        "ort": _REASON.format("ONNX Runtime"),
    },
    find=_find,
    anchor_ops=_ANCHORS,
    sweep=-1,  # before the built-in RMSNorm family fuses the norm inside
)
