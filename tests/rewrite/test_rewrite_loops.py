"""Norms in and after a `Loop` as tf2onnx writes TensorFlow while loops: body inputs declared without shapes, and
every tensor the body reads (gamma and beta among them) passed through as a loop-carried value the body returns
unchanged, or read from the enclosing graph. The body's inputs take the Loop's initial shapes (checked where the
body changes a value), gamma and beta are parameters the fused op reads at run time."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from rewrite_support import FLOAT, const, random_feeds, run

import onnx_norm
from onnx_norm.ops.schema import DOMAIN
from onnx_norm.rewrite import optimize

D = 16
SHAPES = {"x": [2, 3, D], "gamma": [D], "beta": [D], "gamma_raw": [D], "beta_raw": [D]}
rng = np.random.default_rng(5)


def _layer_norm(x: str, y: str, gamma: str, beta: str, p: str) -> list[onnx.NodeProto]:
    """Keras' LayerNorm as tf2onnx writes it for a rank-3 input: axes as positive numbers."""
    return [
        helper.make_node("ReduceMean", [x], [p + "mu"], axes=[2]),
        helper.make_node("Sub", [x, p + "mu"], [p + "d"]),
        helper.make_node("Mul", [p + "d", p + "d"], [p + "sq"]),
        helper.make_node("ReduceMean", [p + "sq"], [p + "var"], axes=[2]),
        helper.make_node("Add", [p + "var", p + "eps"], [p + "ve"]),
        helper.make_node("Sqrt", [p + "ve"], [p + "s"]),
        helper.make_node("Div", [p + "d", p + "s"], [p + "n"]),
        helper.make_node("Mul", [p + "n", gamma], [p + "nw"]),
        helper.make_node("Add", [p + "nw", beta], [y]),
    ]


def _body(params: str, state: str) -> onnx.GraphProto:
    """`params`: "carried" (gamma/beta loop-carried, returned through Identity), "changed" (the body returns
    gamma * 2: not invariant) or "outer" (read from the enclosing graph); `state`: "kept" (the body returns a value of
    the state's shape) or "grown" (the body concatenates along the sequence: the state's shape changes)."""
    inputs = [
        helper.make_tensor_value_info("i", TensorProto.INT64, []),
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
    ]
    carried = params != "outer"
    if carried:
        inputs += [helper.make_tensor_value_info(n, FLOAT, None) for n in ("g_in", "b_in")]
    inputs.append(helper.make_tensor_value_info("h_in", FLOAT, None))
    gamma, beta = ("g_in", "b_in") if carried else ("gamma", "beta")
    nodes = [
        helper.make_node("Identity", ["c"], ["c_out"]),
        helper.make_node("Constant", [], ["b_eps"], value=helper.make_tensor("e", FLOAT, [], [1e-3])),
        *_layer_norm("h_in", "h_ln", gamma, beta, "b_"),
        helper.make_node("Relu", ["h_ln"], ["h_relu"]),
    ]
    if params == "carried":
        nodes += [helper.make_node("Identity", ["g_in"], ["g_out"]), helper.make_node("Identity", ["b_in"], ["b_out"])]
    elif params == "changed":
        nodes += [
            helper.make_node("Add", ["g_in", "g_in"], ["g_out"]),
            helper.make_node("Identity", ["b_in"], ["b_out"]),
        ]
    if state == "grown":
        nodes.append(helper.make_node("Concat", ["h_relu", "h_in"], ["h_out"], axis=1))
    else:
        nodes.append(helper.make_node("Identity", ["h_relu"], ["h_out"]))
    outputs = ["c_out", *(["g_out", "b_out"] if carried else []), "h_out"]
    return helper.make_graph(
        nodes,
        "body",
        inputs,
        [helper.make_tensor_value_info(o, TensorProto.BOOL if o == "c_out" else FLOAT, None) for o in outputs],
    )


def _model(opset: int, params: str = "carried", state: str = "kept", weights: str = "initializers") -> onnx.ModelProto:
    """x -> Loop (a LayerNorm in its body) -> a LayerNorm after it; `weights`: gamma/beta as initializers, as
    graph inputs (taken at run time) or computed from graph inputs in front of the Loop (`Abs`)."""
    carried = params != "outer"
    loop = helper.make_node(
        "Loop",
        ["trips", "cond", *(["gamma", "beta"] if carried else []), "x"],
        [*(["g_final", "b_final"] if carried else []), "h"],
        body=_body(params, state),
    )
    nodes = [loop, *_layer_norm("h", "y", "gamma2", "beta2", "a_")]
    inits = [
        const("trips", np.array(2, np.int64)),
        const("cond", np.array(True)),
        const("a_eps", np.array(1e-3, np.float32)),
        const("gamma2", rng.random(D).astype(np.float32) + 0.5),
        const("beta2", rng.standard_normal(D).astype(np.float32)),
    ]
    inputs = [helper.make_tensor_value_info("x", FLOAT, ["b", "s", D])]
    gamma = rng.random(D).astype(np.float32) + 0.5
    beta = rng.standard_normal(D).astype(np.float32)
    if weights == "initializers":
        inits += [const("gamma", gamma), const("beta", beta)]
    elif weights == "inputs":
        inputs += [helper.make_tensor_value_info(n, FLOAT, [D]) for n in ("gamma", "beta")]
    else:
        inputs += [helper.make_tensor_value_info(n, FLOAT, [D]) for n in ("gamma_raw", "beta_raw")]
        nodes[:0] = [helper.make_node("Abs", [f"{n}_raw"], [n]) for n in ("gamma", "beta")]
    y_shape = ["b", "s_out", D]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", FLOAT, y_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _loop(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Loop")


def _main_ops(model: onnx.ModelProto) -> list[str]:
    """The main graph's ops, less the Abs nodes computing the weights."""
    return [n.op_type for n in model.graph.node if n.op_type != "Abs"]


def _body_ops(model: onnx.ModelProto) -> list[str]:
    (body,) = [a.g for a in _loop(model).attribute if a.name == "body"]
    return [f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in body.node]


def _check_parity(model: onnx.ModelProto, optimized: onnx.ModelProto) -> None:
    feeds = random_feeds(model, SHAPES)
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    # What is written loads with everything on, with our library registered.
    options = onnx_norm.session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(optimized.SerializeToString(), options, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weights", ["initializers", "inputs", "computed"])
@pytest.mark.parametrize("params", ["carried", "outer"])
@pytest.mark.parametrize("opset", [13, 17])
def test_norms_in_and_after_a_tf2onnx_loop_are_fused(opset: int, params: str, weights: str) -> None:
    model = _model(opset, params, weights=weights)
    optimized, report = optimize(model)
    assert f"{DOMAIN}:LayerNorm" in _body_ops(optimized), report.near_misses
    assert "ReduceMean" not in _body_ops(optimized)
    assert _main_ops(optimized) == ["Loop", "LayerNorm"], report.near_misses
    (fused,) = [n for n in _loop(optimized).attribute[0].g.node if n.op_type == "LayerNorm"]
    assert list(fused.input[1:]) == (["g_in", "b_in"] if params == "carried" else ["gamma", "beta"])
    _check_parity(model, optimized)


def test_a_loop_carried_scale_the_body_changes_is_no_parameter() -> None:
    """gamma doubles every iteration: no fused op may read it as a fixed weight. The norm is fused without it (the
    scale stays a Mul of its own) or not at all, and the results are the original's."""
    model = _model(17, "changed", weights="inputs")
    optimized, _ = optimize(model)
    body = optimized.graph.node[0].attribute[0].g
    assert all("g_in" not in n.input for n in body.node if n.domain == DOMAIN)
    assert any(n.op_type == "Mul" and "g_in" in n.input for n in body.node)
    _check_parity(model, optimized)


@pytest.mark.parametrize("symbolic", [True, False])
def test_a_state_the_body_grows_keeps_its_rank(symbolic: bool, monkeypatch) -> None:
    """The body concatenates its state along the sequence, so the Loop's initial shape holds for the first
    iteration only: the assumption is narrowed to what every iteration has (the rank, the batch and the row size,
    the sequence unknown), so the norm on the state in the body and the one after the Loop (even without ONNX
    Runtime's symbolic inference) have their rank and are fused; the results are the original's."""
    from onnx_norm.rewrite import passes

    if not symbolic:
        monkeypatch.setattr(passes, "_infer_symbolic_shapes", lambda model: None)
    model = _model(17, "carried", state="grown")
    optimized, report = optimize(model)
    assert _body_ops(optimized).count(f"{DOMAIN}:LayerNorm") == 1, report.near_misses
    assert "ReduceMean" not in _body_ops(optimized)
    assert _main_ops(optimized) == ["Loop", "LayerNorm"], report.near_misses
    state = _loop(optimized).attribute[0].g.input[4].type.tensor_type.shape.dim
    assert [d.dim_value or d.dim_param or None for d in state][::2] == ["b", D]
    assert report.near_misses == []
    _check_parity(model, optimized)


def test_a_state_whose_rank_the_body_changes_keeps_no_assumed_shape(monkeypatch) -> None:
    """The body flattens its state to a vector: not even the rank of the Loop's initial value holds after the first
    iteration, so the assumption is taken back, the norm on the state stays (its rank is unknown) and what is
    written is the original's computation, body input shapes included."""
    model = _model(17, "carried")
    body = _loop(model).attribute[0].g
    identity = next(n for n in body.node if n.output[0] == "h_out")
    identity.op_type = "Flatten"
    identity.attribute.append(helper.make_attribute("axis", 0))
    optimized, report = optimize(model)
    body = optimized.graph.node[0].attribute[0].g
    assert "ReduceMean" in [n.op_type for n in body.node]
    assert not body.input[4].type.tensor_type.HasField("shape")
    assert any("rank" in m.reason for m in report.near_misses), report.near_misses


@pytest.mark.parametrize("opset", [13, 17])
def test_the_norm_after_the_loop_needs_no_symbolic_inference(opset: int, monkeypatch) -> None:
    """onnx's inference leaves the Loop's output without a shape; the body returns its state with the shape it got,
    so the output has it, and the norm after the Loop (axes counted from the front) is fused without ONNX
    Runtime's symbolic inference."""
    from onnx_norm.rewrite import passes

    monkeypatch.setattr(passes, "_infer_symbolic_shapes", lambda model: None)
    model = _model(opset, "carried")
    optimized, report = optimize(model)
    assert [n.op_type for n in optimized.graph.node] == ["Loop", "LayerNorm"], report.near_misses
    _check_parity(model, optimized)


def test_a_norm_of_a_scan_output_is_fused(monkeypatch) -> None:
    """A scan output stacks the body's value along a new first dim: a norm over its axis 3 has the rank it needs."""
    from onnx_norm.rewrite import passes

    monkeypatch.setattr(passes, "_infer_symbolic_shapes", lambda model: None)
    body_nodes = [
        helper.make_node("Identity", ["c"], ["c_out"]),
        helper.make_node("Relu", ["h_in"], ["h_out"]),
        helper.make_node("Identity", ["h_out"], ["scan_out"]),
    ]
    body_inputs = [
        helper.make_tensor_value_info("i", TensorProto.INT64, []),
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        helper.make_tensor_value_info("h_in", FLOAT, None),
    ]
    body_outputs = [
        helper.make_tensor_value_info("c_out", TensorProto.BOOL, None),
        *(helper.make_tensor_value_info(n, FLOAT, None) for n in ("h_out", "scan_out")),
    ]
    body = helper.make_graph(body_nodes, "body", body_inputs, body_outputs)
    nodes = [helper.make_node("Loop", ["trips", "cond", "x"], ["h", "stacked"], body=body)]
    nodes += _layer_norm("stacked", "y", "gamma", "beta", "a_")
    for node in nodes[1:]:
        if node.op_type == "ReduceMean":
            node.attribute[0].ints[:] = [3]
    inits = [
        const("trips", np.array(2, np.int64)),
        const("cond", np.array(True)),
        const("a_eps", np.array(1e-3, np.float32)),
        const("gamma", rng.random(D).astype(np.float32) + 0.5),
        const("beta", rng.standard_normal(D).astype(np.float32)),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", FLOAT, ["b", "s", D])],
        [helper.make_tensor_value_info("y", FLOAT, ["t", "b", "s", D])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    optimized, report = optimize(model)
    assert [n.op_type for n in optimized.graph.node] == ["Loop", "LayerNorm"], report.near_misses
    _check_parity(model, optimized)


def test_a_norm_in_a_loop_inside_a_loop() -> None:
    """The outer body runs the tf2onnx-like Loop on its state, passing gamma and beta through both levels."""
    inner = _body("carried", "kept")
    outer_body = helper.make_graph(
        [
            helper.make_node("Identity", ["oc"], ["oc_out"]),
            helper.make_node("Identity", ["og_in"], ["og_out"]),
            helper.make_node("Identity", ["ob_in"], ["ob_out"]),
            helper.make_node("Loop", ["trips", "oc", "og_in", "ob_in", "oh_in"], ["ig", "ib", "oh_out"], body=inner),
        ],
        "outer_body",
        [
            helper.make_tensor_value_info("oi", TensorProto.INT64, []),
            helper.make_tensor_value_info("oc", TensorProto.BOOL, []),
            *(helper.make_tensor_value_info(n, FLOAT, None) for n in ("og_in", "ob_in", "oh_in")),
        ],
        [
            helper.make_tensor_value_info("oc_out", TensorProto.BOOL, None),
            *(helper.make_tensor_value_info(n, FLOAT, None) for n in ("og_out", "ob_out", "oh_out")),
        ],
    )
    model = _model(17, "carried")
    loop = _loop(model)
    loop.ClearField("attribute")
    loop.attribute.append(helper.make_attribute("body", outer_body))
    onnx.checker.check_model(model)
    optimized, report = optimize(model)
    (outer,) = [a.g for a in _loop(optimized).attribute if a.name == "body"]
    (inner_loop,) = [n for n in outer.node if n.op_type == "Loop"]
    assert [n.op_type for n in inner_loop.attribute[0].g.node if n.domain == DOMAIN] == ["LayerNorm"], (
        report.near_misses
    )
    assert _main_ops(optimized) == ["Loop", "LayerNorm"], report.near_misses
    _check_parity(model, optimized)


def _scan_model(gamma: str) -> onnx.ModelProto:
    """A Scan (opset 17) over the first dim of x [5, 3, D] whose body LayerNorms each slice and accumulates the
    result in a state; body inputs declared without shapes. `gamma`: "state" (a state the body returns through
    Identity), "changed" (a state the body doubles every iteration), "outer" (read from the enclosing graph)."""
    body_nodes = _layer_norm("x_i", "y_i", "g_in" if gamma != "outer" else "gamma", "beta", "b_")
    for node in body_nodes:
        if node.op_type == "ReduceMean":
            node.attribute[0].ints[:] = [-1]  # a slice is [3, D]
    body_nodes.append(helper.make_node("Add", ["acc", "y_i"], ["acc_out"]))
    states = ["acc"]
    if gamma != "outer":
        states.append("g_in")
        doubled = helper.make_node("Add", ["g_in", "g_in"], ["g_out"])
        body_nodes.append(doubled if gamma == "changed" else helper.make_node("Identity", ["g_in"], ["g_out"]))
    state_outputs = ["acc_out"] + (["g_out"] if gamma != "outer" else [])
    body = helper.make_graph(
        body_nodes,
        "scan_body",
        [helper.make_tensor_value_info(n, FLOAT, None) for n in [*states, "x_i"]],
        [helper.make_tensor_value_info(n, FLOAT, None) for n in [*state_outputs, "y_i"]],
        [const("b_eps", np.array(1e-3, np.float32))],
    )
    initial = ["acc0"] + (["gamma"] if gamma != "outer" else [])
    finals = ["acc_final"] + (["g_final"] if gamma != "outer" else [])
    scan = helper.make_node("Scan", [*initial, "xs"], [*finals, "ys"], num_scan_inputs=1, body=body)
    graph = helper.make_graph(
        [scan],
        "g",
        [helper.make_tensor_value_info("xs", FLOAT, [5, 3, D]), helper.make_tensor_value_info("acc0", FLOAT, [3, D])],
        [
            helper.make_tensor_value_info("ys", FLOAT, [5, 3, D]),
            helper.make_tensor_value_info("acc_final", FLOAT, None),
        ],
        [
            const("gamma", rng.random(D).astype(np.float32) + 0.5),
            const("beta", rng.standard_normal(D).astype(np.float32)),
        ],
    )
    graph.output.sort(key=lambda v: v.name != "ys")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("gamma", ["state", "changed", "outer"])
def test_a_norm_in_a_scan_body_is_fused(gamma: str) -> None:
    """The norm in a Scan body is one op; gamma is its scale when every iteration sees the same value (a state the
    body returns unchanged, or the enclosing graph's), and stays a Mul of its own when the body changes it."""
    model = _scan_model(gamma)
    optimized, report = optimize(model)
    body = optimized.graph.node[0].attribute[0].g
    fused = [n for n in body.node if n.domain == DOMAIN]
    assert len(fused) == 1 and "ReduceMean" not in [n.op_type for n in body.node], report.near_misses
    scale = {"state": "g_in", "outer": "gamma"}.get(gamma)
    if scale is None:
        assert "g_in" not in fused[0].input
        assert any(n.op_type == "Mul" and "g_in" in n.input for n in body.node)
    else:
        assert fused[0].input[1] == scale
    feeds = {"xs": rng.standard_normal((5, 3, D)).astype(np.float32), "acc0": np.zeros((3, D), np.float32)}
    for name in ("ys", "acc_final"):
        index = [o.name for o in model.graph.output].index(name)
        np.testing.assert_allclose(run(optimized, feeds)[index], run(model, feeds)[index], rtol=1e-5, atol=1e-5)
    assert onnx_norm.verify(model, optimized, inputs=[feeds]).passed


def _computed_weights_model(spelling: str, changed: bool = False) -> onnx.ModelProto:
    """A tf2onnx-like Loop whose body computes the norm's gamma and beta from loop-carried tensors: `slice` (gamma
    and beta one vector `[gamma, beta]`, split by Slice) or `neg` (gamma carried negated, `Neg` in the body, beta a
    Slice of the vector). `changed`: the body doubles the vector every iteration (no weight then)."""
    inputs = [
        helper.make_tensor_value_info("i", TensorProto.INT64, []),
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        *(helper.make_tensor_value_info(n, FLOAT, None) for n in ("gb_in", "ng_in", "h_in")),
    ]
    gamma_node = (
        helper.make_node("Slice", ["gb_in", "start0", "startD"], ["g"])
        if spelling == "slice"
        else helper.make_node("Neg", ["ng_in"], ["g"])
    )
    nodes = [
        helper.make_node("Identity", ["c"], ["c_out"]),
        helper.make_node("Constant", [], ["b_eps"], value=helper.make_tensor("e", FLOAT, [], [1e-3])),
        gamma_node,
        helper.make_node("Slice", ["gb_in", "startD", "end2D"], ["b"]),
        *_layer_norm("h_in", "h_ln", "g", "b", "b_"),
        helper.make_node("Relu", ["h_ln"], ["h_out"]),
        helper.make_node("Add", ["gb_in", "gb_in"], ["gb_out"])
        if changed
        else helper.make_node("Identity", ["gb_in"], ["gb_out"]),
        helper.make_node("Identity", ["ng_in"], ["ng_out"]),
    ]
    outputs = [helper.make_tensor_value_info("c_out", TensorProto.BOOL, None)]
    outputs += [helper.make_tensor_value_info(n, FLOAT, None) for n in ("gb_out", "ng_out", "h_out")]
    bounds = [const("start0", [0], np.int64), const("startD", [D], np.int64), const("end2D", [2 * D], np.int64)]
    body = helper.make_graph(nodes, "body", inputs, outputs, bounds)
    loop = helper.make_node("Loop", ["trips", "cond", "gb", "ng", "x"], ["gb_final", "ng_final", "y"], body=body)
    gamma = rng.random(D).astype(np.float32) + 0.5
    inits = [
        const("trips", np.array(2, np.int64)),
        const("cond", np.array(True)),
        const("gb", np.concatenate([gamma, rng.standard_normal(D).astype(np.float32)])),
        const("ng", -gamma),
    ]
    x = [helper.make_tensor_value_info("x", FLOAT, ["b", "s", D])]
    graph = helper.make_graph([loop], "g", x, [helper.make_tensor_value_info("y", FLOAT, ["b", "s", D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("spelling", ["slice", "neg"])
def test_a_scale_and_bias_computed_from_loop_carried_weights_are_the_ops(spelling: str) -> None:
    """A Slice or Neg of a tensor every iteration sees unchanged is a row of weights computed at run time: the fused
    op reads it as its Scale (or Bias), and no Mul or Add of the affine is left in the body."""
    model = _computed_weights_model(spelling)
    optimized, report = optimize(model)
    ops = _body_ops(optimized)
    assert ops.count(f"{DOMAIN}:LayerNorm") == 1, report.near_misses
    assert "Mul" not in ops and "Add" not in ops, ops
    (fused,) = [n for n in _loop(optimized).attribute[0].g.node if n.domain == DOMAIN]
    assert list(fused.input[1:]) == ["g", "b"]
    _check_parity(model, optimized)


def test_a_row_sliced_from_a_value_the_body_changes_is_no_weight() -> None:
    """The vector doubles every iteration: its Slices are not read as weights (the norm is fused without its bias,
    the Add stays), and the results are the original's."""
    model = _computed_weights_model("neg", changed=True)
    optimized, _ = optimize(model)
    body = _loop(optimized).attribute[0].g
    (fused,) = [n for n in body.node if n.domain == DOMAIN]
    assert "b" not in fused.input
    assert any(n.op_type == "Add" and "b" in n.input for n in body.node)
    _check_parity(model, optimized)
