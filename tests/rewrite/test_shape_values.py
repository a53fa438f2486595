"""The shape-tensor evaluator (onnx_norm/rewrite/shape_values.py): the views TorchScript computes from `Shape` get
the dims they compute where onnx's inference leaves them unknown, a dim that depends on a runtime value stays
unknown, and a dim inference found is never overwritten by a different one."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper
from rewrite_support import FLOAT, const, make_model

from onnx_norm.rewrite import shape_pass, shape_values


def _i64(name: str, *values: int) -> onnx.TensorProto:
    return const(name, np.array(values, dtype=np.int64))


def _scalar(name: str, value: int) -> onnx.TensorProto:
    return const(name, np.array(value, dtype=np.int64))


def _dims(model: onnx.ModelProto, name: str) -> list[object]:
    """The dims of `name` after the rewrite's shape inference."""
    ir_model = ir.from_proto(model)
    shape_pass.infer_shapes(ir_model)
    value = next(v for node in ir_model.graph for v in node.outputs if v.name == name)
    assert value.shape is not None
    return [shape_values.dim_element(d) for d in value.shape]


def _group_view(divide: str = "Div", cast_to: int = onnx.TensorProto.INT64) -> list[onnx.NodeProto]:
    """`x.view(*x.shape[:-1], x.shape[-1] // 64, 64)` as TorchScript writes it, then the view back."""
    return [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "i1"], ["s"], axis=0),
        helper.make_node("Gather", ["shape", "i2"], ["d"], axis=0),
        helper.make_node(divide, ["d", "size"], ["g_raw"]),
        helper.make_node("Cast", ["g_raw"], ["g"], to=cast_to),
        *[helper.make_node("Unsqueeze", [a, "axis0"], [f"{a}_1"]) for a in ("b", "s", "g")],
        helper.make_node("Concat", ["b_1", "s_1", "g_1", "size_1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["x4"]),
        helper.make_node("Mul", ["g", "size"], ["d_again"]),
        helper.make_node("Unsqueeze", ["d_again", "axis0"], ["d_1"]),
        helper.make_node("Concat", ["b_1", "s_1", "d_1"], ["back"], axis=0),
        helper.make_node("Reshape", ["x4", "back"], ["y"]),
    ]


def _group_model(nodes: list[onnx.NodeProto], x_shape: list[object]) -> onnx.ModelProto:
    inits = [_scalar("i0", 0), _scalar("i1", 1), _scalar("i2", 2), _scalar("size", 64), _i64("size_1", 64)]
    inits.append(_i64("axis0", 0))
    return make_model(nodes, [("x", FLOAT, x_shape)], [("y", FLOAT, None)], inits, opset=18)


def test_a_group_view_computed_from_shape_gets_its_dims() -> None:
    model = _group_model(_group_view(), ["batch", "sequence", 128])
    assert _dims(model, "x4") == ["batch", "sequence", 2, 64]
    assert _dims(model, "y") == ["batch", "sequence", 128]


def test_a_division_in_floats_gives_the_integer_dim() -> None:
    """`int(d / 64)` in float: Cast to float, Div, Floor, Cast back to int64."""
    nodes = _group_view(divide="Div", cast_to=onnx.TensorProto.INT64)
    nodes[4:5] = [
        helper.make_node("Cast", ["d"], ["d_f"], to=FLOAT),
        helper.make_node("Cast", ["size"], ["size_f"], to=FLOAT),
        helper.make_node("Div", ["d_f", "size_f"], ["q"]),
        helper.make_node("Floor", ["q"], ["g_raw"]),
    ]
    assert _dims(_group_model(nodes, ["batch", "sequence", 128]), "x4") == ["batch", "sequence", 2, 64]


@pytest.mark.parametrize("unknown", [1, 2])
def test_a_dim_of_a_runtime_value_is_found_by_count_alone(unknown: int) -> None:
    """The group count read from a runtime input, not from a shape: a view holds as many elements as its input,
    which gives it when it is the only element not known; with the group size read at run time too, nothing is
    made up for either."""
    nodes = _group_view()
    nodes[4] = helper.make_node("Add", ["d", "n"], ["g_raw"])
    if unknown == 2:
        nodes[9] = helper.make_node("Concat", ["b_1", "s_1", "g_1", "g_1"], ["target"], axis=0)
    inits = [_scalar("i0", 0), _scalar("i1", 1), _scalar("i2", 2), _scalar("size", 64), _i64("size_1", 64)]
    inputs = [("x", FLOAT, ["batch", "sequence", 128]), ("n", onnx.TensorProto.INT64, [])]
    model = make_model(nodes, inputs, [("y", FLOAT, None)], [*inits, _i64("axis0", 0)], opset=18)
    dims = _dims(model, "x4")
    assert dims[:2] == ["batch", "sequence"]
    if unknown == 1:
        assert dims[2:] == [2, 64]
    else:
        assert all(d is None or str(d).startswith("unk__") for d in dims[2:])


@pytest.mark.parametrize(
    ("source", "target", "want"),
    [
        (["b", "s", 8, 16], [0, 0, -1], ["b", "s", 128]),  # 0 copies, the names cancel
        (["b", "s", 8, 16], ["b", -1], ["b", None]),  # s * 128 has no name of its own: unknown
        ([4, 6], [-1, 3], [8, 3]),
        (["b", 12], [0, 5, -1], None),  # 12 is not a multiple of 5
        (["b", "s", 128], ["s", -1], None),  # b is not cancelled by anything
    ],
)
def test_reshaped_dims(source: list[object], target: list[object], want: list[object] | None) -> None:
    got = shape_values.reshaped_dims(source, target, allowzero=False)
    if want is None:
        assert got is None or None in got
    else:
        assert got == want


def test_a_dim_inference_found_is_kept() -> None:
    """A target that disagrees with a dim inference already gave (a model whose stored shape contradicts its own
    arithmetic) leaves the value as it is."""
    model = _group_model(_group_view(), ["batch", "sequence", 128])
    value = ir.from_proto(model).graph
    x4 = next(v for node in value for v in node.outputs if v.name == "x4")
    x4.shape = ir.Shape(["batch", "sequence", 4, 32])
    assert not shape_values._merge(x4, ["batch", "sequence", 2, 64])
    assert [shape_values.dim_element(d) for d in x4.shape] == ["batch", "sequence", 4, 32]


def test_an_expand_to_a_computed_shape_broadcasts() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Concat", ["shape", "one"], ["target"], axis=0),
        helper.make_node("Unsqueeze", ["x", "last"], ["x1"]),
        helper.make_node("Expand", ["x1", "target"], ["y"]),
    ]
    inits = [_i64("one", 4), _i64("last", -1)]
    model = make_model(nodes, [("x", FLOAT, ["batch", 8])], [("y", FLOAT, [None, None, None])], inits, opset=18)
    assert _dims(model, "y") == ["batch", 8, 4]


@pytest.mark.parametrize(("a", "b", "want"), [(7, 2, 3), (-7, 2, -3), (7, -2, -3), (6, 3, 2)])
def test_integer_division_truncates_toward_zero(a: int, b: int, want: int) -> None:
    """ONNX Runtime's integer Div is C++'s: it truncates toward zero, not toward minus infinity as Python's //."""
    assert shape_values._div(a, b) == want


def test_a_target_of_another_element_count_gives_nothing() -> None:
    """TorchScript's Cohere export views 64 values as [b, s, 2, 16] (a size of the trace, folded): the runtime would
    refuse it; the view is left without dims rather than given ones that contradict its input."""
    assert shape_values.reshaped_dims(["b", "s", 64], ["b", "s", 2, 16], allowzero=False) is None
    assert shape_values.reshaped_dims(["b", "s", 64], ["b", "s", 3, 16], allowzero=False) is None
    assert shape_values.reshaped_dims(["b", "s", 64], ["b", "s", 4, 16], allowzero=False) == ["b", "s", 4, 16]


def test_a_view_sizes_the_dim_of_its_input_that_no_inference_sizes() -> None:
    """Falcon-H1's scan output `y.view(b, s, -1)` (its -1 unresolved: the scan pads the sequence) is viewed
    `[b, s, 2, 32]` from `Shape` of itself: it has 64 in its last dim, and so has the Cast it is read through."""
    nodes = [
        helper.make_node("Reshape", ["data", "flat"], ["v"]),
        helper.make_node("Cast", ["v"], ["x"], to=FLOAT),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["lead"]),
        helper.make_node("Concat", ["lead", "groups"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [_i64("flat", 0, 0, -1), _i64("zero", 0), _i64("two", 2), _i64("groups", 2, 32)]
    inputs = [("data", FLOAT, ["batch", "sequence", "padded", 4, 16])]
    model = make_model(nodes, inputs, [("y", FLOAT, ["batch", "sequence", 2, 32])], inits, opset=18)
    assert _dims(model, "y") == ["batch", "sequence", 2, 32]
    assert _dims(model, "x") == ["batch", "sequence", 64]
    assert _dims(model, "v") == ["batch", "sequence", 64]


def _declared(value_info: dict[str, list[object]]) -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info(name, FLOAT, dims) for name, dims in value_info.items()]


def test_names_onnx_lost_are_carried_through_element_wise_ops_reductions_matmul_and_split() -> None:
    """Dims onnx's inference once named `unk__N` stay so in its later rounds; the names of the inputs are carried
    through Cast, Mul, ReduceMean, MatMul and Split (each Split output keeping its own size on the split axis)."""
    nodes = [
        helper.make_node("Cast", ["x"], ["c"], to=FLOAT),
        helper.make_node("ReduceMean", ["c"], ["m"], axes=[-1], keepdims=1),
        helper.make_node("Mul", ["c", "m"], ["p"]),
        helper.make_node("MatMul", ["p", "w"], ["q"]),
        helper.make_node("Split", ["q", "sizes"], ["q0", "q1"], axis=-1),
        helper.make_node("Concat", ["q0", "q1"], ["out"], axis=-1),
    ]
    inits = [const("w", np.ones((8, 6), np.float32)), _i64("sizes", 2, 4)]
    declared = {"c": ["unk__1", "unk__2", 8], "m": ["unk__3", "unk__4", 1], "p": ["unk__5", "unk__6", 8]}
    declared |= {"q": ["unk__7", "unk__8", 6], "q0": ["unk__9", "unk__10", 2], "q1": ["unk__11", "unk__12", 4]}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", FLOAT, ["batch", "sequence", 8])],
        [helper.make_tensor_value_info("out", FLOAT, ["unk__13", "unk__14", 6])],
        inits,
        value_info=_declared(declared),
    )
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    values = {v.name: v for node in model.graph for v in node.outputs}
    assert shape_values.give_shapes(model.graph)
    got = {name: [shape_values.dim_element(d) for d in values[name].shape] for name in declared}
    assert got == {
        "c": ["batch", "sequence", 8],
        "m": ["batch", "sequence", 1],
        "p": ["batch", "sequence", 8],
        "q": ["batch", "sequence", 6],
        "q0": ["batch", "sequence", 2],
        "q1": ["batch", "sequence", 4],
    }
    # The graph's output keeps the shape the model declares: its interface, not an annotation.
    assert [shape_values.dim_element(d) for d in values["out"].shape] == ["unk__13", "unk__14", 6]


def test_a_broadcast_against_an_unknown_dim_names_nothing() -> None:
    """`unk__1 * batch` may be `batch` (unk__1 = 1) or unk__1 (batch = 1): nothing is carried."""
    assert shape_values._expanded_dims(["unk__1", 8], ["batch", 8]) == [None, 8]
    assert shape_values._expanded_dims([1, 8], ["batch", 8]) == ["batch", 8]


def test_a_node_it_cannot_read_is_left_as_it_is() -> None:
    """A Split whose `axis` is a string and an Unsqueeze without axes in a view's target (invalid nodes that ONNX
    Runtime would refuse): no exception escapes, nothing is given to them, the rest still gets its dims."""
    x = ir.Value(name="x", shape=ir.Shape(["b", 4]), type=ir.TensorType(ir.DataType.FLOAT))
    n = ir.Value(name="n", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.INT64))
    split = ir.node("Split", [x], attributes={"axis": "last"}, num_outputs=2)
    broken = ir.node("Unsqueeze", [n])
    shape = ir.node("Shape", [x])
    target = ir.node("Concat", [shape.outputs[0], broken.outputs[0]], attributes={"axis": 0})
    view = ir.node("Reshape", [x, target.outputs[0]])
    cast = ir.node("Cast", [x], attributes={"to": int(ir.DataType.FLOAT16)})
    nodes = [split, broken, shape, target, view, cast]
    graph = ir.Graph(inputs=[x, n], outputs=[view.outputs[0]], nodes=nodes, opset_imports={"": 18})
    for value in [*split.outputs, cast.outputs[0]]:
        value.dtype = ir.DataType.FLOAT
    for value in [broken.outputs[0], shape.outputs[0], target.outputs[0]]:
        value.dtype = ir.DataType.INT64
    assert shape_values.give_shapes(graph)  # the Cast's output, after the Split it could not read
    assert all(value.shape is None for value in split.outputs)
    assert [shape_values.dim_element(d) for d in cast.outputs[0].shape] == ["b", 4]
