"""GroupNorm, and GroupNorm followed by SiLU, fused into `onnx_norm::GroupNorm` (docs/ops.md).

Recognised as exporters write `torch.nn.GroupNorm` (X is [N, C, ...], channels first), anchored at the Reshape
that splits the channels into groups:

    Reshape(X, [N or 0, G, -1])                          the groups (or [N, G, C/G, ...]: any split of C into G)
    -> InstanceNormalization(., ones(G), zeros(G), eps)  TorchScript's and dynamo's spelling (torch 2.x, both)
       or a LayerNorm over the trailing dims             a decomposition (ReduceMean, Sub, Pow/Mul, ReduceMean,
                                                         Add eps, Sqrt/Rsqrt, Div/Mul), found by match.find_norm
    -> Reshape(., shape of X)                             (none for G = C over [N, C, L]: dynamo drops it, wav2vec2)
    -> Mul(., scale) -> Add(., bias)                     per channel ([C, 1, ...] or [1, C, 1, ...]); optional
    -> Mul(., Sigmoid(.))                                SiLU, optional, fused as activation=silu

GroupNorm(1) is a LayerNorm over C, H, W: this family runs in an earlier sweep than the LayerNorm family, so the
whole chain (with its per-channel affine, which a LayerNorm over the grouped tensor cannot take) becomes one
GroupNorm; the LayerNorm family then only sees norms this family did not take (and fuses the grouped LayerNorm
alone where a target cannot emit GroupNorm). Channels-last X ([N, ..., C], tf2onnx's Keras GroupNormalization,
jax2onnx's flax GroupNorm):

    Reshape(X, [-1, ..., G, C/G])                        the groups split off the last dim (jax2onnx: X's Shape
                                                         concatenated with [G, C/G]; read from the inferred shape)
    -> any arithmetic on it and constants alone          moments over all but the batch and group dims (ReduceMean
                                                         only), one scalar epsilon added, gamma and beta ([.., G,
                                                         C/G]: one per channel) multiplied and added, in any order
    -> Reshape(., X's rank)                              back to X's shape
    -> Mul(., scale) -> Add(., bias)                     per channel ([C] or [1, .., C]), when none was inside
    -> Mul(., Sigmoid(.))                                swish/SiLU, optional

is fused as our NCHW op between two Transposes (rule group_norm_channels_last, the driver's channels-first route);
the region is taken only when nothing outside reads inside it, and the proof checks the arithmetic.

The native ONNX GroupNormalization-21 is taken over with `--take-over-native` (read_native; a SiLU after it stays
as it is), GroupNormalization-18 (scale per group, deprecated) is not; InstanceNormalization is GroupNorm with one
group per channel and is taken over as that (read_instance_normalization; the onnx target leaves it as it is).

Targets: `onnx-norm` (our op; Scale/Bias made [C] constants), `onnx` (torch's export: Reshape to [N, G, -1],
InstanceNormalization with ones/zeros, Reshape back, per-channel Mul/Add, then Sigmoid and Mul for SiLU; any opset;
ONNX Runtime runs it faster than GroupNormalization-21, docs/targets.md; a norm already in that form is left),
`ort`: ONNX Runtime's com.microsoft.GroupNorm takes NHWC input only and has no CPU kernel, so an NCHW graph has no
ORT op to go to: the reason is reported and the grouped LayerNorm inside (if decomposed) is fused alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from onnx_norm.dtypes import NARROW_TYPES, is_onnx_domain, type_name
from onnx_norm.ops.group_norm import ACTIVATIONS, GROUP_NORM, GROUP_NORMALIZATION, GroupNormAttributes, grouped
from onnx_norm.ops.numerics import np_dtype
from onnx_norm.ops.schema import DOMAIN, OPSET_VERSION, NormAttributes
from onnx_norm.rewrite import constants, evaluate, expansions, match
from onnx_norm.rewrite.family import FusionRule, Lowering, NormFamily
from onnx_norm.rewrite.spec import NormSpec
from onnx_norm.rewrite.structure import NearMiss

KIND = GROUP_NORM.kind
_FLOAT = int(ir.DataType.FLOAT)
#: ONNX's GroupNormalization (taken over), and the first opset whose scale and bias are per channel.
_ONNX_OP, _ONNX_OPSET = GROUP_NORMALIZATION.op_type, GROUP_NORMALIZATION.version


def _reader(value: ir.Value, op_type: str | None = None) -> ir.Node | None:
    """The one node reading `value` (of `op_type` in the default domain, if given), None if there are others or
    `value` is a graph output."""
    uses = list(value.uses())
    if value.is_graph_output() or len(uses) != 1:
        return None
    node = uses[0].node
    if op_type is not None and (node.op_type != op_type or not is_onnx_domain(node.domain)):
        return None
    return node


def _groups(anchor: ir.Node) -> tuple[ir.Value, ir.Value, int] | None:
    """(X, the grouped value, G) when `anchor` is Reshape(X [N, C, ...], [N or 0, G, ...]) with G dividing a
    static C; the proof checks the rest of the split."""
    if anchor.op_type != "Reshape" or len(anchor.inputs) < 2 or anchor.inputs[0] is None:
        return None
    x, grouped_value = anchor.inputs[0], anchor.outputs[0]
    target = constants.int_list(anchor.inputs[1])
    if x.shape is None or len(x.shape) < 3 or target is None or len(target) < 3:
        return None
    channels, g = x.shape[1], target[1]
    if not isinstance(channels, int) or g < 1 or channels % g or target[0] not in (0, -1, x.shape[0]):
        return None
    if target[0] == -1 and -1 in target[1:]:
        return None
    return x, grouped_value, g


def _instance_norm(grouped_value: ir.Value) -> tuple[list[ir.Node], ir.Value, float] | None:
    """(nodes, normalised value, epsilon) of InstanceNormalization(grouped, ones, zeros)."""
    node = _reader(grouped_value, "InstanceNormalization")
    if node is None or len(node.inputs) != 3:
        return None
    scale, bias = (constants.constant_array(v) for v in node.inputs[1:])
    if scale is None or bias is None:
        raise NearMiss("the InstanceNormalization inside the GroupNorm has a scale or bias that is not constant")
    if not (np.all(scale == 1) and np.all(bias == 0)):
        raise NearMiss("the InstanceNormalization inside the GroupNorm has a per-group affine (not fused)")
    eps = node.attributes.get("epsilon")
    return [node], node.outputs[0], 1e-5 if eps is None else float(eps.value)


def _decomposed(grouped_value: ir.Value) -> tuple[list[ir.Node], ir.Value, float] | None:
    """(nodes, normalised value, epsilon) of a LayerNorm over the trailing dims of `grouped_value`, spelled out:
    the Reshape back to X's shape is found first, the norm ending in front of it by the shared matcher."""
    seen: set[ir.Node] = set()
    frontier = [use.node for use in grouped_value.uses()]
    while frontier and len(seen) < 32:
        node = frontier.pop(0)
        if node in seen:
            continue
        seen.add(node)
        if node.op_type == "Reshape" and node.inputs[0] is not grouped_value:
            end = node.inputs[0].producer() if node.inputs[0] is not None else None
            return None if end is None else _inner_norm(end, grouped_value)
        frontier += [use.node for out in node.outputs for use in out.uses()]
    return None


def _inner_norm(end: ir.Node, grouped_value: ir.Value) -> tuple[list[ir.Node], ir.Value, float] | None:
    try:
        inner = match.find_norm(end, kinds=frozenset({"layer"}), channels_first=False)
    except NearMiss:
        return None  # the LayerNorm family reports it when it meets the norm itself
    if inner is None or inner.spec.skip is not None or inner.spec.x is not grouped_value:
        return None
    spec = inner.spec
    if spec.scale is not None or spec.bias is not None or spec.mean is not None or spec.inv_std is not None:
        return None
    if spec.attrs.unsupported_by(GROUP_NORM):  # epsilon outside the square root: the LayerNorm it is stays fused
        return None
    rank = len(grouped_value.shape) if grouped_value.shape is not None else None
    if rank is None or tuple(inner.axes) != tuple(range(2, rank)):
        return None
    return list(inner.nodes), spec.y, float(spec.attrs.epsilon)


def _per_channel(value: ir.Value, channels: int, rank: int, axis: int = 1) -> np.ndarray | None:
    """The constant `value` as [C] when it is one value per channel (dim `axis`, 1 for NCHW) or a scalar."""
    array = constants.constant_array(value)
    if array is None or array.ndim > rank:
        return None
    if array.size == 1:
        return np.full(channels, array.reshape(()), dtype=array.dtype)
    shape = (1,) * (rank - array.ndim) + array.shape
    if array.size != channels or shape[axis] != channels:
        return None
    return array.reshape(channels)


def _affine(y: ir.Value, channels: int, rank: int, axis: int = 1) -> tuple[list[ir.Node], ir.Value, dict, dict]:
    """The per-channel Mul and Add after the Reshape back: (nodes, their output, spec fields, new constants)."""
    nodes: list[ir.Node] = []
    fields: dict[str, ir.Value] = {}
    made: dict[str, np.ndarray] = {}
    for name, op_type in (("scale", "Mul"), ("bias", "Add")):
        node = _reader(y, op_type)
        if node is None or len(node.inputs) != 2:
            continue
        a, b = node.inputs
        param = b if a is y else a
        row = None if param is None else _per_channel(param, channels, rank, axis)
        if row is None or param is None:
            continue
        nodes.append(node)
        fields[name], made[name] = param, row
        y = node.outputs[0]
    return nodes, y, fields, made


def _silu(y: ir.Value) -> tuple[list[ir.Node], ir.Value] | None:
    """(nodes, output) of y * Sigmoid(y), the two read nothing else."""
    uses = [use.node for use in y.uses()]
    if y.is_graph_output() or len(uses) != 2:
        return None
    sigmoid = next((n for n in uses if n.op_type == "Sigmoid" and is_onnx_domain(n.domain)), None)
    mul = next((n for n in uses if n.op_type == "Mul" and is_onnx_domain(n.domain)), None)
    if sigmoid is None or mul is None or _reader(sigmoid.outputs[0]) is not mul:
        return None
    if set(mul.inputs) != {y, sigmoid.outputs[0]}:
        return None
    return [sigmoid, mul], mul.outputs[0]


def _widening_cast(y: ir.Value) -> tuple[list[ir.Node], ir.Value, int]:
    """([the Cast], its output, float32) when the only reader of a float16/bfloat16 `y` is a Cast to float32 (the
    last norm of a model converted to float16 with float32 outputs): the fused op then writes float32 directly,
    as casts.op_rounding has the other families' ops do; ([], y, 0) otherwise."""
    uses = list(y.uses())
    if y.dtype is None or int(y.dtype) not in NARROW_TYPES or y.is_graph_output() or len(uses) != 1:
        return [], y, 0
    node = uses[0].node
    if node.op_type != "Cast" or not is_onnx_domain(node.domain) or node.attributes["to"].value != _FLOAT:
        return [], y, 0
    return [node], node.outputs[0], _FLOAT


def _epilogue(y: ir.Value) -> tuple[list[ir.Node], ir.Value, bool, int]:
    """What the fused op takes after the affine: (nodes, their output, SiLU or not, output_type). A SiLU
    (`_silu`), or a Cast of a float32 `y` to float16/bfloat16 and the SiLU after it (Keras' mixed_float16 policy: the
    norm in float32, the swish in float16; the op computes the SiLU in float32 and rounds once, output_type the
    narrow type); then a Cast of a narrow result to float32 (`_widening_cast`)."""
    found = _silu(y)
    uses = list(y.uses())
    if found is None and y.dtype == ir.DataType.FLOAT and not y.is_graph_output() and len(uses) == 1:
        cast = uses[0].node
        to = cast.attributes.get("to")
        narrowed = _silu(cast.outputs[0]) if cast.op_type == "Cast" and is_onnx_domain(cast.domain) else None
        if narrowed is not None and to is not None and to.value in NARROW_TYPES:
            return [cast, *narrowed[0]], narrowed[1], True, int(to.value)
    nodes, y = found if found is not None else ([], y)
    cast_nodes, y, output_type = _widening_cast(y)
    return [*nodes, *cast_nodes], y, found is not None, output_type


def _channels_last_groups(anchor: ir.Node) -> tuple[ir.Value, ir.Value, int] | None:
    """(X, the grouped value, G) when `anchor` is Reshape(X [N, ..., C], [N, 0 or -1, ..., G, C/G]): the groups
    split off the last dim, as Keras' GroupNormalization writes it (channels last)."""
    if anchor.op_type != "Reshape" or len(anchor.inputs) < 2 or anchor.inputs[0] is None:
        return None
    x, grouped_value = anchor.inputs[0], anchor.outputs[0]
    target = constants.int_list(anchor.inputs[1])
    if target is None and grouped_value.shape is not None and x.shape is not None:  # jax2onnx: X's Shape + [G, C/G]
        same = zip(list(grouped_value.shape)[: len(x.shape) - 1], list(x.shape)[:-1], strict=False)
        target = [d if isinstance(d, int) else 0 if d == x_dim else -2 for d, x_dim in same]
        target += [d if isinstance(d, int) else -2 for d in list(grouped_value.shape)[len(x.shape) - 1 :]]
    if x.shape is None or len(x.shape) < 3 or target is None or len(target) != len(x.shape) + 1:
        return None
    dims = list(x.shape)
    channels, g = dims[-1], target[-2]
    if not isinstance(channels, int) or g < 1 or g * target[-1] != channels or target[0] not in (0, -1, dims[0]):
        return None
    if any(t not in (0, d) for t, d in zip(target[1:-2], dims[1:-1], strict=True)):
        return None
    return x, grouped_value, g


def _region(grouped_value: ir.Value) -> tuple[list[ir.Node], ir.Node] | None:
    """(nodes, the Reshape back) of everything computed from the grouped value (and constants) alone up to one
    Reshape back to X's rank; None when a node reads anything else or something outside reads inside it."""
    nodes: list[ir.Node] = []
    backs: set[ir.Node] = set()
    frontier = [use.node for use in grouped_value.uses()]
    rank = len(grouped_value.shape) if grouped_value.shape is not None else 0
    while frontier and len(nodes) < 40:
        node = frontier.pop(0)
        if node in nodes or node in backs:
            continue
        out = node.outputs[0]
        if node.op_type == "Reshape" and node.inputs[0] is not grouped_value and len(out.shape or ()) == rank - 1:
            backs.add(node)
            continue
        nodes.append(node)
        frontier += [use.node for value in node.outputs for use in value.uses()]
    if len(backs) != 1 or frontier:
        return None
    (back,) = backs
    inside = {grouped_value, *(v for n in nodes for v in n.outputs)}
    for node in nodes:
        if any(v is not None and v not in inside and constants.constant_array(v) is None for v in node.inputs):
            return None
        for value in node.outputs:
            if value.is_graph_output() or any(u.node not in nodes and u.node is not back for u in value.uses()):
                return None
    return nodes, back


def _reduce_axes(node: ir.Node, rank: int) -> set[int] | None:
    attr = node.attributes.get("axes")
    axes = (
        list(attr.value) if attr is not None else constants.int_list(node.inputs[1] if len(node.inputs) > 1 else None)
    )
    return None if axes is None else {a % rank for a in axes}


def _channels_last_parts(nodes: list[ir.Node], rank: int, channels: int) -> tuple[dict, float] | None:
    """({"scale"/"bias": constant value}, epsilon) of the grouped statistics and affine (gamma and beta shaped
    [.., G, C/G]); None unless every ReduceMean reduces all but the batch and group dims, one scalar is added (the
    epsilon) and at most one per-channel constant is multiplied and one added. The proof checks the arithmetic."""
    expected = set(range(1, rank)) - {rank - 2}
    reduces = [n for n in nodes if n.op_type == "ReduceMean"]
    if len(reduces) < 2 or any(_reduce_axes(n, rank) != expected for n in reduces):
        return None
    inside = {v for n in nodes for v in n.outputs}
    fields: dict[str, ir.Value] = {}
    eps: list[float] = []
    for node in nodes:
        for value in node.inputs:
            array = None if value is None or value in inside else constants.constant_array(value)
            if array is None or node.op_type not in ("Mul", "Add"):
                continue
            if array.size == 1 and node.op_type == "Add":
                eps.append(float(array.reshape(())))
            elif array.size == channels:
                key = "scale" if node.op_type == "Mul" else "bias"
                if key in fields:
                    return None
                fields[key] = value
    return (fields, eps[0]) if len(eps) == 1 else None


def _find_channels_last(anchor: ir.Node) -> match.Candidate | None:
    """A GroupNorm over channels-last X (tf2onnx's Keras GroupNormalization, jax2onnx's flax GroupNorm): fused
    between Transposes."""
    found = _channels_last_groups(anchor)
    region = None if found is None else _region(found[1])
    if found is None or region is None:
        return None
    x, _, g = found
    nodes, back = region
    assert x.shape is not None
    rank, channels = len(x.shape), int(x.shape[-1])
    parts = _channels_last_parts(nodes, rank + 1, channels)
    if parts is None:
        return None
    fields, eps = parts
    y = back.outputs[0]
    if y.shape is None or len(y.shape) != rank or y.shape[-1] != channels:
        raise NearMiss("the Reshape after the channels-last grouped norm does not restore X's shape", y)
    dtype = x.dtype.numpy() if x.dtype is not None else np.float32
    made = {"scale": np.ones(channels, dtype), "bias": np.zeros(channels, dtype)}  # the onnx target needs both
    made |= {k: constants.constant_array(v).reshape(channels) for k, v in fields.items()}  # type: ignore[union-attr]
    tail: list[ir.Node] = []
    if not fields:  # jax2onnx (flax GroupNorm): the affine after the Reshape back
        tail, y, fields, after = _affine(y, channels, rank, rank - 1)
        made |= after
    after, y, silu, output_type = _epilogue(y)
    attrs = GroupNormAttributes(
        axis=1 - rank, epsilon=eps, num_groups=g, activation=ACTIVATIONS["silu" if silu else "none"]
    )
    spec = _spec(x, fields, dataclasses.replace(attrs, output_type=output_type), y)
    return match.Candidate(
        spec=spec,
        nodes=[anchor, *nodes, back, *tail, *after],
        axes=tuple(range(1, rank)),
        perm=(0, rank - 1, *range(1, rank - 1)),
        new_constants=made,
        variant="grouped channels-last decomposed" + (" + SiLU" if silu else ""),
        cast_placement=f"{type_name(x.dtype)} in",
        x_value=x,
        # onnxconverter-common's float16 conversion (keep_io_types) casts an input once per reader: a dynamic batch's
        # Reshape back reads X's Shape through a twin of X's Cast, which the proof feeds X's values.
        aliases=match.twin_casts(x),
    )


def _restores(back: ir.Node, x: ir.Value) -> bool:
    """The Reshape `back` gives X's shape: as inferred, or by its target being Shape(X) or Shape of a twin Cast of X
    (onnxconverter-common's float16 conversion drops the exporters' inferred shapes, and ONNX's shape inference
    names the dims of a Reshape to a computed shape anew)."""
    y = back.outputs[0]
    if y.shape is not None and x.shape is not None and list(y.shape) == list(x.shape):
        return True
    target = back.inputs[1] if len(back.inputs) > 1 else None
    shape = None if target is None else target.producer()
    if shape is None or shape.op_type != "Shape" or not is_onnx_domain(shape.domain):
        return False
    start, end = shape.attributes.get("start"), shape.attributes.get("end")  # dynamo writes start=0
    if (start is not None and start.value != 0) or end is not None:
        return False
    return shape.inputs[0] is x or shape.inputs[0] in match.twin_casts(x)


def _spec(x: ir.Value, fields: dict, attrs: GroupNormAttributes, y: ir.Value) -> NormSpec:
    """The fused op rounds once, at its output (casts.op_rounding, as the other families' ops): a float16/bfloat16
    graph also rounds the normalised value, the affine and the activation to X's type (`graph_attrs`), but neither
    the float64 result nor ONNX Runtime's CPU run of the graph (its float16 ops run in float32 between Casts it
    removes) has those roundings, and reproducing them made a float16-converted Keras GroupNorm 2x farther from
    float64 in mean than the original (docs/accuracy.md). The proof checks both the rounding and the accuracy."""
    spec = NormSpec(KIND, x, None, fields.get("scale"), fields.get("bias"), attrs, y)
    t = int(x.dtype) if x.dtype is not None else 0
    if t in NARROW_TYPES:
        spec.graph_attrs = dataclasses.replace(attrs, normalized_type=t, multiply_type=t)
    return spec


def find(anchor: ir.Node) -> match.Candidate | None:
    """The GroupNorm starting at the Reshape `anchor` that splits X's channels into groups."""
    found = _groups(anchor)
    if found is None:
        return _find_channels_last(anchor)
    x, grouped_value, g = found
    norm = _instance_norm(grouped_value) or _decomposed(grouped_value)
    if norm is None:
        return _find_channels_last(anchor)
    nodes, n, eps = norm
    assert x.shape is not None
    rank, channels = len(x.shape), int(x.shape[1])
    back = _reader(n, "Reshape")
    if back is not None:
        y = back.outputs[0]
        if not _restores(back, x):
            raise NearMiss("the Reshape after the grouped norm does not restore X's shape (or its shape is unknown)", y)
        nodes = [*nodes, back]
    elif rank == 3 and g == channels:
        y = n  # one group per channel of [N, C, L]: the grouped value is X's shape, dynamo drops the Reshape back
    else:
        return None
    affine_nodes, y, fields, made = _affine(y, channels, rank)
    after, y, silu, output_type = _epilogue(y)
    activation = ACTIVATIONS["silu" if silu else "none"]
    attrs = GroupNormAttributes(
        axis=1 - rank, epsilon=eps, num_groups=g, activation=activation, output_type=output_type
    )
    spec = _spec(x, fields, attrs, y)
    variant = "InstanceNormalization" if nodes[0].op_type == "InstanceNormalization" else "decomposed"
    return match.Candidate(
        spec=spec,
        nodes=[anchor, *nodes, *affine_nodes, *after],
        axes=tuple(range(1, rank)),
        perm=None,
        new_constants=made,
        variant=f"grouped {variant}" + (" + SiLU" if silu else ""),
        cast_placement=f"{type_name(x.dtype)} in",
        x_value=x,
        aliases=match.twin_casts(x),
    )


def reference(
    x: np.ndarray, params: Mapping[str, np.ndarray | None], attrs: NormAttributes
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The float64 reference (ops.group_norm.grouped) on the matched parameters, whatever their shape."""
    assert isinstance(attrs, GroupNormAttributes)
    channels = x.shape[1]
    scale, bias = (
        None if v is None else np.broadcast_to(np.asarray(v).reshape(-1), (channels,))
        for v in (params.get("scale"), params.get("bias"))
    )
    y, inv, mean = grouped(x, scale, bias, attrs)
    out_dtype = np_dtype(attrs.output_type) if attrs.output_type else x.dtype
    return y.astype(np.float32).astype(out_dtype), inv, mean


def _emit_onnx_norm(op, spec: NormSpec, opset: int) -> list[ir.Value]:
    inputs = [spec.x, spec.scale, spec.bias]
    while inputs[-1] is None:
        inputs.pop()
    if len({v.dtype for v in inputs[1:] if v is not None}) > 1:  # one declared type for Scale and Bias
        inputs = [inputs[0], *(None if v is None else op.Cast(v, to=_FLOAT) for v in inputs[1:])]
    attrs, y_cast = spec.attrs, 0
    # The library types Y like X (rewrite/targets.py), so another Y type is written as the other families write it:
    if attrs.output_type == _FLOAT and spec.x.dtype != ir.DataType.FLOAT:
        # float32 Y from a narrower X: the op on X widened (exact: the kernels compute from the widened X anyway)
        x = op.Cast(spec.x, to=_FLOAT)
        x.type, x.shape = ir.TensorType(ir.DataType.FLOAT), spec.x.shape  # the model-local function reads X's type
        inputs[0], attrs = x, dataclasses.replace(attrs, output_type=0)
    elif attrs.output_type and spec.x.dtype == ir.DataType.FLOAT:
        # a narrow Y from float32 X: the float32 result, then a Cast (the one rounding the op would make)
        attrs, y_cast = dataclasses.replace(attrs, output_type=0), attrs.output_type
    y = op.op(GROUP_NORM.name, *inputs, _domain=DOMAIN, _version=OPSET_VERSION, **attrs.as_dict())
    return [op.Cast(y, to=y_cast) if y_cast else y]


def _unsupported_onnx_norm(spec: NormSpec, opset: int) -> str | None:
    if spec.x.dtype is None or int(spec.x.dtype) not in (_FLOAT, *NARROW_TYPES):
        return f"X of type {type_name(spec.x.dtype)}: the GroupNorm op takes fp32, fp16 or bf16"
    return None


def _emit_onnx(op, spec: NormSpec, opset: int) -> list[ir.Value]:
    """InstanceNormalization over X viewed as [N, G, -1] (scale ones[G], bias zeros[G]), reshaped back to X's own
    Shape, then Mul and Add by the per-channel scale and bias as [C, 1, ...] (each only when the graph has it), then
    Sigmoid and Mul for SiLU: torch's own export of GroupNorm, which ONNX Runtime runs faster than its
    GroupNormalization-21 kernel (docs/targets.md), and valid from opset 6."""
    assert isinstance(spec.attrs, GroupNormAttributes) and spec.x.dtype is not None
    a, dtype = spec.attrs, spec.x.dtype.numpy()
    rank, g = 1 - a.axis, a.num_groups

    def const(array: np.ndarray) -> ir.Value:
        return op.Constant(value=ir.tensor(array))

    grouped_x = op.Reshape(spec.x, const(np.array([0, g, -1], np.int64)))
    ones, zeros = const(np.ones(g, dtype)), const(np.zeros(g, dtype))
    y = op.InstanceNormalization(grouped_x, ones, zeros, epsilon=float(a.epsilon))
    y = op.Reshape(y, op.Shape(spec.x))
    column = const(np.array([-1] + [1] * (rank - 2), np.int64))
    for param, combine in ((spec.scale, op.Mul), (spec.bias, op.Add)):
        if param is None:
            continue
        typed = param if param.dtype == spec.x.dtype else op.Cast(param, to=int(spec.x.dtype))
        y = combine(y, op.Reshape(typed, column))
    if a.activation == ACTIVATIONS["silu"]:
        y = op.Mul(y, op.Sigmoid(y))
    if a.output_type:
        y = op.Cast(y, to=a.output_type)
    return [y]


def _already_instance_normalization(x: ir.Value) -> bool:
    """Whether X is normalised by an InstanceNormalization already, directly or through a Reshape that only it reads
    (torch's export): the form the onnx target writes."""
    readers = [use.node for use in x.uses() if is_onnx_domain(use.node.domain)]
    if any(node.op_type == "InstanceNormalization" for node in readers):
        return True
    return any(node.op_type == "Reshape" and _reader(node.outputs[0], "InstanceNormalization") for node in readers)


def _unsupported_onnx(spec: NormSpec, opset: int) -> str | None:
    if _already_instance_normalization(spec.x):
        # Measured: ONNX Runtime's GroupNormalization-21 is slower than its InstanceNormalization (docs/targets.md).
        return "already ONNX's InstanceNormalization form; rewriting it would not change the ops"
    a = spec.graph_attrs or spec.attrs  # InstanceNormalization, Mul and Add each round to X's type, as the graph does
    t = int(spec.x.dtype) if spec.x.dtype is not None else 0
    rounds_like_onnx = (a.normalized_type, a.multiply_type) == ((t, t) if t in NARROW_TYPES else (0, 0))
    if not rounds_like_onnx:
        return "InstanceNormalization and the affine Mul and Add round to X's type after each step, the graph does not"
    return None


def read_native(node: ir.Node, opset: int) -> NormSpec:
    """ONNX GroupNormalization-21 (per-channel scale and bias) as the take-over reads it: statistics in float32,
    Y rounded once (its function body rounds after the normalisation and each affine step; ONNX Runtime's kernel
    and ours round once, never less accurate). ValueError says why a node is left as it is."""
    if opset and opset < _ONNX_OPSET:
        raise ValueError(f"GroupNormalization before opset {_ONNX_OPSET} scales per group (deprecated); not taken over")
    x = _native_input(node)
    stash = node.attributes.get("stash_type")
    if stash is not None and stash.value != _FLOAT:
        raise ValueError(f"stash_type {stash.value} computes the statistics in another type than float32")
    groups, eps = node.attributes.get("num_groups"), node.attributes.get("epsilon")
    if groups is None or groups.value < 1 or x.shape[1] % groups.value:
        raise ValueError("its num_groups is missing or does not divide the channels")
    epsilon = 1e-5 if eps is None else float(eps.value)
    attrs = GroupNormAttributes(axis=1 - len(x.shape), epsilon=epsilon, num_groups=int(groups.value))
    return NormSpec(KIND, x, None, node.inputs[1], node.inputs[2], attrs, node.outputs[0])


def _native_input(node: ir.Node) -> ir.Value:
    """X of a native GroupNormalization or InstanceNormalization: its three inputs given, X float, its rank and
    channel count known; ValueError otherwise."""
    x = node.inputs[0] if node.inputs else None
    if x is None or len(node.inputs) != 3 or None in node.inputs:
        raise ValueError("it does not have its three inputs")
    if x.dtype is None or int(x.dtype) not in (_FLOAT, *NARROW_TYPES):
        raise ValueError(f"input element type {type_name(x.dtype)} is not fp32, fp16 or bf16")
    if x.shape is None or len(x.shape) < 3 or not isinstance(x.shape[1], int):
        raise ValueError("its input's rank or channel count is unknown (run shape inference first)")
    return x


def read_instance_normalization(node: ir.Node, opset: int) -> NormSpec:
    """ONNX InstanceNormalization (each channel of each sample normalised over the dims after it, per-channel scale
    and bias) is GroupNorm with one group per channel, and is taken over as that; ValueError says why not."""
    x = _native_input(node)
    assert x.shape is not None
    eps = node.attributes.get("epsilon")
    epsilon = 1e-5 if eps is None else float(eps.value)
    attrs = GroupNormAttributes(axis=1 - len(x.shape), epsilon=epsilon, num_groups=int(x.shape[1]))
    return NormSpec(KIND, x, None, node.inputs[1], node.inputs[2], attrs, node.outputs[0])


_ORT_REASON = (
    "ONNX Runtime's com.microsoft.GroupNorm takes NHWC input (channels_last) and has CUDA kernels only; an NCHW "
    "graph would need Transposes around it and could not run on the CPU provider"
)

FAMILY = NormFamily(
    kind=KIND,
    summary="GroupNorm: x split into groups along its channels, each normalised, then per-channel scale and bias",
    rules=(FusionRule("group_norm", KIND), FusionRule("group_norm_channels_last", KIND, channels_first=True)),
    reference=reference,
    lowerings={
        "onnx-norm": Lowering(emit=_emit_onnx_norm, unsupported=_unsupported_onnx_norm),
        "onnx": Lowering(emit=_emit_onnx, unsupported=_unsupported_onnx),
        "ort": _ORT_REASON,
    },
    find=find,
    anchor_ops=frozenset({"Reshape"}),
    sweep=-1,  # before the LayerNorm family fuses the grouped norm inside
    native={_ONNX_OP: read_native, "InstanceNormalization": read_instance_normalization},
)


def _instance_normalization(node: ir.Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    """ONNX InstanceNormalization: each (sample, channel) over the dims after the channel, float64 statistics."""
    x, scale, bias = inputs
    assert x is not None and scale is not None and bias is not None
    eps = node.attributes.get("epsilon")
    epsilon = np.float64(np.float32(1e-5 if eps is None else eps.value))
    xf = x.astype(np.float64)
    axes = tuple(range(2, x.ndim))
    mean = xf.mean(axis=axes, keepdims=True)
    var = np.mean((xf - mean) ** 2, axis=axes, keepdims=True)
    column = (1, -1) + (1,) * (x.ndim - 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = (xf - mean) / np.sqrt(var + epsilon) * scale.astype(np.float64).reshape(column)
    y = y + bias.astype(np.float64).reshape(column)
    return y.astype(np.float32).astype(x.dtype) if x.dtype != np.float64 else y


def _instance_normalization_float64(node: onnx.NodeProto, prefix: str, opset: int) -> list[onnx.NodeProto]:
    """InstanceNormalization(X, scale, B) in float64 ops for the parity gate's float64 model (ORT has no double
    kernel; a float32 island would be the original's own rounding): X viewed as [N, C, L], normalised over L, scale
    and B as [C, 1], the result reshaped to X's shape."""
    x, scale, bias = node.input
    eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
    p = prefix
    nodes = [
        expansions.constant(f"{p}flat", np.array([0, 0, -1], np.int64)),
        expansions.constant(f"{p}column", np.array([-1, 1], np.int64)),
        # The attribute's float32 value, widened: what every float32 kernel adds.
        expansions.constant(f"{p}eps", np.array(np.float32(eps), np.float64)),
        helper.make_node("Shape", [x], [f"{p}shape"]),
        helper.make_node("Reshape", [x, f"{p}flat"], [f"{p}rows"]),
    ]
    nodes += expansions.reduce_mean(f"{p}rows", f"{p}mean", [2], f"{p}m_", opset)
    nodes += [
        helper.make_node("Sub", [f"{p}rows", f"{p}mean"], [f"{p}centred"]),
        helper.make_node("Mul", [f"{p}centred", f"{p}centred"], [f"{p}square"]),
    ]
    nodes += expansions.reduce_mean(f"{p}square", f"{p}var", [2], f"{p}v_", opset)
    nodes += [
        helper.make_node("Add", [f"{p}var", f"{p}eps"], [f"{p}var_eps"]),
        helper.make_node("Sqrt", [f"{p}var_eps"], [f"{p}std"]),
        helper.make_node("Div", [f"{p}centred", f"{p}std"], [f"{p}normalised"]),
        helper.make_node("Reshape", [scale, f"{p}column"], [f"{p}scale"]),
        helper.make_node("Reshape", [bias, f"{p}column"], [f"{p}bias"]),
        helper.make_node("Mul", [f"{p}normalised", f"{p}scale"], [f"{p}scaled"]),
        helper.make_node("Add", [f"{p}scaled", f"{p}bias"], [f"{p}shifted"]),
        helper.make_node("Reshape", [f"{p}shifted", f"{p}shape"], [node.output[0]]),
    ]
    return nodes


# The proof evaluates the matched subgraph: it has to know the ops this family's matches contain; the parity gate's
# float64 model has to compute InstanceNormalization in float64.
evaluate.register_op("InstanceNormalization", _instance_normalization)
expansions.register("InstanceNormalization", _instance_normalization_float64)
