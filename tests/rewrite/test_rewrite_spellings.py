"""Spellings that only some exporters write, each written out as an ONNX graph in the exporter's form: fused into
the right op with the original's numbers.

- `Identity` nodes between the residual `Add` and the norm (a PP-OCRv6 text recogniser's export): Identity moves data,
  so the Skip fold looks through the chain, the sum staying an output wherever the Add or an Identity is read again.
- Flax's LayerNorm as jax2tf + tf2onnx write it: statistics reduced with `keepdims=0`, restored by a Reshape (and an
  Expand) to a shape computed from `Shape(x)`, the variance clamped by `Max(0, var)` before or after its Reshape.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import helper
from rewrite_support import FLOAT, assert_fused, assert_not_fused, const, fused_ops, layer_nodes, make_model

D = 16
rng = np.random.default_rng(7)
W = (rng.random(D) + 0.5).astype(np.float32)
B = rng.standard_normal(D).astype(np.float32)
ADDENDS = [("a", FLOAT, ["b", "s", D]), ("r", FLOAT, ["b", "s", D])]
ADDEND_SHAPES = {"a": [2, 3, D], "r": [2, 3, D]}


def _residual_through_identities(reader: str | None, identities: int = 2) -> onnx.ModelProto:
    """`h = a + r`, `Identity` `identities` times, a LayerNorm with scale and bias; `reader` (h, an Identity's
    output, or None) is read again after the norm, as the residual stream of a pre-norm block is."""
    names = ["h"] + [f"i{k}" for k in range(1, identities + 1)]
    nodes = [helper.make_node("Add", ["a", "r"], ["h"])]
    nodes += [helper.make_node("Identity", [src], [dst]) for src, dst in itertools.pairwise(names)]
    nodes += layer_nodes(names[-1], "y", scale="w", bias="bias")
    outputs = [("y", FLOAT, None)]
    if reader is not None:
        nodes.append(helper.make_node("Add", [reader, "y"], ["z"]))
        outputs = [("z", FLOAT, None)]
    inits = [const("eps", 1e-5, np.float32), const("w", W), const("bias", B)]
    return make_model(nodes, ADDENDS, outputs, inits)


@pytest.mark.parametrize("reader", [None, "h", "i1", "i2"])
def test_identities_between_the_residual_add_and_the_norm(reader):
    model = _residual_through_identities(reader)
    optimized, report = assert_fused(model, ADDEND_SHAPES, ["SkipLayerNorm"])
    assert report.norms[0].rule == "skip_layer_norm"
    assert report.norms[0].residual_sum_kept == (reader is not None)
    ops = [n.op_type for n in optimized.graph.node]
    assert "LayerNorm" not in fused_ops(optimized) and ops.count("Add") == (reader is not None)
    # The Identities stay only where something reads them, re-made from the fused op's Sum output.
    assert ops.count("Identity") == {None: 0, "h": 0, "i1": 1, "i2": 2}[reader], ops


def test_a_single_identity_before_a_plain_norm_is_read_through():
    """No residual Add: the norm reads the Identity's input, and the Identity is gone."""
    nodes = [helper.make_node("Identity", ["x"], ["i"]), *layer_nodes("i", "y", scale="w", bias="bias")]
    inits = [const("eps", 1e-5, np.float32), const("w", W), const("bias", B)]
    model = make_model(nodes, [("x", FLOAT, ["b", "s", D])], [("y", FLOAT, None)], inits)
    optimized, _ = assert_fused(model, {"x": [2, 3, D]}, ["LayerNorm"])
    assert [n.op_type for n in optimized.graph.node] == ["LayerNorm"]


def _restore(value: str, out: str, prefix: str, expand: bool) -> list[onnx.NodeProto]:
    """`value` (reduced over the last axis, dims dropped) reshaped to `x.shape[:-1] + [1]`, computed from `x`'s
    shape as jax2tf writes `expand_dims` for a polymorphic batch; `expand`: then broadcast to `x`'s shape
    (`broadcast_in_dim`)."""
    nodes = [
        helper.make_node("Shape", ["x"], [f"{prefix}shape"]),
        helper.make_node("Slice", [f"{prefix}shape", "zero", "minus_one"], [f"{prefix}lead"]),
        helper.make_node("Concat", [f"{prefix}lead", "one_dim"], [f"{prefix}target"], axis=0),
        helper.make_node("Reshape", [value, f"{prefix}target"], [f"{out}_kept" if expand else out]),
    ]
    if expand:
        nodes.append(helper.make_node("Expand", [f"{out}_kept", f"{prefix}shape"], [out]))
    return nodes


def _row_mean(src: str, out: str, reduce: str) -> list[onnx.NodeProto]:
    """`jnp.mean(src, -1)` with the dim dropped: ReduceMean(keepdims=0), or ReduceSum(keepdims=0) / N."""
    if reduce == "ReduceMean":
        return [helper.make_node("ReduceMean", [src], [out], axes=[-1], keepdims=0)]
    return [
        helper.make_node("ReduceSum", [src, "last_axis"], [f"{out}_sum"], keepdims=0),
        helper.make_node("Div", [f"{out}_sum", "row_size"], [out]),
    ]


def _flax_layer_norm(variance: str, clamp: str, rsqrt: str, reduce: str, expand: bool) -> onnx.ModelProto:
    """Flax's `nn.LayerNorm` as jax2tf + tf2onnx write it: the statistics reduced with their dims dropped and
    restored by a Reshape to a shape computed from `Shape(x)`, the variance `E[x^2] - E[x]^2` (`fast`, Flax's
    default) or `mean((x - mean)^2)` (`centred`), clamped by `Max(0, var)` before or after its Reshape (or not at
    all), `(x - mean) * rsqrt(var + eps)` as Sqrt + Reciprocal or a Div, then scale and bias."""
    nodes = [*_row_mean("x", "mean", reduce), *_restore("mean", "mean_r", "m_", expand)]
    if variance == "fast":
        nodes += [helper.make_node("Mul", ["x", "x"], ["x2"]), *_row_mean("x2", "mean2", reduce)]
        nodes += [helper.make_node("Mul", ["mean", "mean"], ["mean_sq"])]
        nodes += [helper.make_node("Sub", ["mean2", "mean_sq"], ["var_raw"])]
    else:
        nodes += [helper.make_node("Sub", ["x", "mean_r"], ["dv"]), helper.make_node("Mul", ["dv", "dv"], ["dv2"])]
        nodes += _row_mean("dv2", "var_raw", reduce)
    if clamp == "before_reshape":
        nodes += [helper.make_node("Max", ["zero_f", "var_raw"], ["var"]), *_restore("var", "var_r", "v_", False)]
    elif clamp == "after_reshape":
        nodes += [*_restore("var_raw", "var_u", "v_", False), helper.make_node("Max", ["zero_f", "var_u"], ["var_r"])]
    else:
        nodes += _restore("var_raw", "var_r", "v_", False)
    nodes += [helper.make_node("Sub", ["x", "mean_r"], ["d"]), helper.make_node("Add", ["var_r", "eps"], ["ve"])]
    nodes.append(helper.make_node("Sqrt", ["ve"], ["s"]))
    if rsqrt == "reciprocal":
        nodes += [helper.make_node("Reciprocal", ["s"], ["inv"]), helper.make_node("Mul", ["d", "inv"], ["n"])]
    else:
        nodes.append(helper.make_node("Div", ["d", "s"], ["n"]))
    nodes += [helper.make_node("Mul", ["n", "w"], ["nw"]), helper.make_node("Add", ["nw", "bias"], ["y"])]
    inits = [
        const("zero", [0], np.int64),
        const("minus_one", [-1], np.int64),
        const("one_dim", [1], np.int64),
        const("last_axis", [-1], np.int64),
        const("row_size", float(D), np.float32),
        const("zero_f", 0.0, np.float32),
        const("eps", 1e-6, np.float32),
        const("w", W),
        const("bias", B),
    ]
    return make_model(nodes, [("x", FLOAT, ["b", "s", D])], [("y", FLOAT, None)], inits, opset=15)


@pytest.mark.parametrize("variance", ["fast", "centred"])
@pytest.mark.parametrize("clamp", ["before_reshape", "after_reshape", "none"])
@pytest.mark.parametrize("rsqrt", ["reciprocal", "div"])
def test_flax_layer_norm_as_jax2tf_writes_it(variance, clamp, rsqrt):
    model = _flax_layer_norm(variance, clamp, rsqrt, "ReduceMean", expand=False)
    optimized, report = assert_fused(model, {"x": [2, 3, D]}, ["LayerNorm"])
    assert len(report.norms) == 1 and report.near_misses == []
    assert [n.op_type for n in optimized.graph.node] == ["LayerNorm"]


@pytest.mark.parametrize("variance", ["fast", "centred"])
def test_flax_layer_norm_with_sums_and_a_broadcast_mean(variance):
    """`jnp.mean` as `ReduceSum / N` (dims dropped), the mean broadcast to x's shape after its Reshape."""
    model = _flax_layer_norm(variance, "before_reshape", "div", "ReduceSum", expand=True)
    assert_fused(model, {"x": [2, 3, D]}, ["LayerNorm"])


@pytest.mark.parametrize("change", ["clamp_above_zero", "clamped_mean"])
def test_flax_look_alikes_are_left_alone(change):
    """A clamp that can change the variance (at 0.5, not 0) or one of the mean (which may be negative) is no
    LayerNorm: nothing is fused and the outputs stay the original's."""
    model = _flax_layer_norm("fast", "before_reshape", "div", "ReduceMean", expand=False)
    graph = model.graph
    if change == "clamp_above_zero":
        next(i for i in graph.initializer if i.name == "zero_f").CopyFrom(const("zero_f", 0.5, np.float32))
    else:
        at = next(k for k, n in enumerate(graph.node) if n.op_type == "Reshape" and n.input[0] == "mean")
        graph.node[at].input[0] = "mean_clamped"
        graph.node.insert(at, helper.make_node("Max", ["mean", "zero_f"], ["mean_clamped"]))
        onnx.checker.check_model(model)
    report = assert_not_fused(model, {"x": [2, 3, D]})
    assert report.near_misses, "a look-alike is reported"
