"""Shared helpers of the rewrite tests (no tests here): building decomposed graphs and comparing runs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnx_norm.ops.schema import DOMAIN
from onnx_norm.rewrite import optimize

FLOAT, FLOAT16, BFLOAT16, DOUBLE = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE
_NP = {FLOAT: np.float32, FLOAT16: np.float16, DOUBLE: np.float64}


def const(name: str, array, dtype=None) -> onnx.TensorProto:
    array = np.asarray(array, dtype=dtype)
    return numpy_helper.from_array(array, name)


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list]],
    outputs: list[tuple[str, int, list | None]],
    initializers: list[onnx.TensorProto] = (),
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, inputs[0][2] if s is None else s) for n, t, s in outputs],
        list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime on the CPU with its own graph optimisations off (so it does not fuse the baseline)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def fused_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node if n.domain == DOMAIN]


def random_feeds(model: onnx.ModelProto, shapes: dict[str, list[int]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = np.asarray(rng.standard_normal(shapes[value.name]) * 2 + 0.5).astype(dtype)
    return feeds


def assert_fused(
    model: onnx.ModelProto,
    shapes: dict[str, list[int]],
    expected: list[str],
    *,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    target: str = "onnx-norm",
    **options,
) -> tuple[onnx.ModelProto, object]:
    """Optimizes `model`, asserts the fused ops are `expected` and that outputs match the original's."""
    optimized, report = optimize(model, target=target, **options)
    onnx.checker.check_model(optimized)
    if target == "onnx-norm":
        assert sorted(fused_ops(optimized)) == sorted(expected), (fused_ops(optimized), report.near_misses)
    feeds = random_feeds(model, shapes)
    for before, after in zip(run(model, feeds), run(optimized, feeds), strict=False):
        assert before.dtype == after.dtype and before.shape == after.shape
        np.testing.assert_allclose(after.astype(np.float64), before.astype(np.float64), rtol=rtol, atol=atol)
    return optimized, report


def assert_not_fused(model: onnx.ModelProto, shapes: dict[str, list[int]], reason: str | None = None) -> object:
    """Nothing fused, outputs identical; returns the report (its near-misses say why)."""
    optimized, report = optimize(model)
    onnx.checker.check_model(optimized)
    assert fused_ops(optimized) == [], report.norms
    feeds = random_feeds(model, shapes)
    for before, after in zip(run(model, feeds), run(optimized, feeds), strict=False):
        np.testing.assert_array_equal(after, before)
    if reason is not None:
        reasons = " | ".join(m.reason for m in report.near_misses)
        assert reason in reasons, reasons
    return report


def rms_nodes(x: str = "x", y: str = "y", *, reduce: str = "ReduceMean", eps: str = "eps") -> list[onnx.NodeProto]:
    """`x / sqrt(mean(x * x) + eps)`: the mean over the last axis (axes as an attribute, opset < 18), or a
    GlobalAveragePool."""
    axes = {} if reduce == "GlobalAveragePool" else {"axes": [-1]}
    return [
        helper.make_node("Mul", [x, x], ["sq"]),
        helper.make_node(reduce, ["sq"], ["ms"], **axes),
        helper.make_node("Add", ["ms", eps], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", [x, "s"], [y]),
    ]


def rms_divided_by_dim(dim: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`x / sqrt(sum(x * x, -1) / x.shape[dim] + eps)`, the divisor read from x's shape (Cast(Gather(Shape(x),
    dim)), TorchScript's spelling): the nodes and their constants (opset < 18: ReduceSum's axes is an input)."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["ss"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "dim"], ["size"], axis=0),
        helper.make_node("Cast", ["size"], ["n"], to=FLOAT),
        helper.make_node("Div", ["ss", "n"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["y"]),
    ]
    return nodes, [const("axes", [-1], np.int64), const("dim", dim, np.int64), const("eps", 1e-6, np.float32)]


def layer_nodes(
    x: str = "x",
    y: str = "y",
    *,
    mean_of: str | None = None,
    scale: str | None = None,
    bias: str | None = None,
    axes: tuple[int, ...] = (-1,),
) -> list[onnx.NodeProto]:
    """`(x - mean(x)) / sqrt(mean((x - mean)^2) + eps)` over `axes` (the last one by default), then `* scale` and
    `+ bias` when named; `mean_of`: the tensor whose mean is subtracted (another name for x, or another tensor)."""
    normalised = "n" if scale or bias else y
    nodes = [
        helper.make_node("ReduceMean", [mean_of or x], ["mu"], axes=list(axes)),
        helper.make_node("Sub", [x, "mu"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=list(axes)),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], [normalised]),
    ]
    if scale:
        nodes.append(helper.make_node("Mul", [normalised, scale], ["nw" if bias else y]))
    if bias:
        nodes.append(helper.make_node("Add", ["nw" if scale else normalised, bias], [y]))
    return nodes


def assert_not_less_accurate(model: onnx.ModelProto, optimized: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Every output of `optimized` (our kernels) is no farther from the float64 result than `model`'s (ONNX
    Runtime on the CPU, the same feeds), by max and mean absolute error, within one ulp of the output type."""
    import onnx_norm
    from onnx_norm.parity.golden import GoldenEvaluator
    from onnx_norm.rewrite.prove import accuracy_loss

    names = [value.name for value in model.graph.output]
    exact = GoldenEvaluator(model, "auto", None).run(feeds, names)
    assert exact is not None
    session = ort.InferenceSession(
        optimized.SerializeToString(), onnx_norm.session_options(), providers=["CPUExecutionProvider"]
    )
    for name, original, fused in zip(names, run(model, feeds), session.run(names, feeds), strict=True):
        loss = accuracy_loss(fused, original, exact[name])
        assert loss is None, f"{name}: {loss}"
