"""The modulated-norm (adaLN) family of the rewrite (onnx_norm/rewrite/families/modulated_norm.py): graphs that spell
`norm(x) * (1 + scale) + shift` out are fused into one ModulatedLayerNorm / ModulatedRMSNorm with the numbers of the
original (through the model-local function and through the library's kernel); the near-misses say why a graph is
not fused, and the other targets fuse the norm inside alone; diffusers' blocks exported by TorchScript fuse."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from repo_paths import DATA
from rewrite_support import FLOAT, FLOAT16, const, fused_ops, make_model, random_feeds, run

import onnx_norm
from onnx_norm import library
from onnx_norm.rewrite import optimize

D = 32
SHAPES = {"x": [2, 5, D], "scale": [2, 1, D], "shift": [2, 1, D]}
FIXTURES = DATA / "exporters"


def _norm(kind: str, x: str = "x", out: str = "n", dtype: int = FLOAT) -> list[onnx.NodeProto]:
    """A decomposed norm without affine, reading `x`, writing `out`."""
    eps = "eps16" if dtype == FLOAT16 else "eps"
    if kind == "rms":
        return [
            helper.make_node("Mul", [x, x], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
            helper.make_node("Add", ["ms", eps], ["me"]),
            helper.make_node("Sqrt", ["me"], ["r"]),
            helper.make_node("Div", [x, "r"], [out]),
        ]
    return [
        helper.make_node("ReduceMean", [x, "axes"], ["m"]),
        helper.make_node("Sub", [x, "m"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"]),
        helper.make_node("Add", ["var", eps], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], [out]),
    ]


def _model(
    kind: str = "layer",
    *,
    swap: tuple[bool, bool, bool] = (False, False, False),
    one_plus: bool = True,
    dtype: int = FLOAT,
    scale_shape: list | None = None,
    extra: list[onnx.NodeProto] = (),
    inputs: list | None = None,
    extra_inits: list[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    """`norm(x) * (1 + scale) + shift`; swap: the operand orders of (1 + s), the Mul and the final Add."""
    gate = ["one", "scale"][:: -1 if swap[0] else 1]
    nodes = [*extra, *_norm(kind, dtype=dtype)]
    if one_plus:
        nodes.append(helper.make_node("Add", gate, ["gate"]))
    product = ["n", "gate" if one_plus else "scale"][:: -1 if swap[1] else 1]
    nodes.append(helper.make_node("Mul", product, ["p"]))
    nodes.append(helper.make_node("Add", ["p", "shift"][:: -1 if swap[2] else 1], ["y"]))
    np_type = np.float16 if dtype == FLOAT16 else np.float32
    inits = [
        const("axes", [-1], np.int64),
        const("eps", 1e-5, np.float32),
        const("eps16", 1e-5, np.float16),
        const("one", 1.0, np_type),
        *extra_inits,
    ]
    if inputs is None:
        inputs = [
            ("x", dtype, ["b", "s", D]),
            ("scale", dtype, scale_shape or ["b", 1, D]),
            ("shift", dtype, ["b", 1, D]),
        ]
    model = make_model(nodes, inputs, [("y", dtype, ["b", "s", D])], inits, opset=18)
    used = {i for node in model.graph.node for i in node.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def _run_with_library(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        model.SerializeToString(), library.session_options(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def _check_fused(model: onnx.ModelProto, op: str, shapes: dict = SHAPES, tol: float = 1e-5) -> None:
    optimized, report = optimize(model)
    onnx.checker.check_model(optimized)
    assert fused_ops(optimized) == [op], [m.reason for m in report.near_misses]
    feeds = random_feeds(model, shapes)
    want = run(model, feeds)[0]
    runs = [run(optimized, feeds)[0]]  # the model-local function
    if library.library_available():
        runs.append(_run_with_library(optimized, feeds)[0])  # our kernel
    for got in runs:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("swap", [(a, b, c) for a in (False, True) for b in (False, True) for c in (False, True)])
def test_every_operand_order_is_fused(swap: tuple[bool, bool, bool]) -> None:
    _check_fused(_model(swap=swap), "ModulatedLayerNorm")


def test_rms_norm_is_fused() -> None:
    _check_fused(_model("rms"), "ModulatedRMSNorm")


def test_float16_graph_is_fused_with_its_rounding_points() -> None:
    """Every step in fp16, as an fp16 model computes it: the op rounds where the graph does."""
    model = _model(dtype=FLOAT16)
    _check_fused(model, "ModulatedLayerNorm", tol=2e-3)
    node = next(n for n in optimize(model)[0].graph.node if n.op_type == "ModulatedLayerNorm")
    attrs = {a.name: a.i for a in node.attribute if a.name.endswith("_type")}
    assert attrs["normalized_type"] == attrs["multiply_type"] == FLOAT16


def test_norm_with_its_own_affine() -> None:
    model = _model()
    graph = model.graph
    n_node = next(n for n in graph.node if n.output[0] == "n")
    n_node.output[0] = "n0"
    graph.node.insert(
        list(graph.node).index(n_node) + 1, helper.make_node("Mul", ["n0", "gamma"], ["n1"], name="affine")
    )
    graph.node.insert(list(graph.node).index(n_node) + 2, helper.make_node("Add", ["n1", "beta"], ["n"]))
    rng = np.random.default_rng(0)
    graph.initializer.extend(
        [const("gamma", rng.normal(1, 0.1, D), np.float32), const("beta", rng.normal(0, 0.1, D), np.float32)]
    )
    _check_fused(model, "ModulatedLayerNorm")


def test_modulation_from_a_chunked_linear_as_diffusers_exports_it() -> None:
    """emb [B, 2D] -> Split into shift/scale [B, D] -> Unsqueeze to [B, 1, D], as `emb.chunk(2, dim=1)` and
    `scale[:, None]` export."""
    extra = [
        helper.make_node("Split", ["emb", "halves"], ["shift2", "scale2"], axis=1),
        helper.make_node("Unsqueeze", ["shift2", "one_axis"], ["shift"]),
        helper.make_node("Unsqueeze", ["scale2", "one_axis"], ["scale"]),
    ]
    inits = [const("halves", [D, D], np.int64), const("one_axis", [1], np.int64)]
    model = _model(extra=extra, inputs=[("x", FLOAT, ["b", "s", D]), ("emb", FLOAT, ["b", 2 * D])], extra_inits=inits)
    _check_fused(model, "ModulatedLayerNorm", {"x": [2, 5, D], "emb": [2, 2 * D]})


def _near_miss(model: onnx.ModelProto, reason: str, shapes: dict = SHAPES) -> None:
    """Not modulated-fused, with `reason`; the norm inside is fused alone, the outputs unchanged."""
    optimized, report = optimize(model)
    reasons = " | ".join(m.reason for m in report.near_misses)
    assert reason in reasons, reasons
    assert [op for op in fused_ops(optimized) if op.startswith("Modulated")] == []
    assert fused_ops(optimized) == ["LayerNorm"]
    feeds = random_feeds(model, shapes)
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_modulation_that_varies_along_the_sequence_is_a_near_miss() -> None:
    model = _model(scale_shape=["b", "s", D])
    _near_miss(model, "modulation varies along the sequence", {**SHAPES, "scale": [2, 5, D]})


def test_no_one_plus_is_a_near_miss() -> None:
    _near_miss(_model(one_plus=False), "no 1 + scale")


def test_a_constant_gate_is_the_norms_scale_not_a_modulation() -> None:
    model = _model()
    model.graph.input.remove(next(i for i in model.graph.input if i.name == "scale"))
    model.graph.initializer.append(const("scale", np.full((1, 1, D), 0.5), np.float32))
    optimized, _ = optimize(model)
    assert "ModulatedLayerNorm" not in fused_ops(optimized)


@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_other_targets_fuse_the_norm_inside_and_say_why(target: str) -> None:
    optimized, report = optimize(_model(), target=target)
    assert report.rule_counts == {"layer_norm": 1}
    assert any("no modulated LayerNorm" in m.reason for m in report.near_misses), report.near_misses
    feeds = random_feeds(_model(), SHAPES)
    np.testing.assert_allclose(run(optimized, feeds)[0], run(_model(), feeds)[0], rtol=1e-5, atol=1e-5)


# The committed diffusers fixtures (tools/make_exporter_fixtures.py --family diffusers) -> the op they fuse into.
# The dynamo exports of the LayerNorm blocks hold a native LayerNormalization: the recogniser reads it as the
# take-over does and fuses it with the modulation around it.
DIFFUSERS = {
    "adalayernorm-zero-torchscript": "ModulatedLayerNorm",
    "adalayernorm-torchscript": "ModulatedLayerNorm",
    "adalayernorm-continuous-torchscript": "ModulatedLayerNorm",
    "adalayernorm-continuous-rms-torchscript": "ModulatedRMSNorm",
    "adalayernorm-continuous-rms-dynamo": "ModulatedRMSNorm",
    "adalayernorm-zero-dynamo": "ModulatedLayerNorm",
    "adalayernorm-dynamo": "ModulatedLayerNorm",
    "adalayernorm-continuous-dynamo": "ModulatedLayerNorm",
}


@pytest.mark.parametrize(("name", "op"), DIFFUSERS.items())
def test_diffusers_blocks_fuse_into_the_modulated_op(name: str, op: str) -> None:
    """diffusers' AdaLayerNormZero, AdaLayerNorm and AdaLayerNormContinuous (LayerNorm, and RMSNorm with weight):
    one fused op, with parity through the library (tests/rewrite/test_exporter_fixtures.py runs the parity gate on
    them)."""
    model = onnx.load(FIXTURES / f"diffusers-{name}.onnx")
    optimized, report = onnx_norm.optimize(model, take_over_native=True)
    assert fused_ops(optimized) == [op], [m.reason for m in report.near_misses]
    shapes = {i.name: [d.dim_value or 2 for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    shapes = {k: [2, 5, 16] if len(v) == 3 else [2, 16] for k, v in shapes.items()}
    feeds = random_feeds(model, shapes)
    want = run(model, feeds)
    got = _run_with_library(optimized, feeds) if library.library_available() else run(optimized, feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


# A native norm op inside: torch's dynamo exporter (and TorchScript from opset 17) writes nn.LayerNorm as ONNX's
# LayerNormalization; ONNX Runtime's tools write its contrib ops. The recogniser reads them as the take-over does.
MS = "com.microsoft"


def _native_model(
    op: str = "LayerNormalization",
    *,
    affine: bool = False,
    dtype: int = FLOAT,
    domain: str = "",
    opset: int = 18,
    stats: bool = False,
    **attrs: int,
) -> onnx.ModelProto:
    """`op(x, gamma[, beta]) * (1 + scale) + shift`: gamma all ones without `affine` (dynamo's nn.LayerNorm
    without elementwise_affine), random gamma and beta (LayerNormalization only) with it; `stats`: the Mean
    output is a graph output too."""
    np_type = np.float16 if dtype == FLOAT16 else np.float32
    rng = np.random.default_rng(3)
    gamma = rng.normal(1, 0.2, D) if affine else np.ones(D)
    inits = [const("gamma", gamma, np_type), const("one", 1.0, np_type)]
    norm_inputs = ["x", "gamma"]
    if affine and op == "LayerNormalization":
        inits.append(const("beta", rng.normal(0, 0.2, D), np_type))
        norm_inputs.append("beta")
    outputs = [("y", dtype, ["b", "s", D])]
    if stats:
        outputs.append(("mean", onnx.TensorProto.FLOAT, ["b", "s", 1]))
    nodes = [
        helper.make_node(op, norm_inputs, ["n", "mean"] if stats else ["n"], domain=domain, axis=-1, **attrs),
        helper.make_node("Add", ["one", "scale"], ["gate"]),
        helper.make_node("Mul", ["n", "gate"], ["p"]),
        helper.make_node("Add", ["p", "shift"], ["y"]),
    ]
    inputs = [("x", dtype, ["b", "s", D]), ("scale", dtype, ["b", 1, D]), ("shift", dtype, ["b", 1, D])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        inits,
    )
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(MS, 1)] if domain == MS else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    return model


def test_native_layer_norm_without_affine_and_its_modulation_fuse() -> None:
    """dynamo's spelling of DiT's norm: LayerNormalization(x, ones) then the modulation."""
    model = _native_model()
    _check_fused(model, "ModulatedLayerNorm")
    node = next(n for n in optimize(model)[0].graph.node if n.op_type == "ModulatedLayerNorm")
    assert [a.name for a in node.attribute if a.name.endswith("_type") and a.i] == []  # fp32: no rounding


def test_native_layer_norm_with_affine_and_its_modulation_fuse() -> None:
    optimized, _ = optimize(_native_model(affine=True))
    node = next(n for n in optimized.graph.node if n.op_type == "ModulatedLayerNorm")
    assert list(node.input) == ["x", "gamma", "beta", "scale", "shift"]
    _check_fused(_native_model(affine=True), "ModulatedLayerNorm")


def test_native_float16_layer_norm_with_affine_rounds_where_the_onnx_function_does() -> None:
    """ONNX's LayerNormalization rounds the normalised value, the product and the sum to fp16 (its function body):
    the op's normalized_type = multiply_type = fp16 reproduce that. ONNX Runtime's kernel rounds once instead: the
    two are a unit in the last place apart, within the tolerance."""
    model = _native_model(affine=True, dtype=FLOAT16)
    _check_fused(model, "ModulatedLayerNorm", tol=4e-3)
    node = next(n for n in optimize(model)[0].graph.node if n.op_type == "ModulatedLayerNorm")
    attrs = {a.name: a.i for a in node.attribute if a.name.endswith("_type")}
    assert attrs["normalized_type"] == attrs["multiply_type"] == FLOAT16


def test_native_layer_norm_whose_mean_is_read_is_a_near_miss() -> None:
    model = _native_model(stats=True)
    optimized, report = optimize(model)
    reasons = " | ".join(m.reason for m in report.near_misses)
    assert "statistics are read elsewhere" in reasons, reasons
    assert fused_ops(optimized) == []
    assert [n.op_type for n in optimized.graph.node] == [n.op_type for n in model.graph.node]


def test_native_layer_norm_the_take_over_cannot_read_is_a_near_miss_with_its_reason() -> None:
    model = _native_model(stash_type=onnx.TensorProto.DOUBLE)
    optimized, report = optimize(model)
    reasons = " | ".join(m.reason for m in report.near_misses)
    assert "LayerNormalization inside is not fused with its modulation: stash_type 11" in reasons, reasons
    assert fused_ops(optimized) == []


@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_other_targets_keep_a_native_norm_and_its_modulation_and_say_why(target: str) -> None:
    model = _native_model()
    optimized, report = optimize(model, target=target)
    assert report.rule_counts == {}
    assert any("no modulated LayerNorm" in m.reason for m in report.near_misses), report.near_misses
    assert [n.op_type for n in optimized.graph.node] == [n.op_type for n in model.graph.node]


def test_native_rms_normalization_and_its_modulation_fuse() -> None:
    if onnx.defs.onnx_opset_version() < 23:
        pytest.skip("the onnx package has no RMSNormalization (opset 23)")
    model = _native_model("RMSNormalization", affine=True, opset=23)
    try:
        run(model, random_feeds(model, SHAPES))
    except Exception as err:  # onnxruntime before 1.22 has no kernel for it
        pytest.skip(f"onnxruntime cannot run RMSNormalization: {err}")
    _check_fused(model, "ModulatedRMSNorm")


def test_contrib_simplified_layer_norm_in_float16_fuses() -> None:
    """ONNX Runtime's SimplifiedLayerNormalization rounds once, after its scale multiply: the op's rounding after
    the multiply is the same single rounding."""
    model = _native_model("SimplifiedLayerNormalization", affine=True, dtype=FLOAT16)
    _check_fused(model, "ModulatedRMSNorm", tol=4e-3)


def test_contrib_float16_layer_norm_with_scale_and_bias_is_a_near_miss() -> None:
    """com.microsoft's LayerNormalization rounds once after its scale and bias; the op would round twice."""
    optimized, report = optimize(_native_model(affine=True, dtype=FLOAT16, domain=MS))
    reasons = " | ".join(m.reason for m in report.near_misses)
    assert "rounds to fp16 once after its scale and bias" in reasons, reasons
    assert fused_ops(optimized) == []


def test_float16_modulation_of_a_norm_rounded_once_after_its_affine_is_a_near_miss() -> None:
    """A norm computed in fp32 with its scale and bias, cast to fp16 once, then modulated in fp16: the op would
    round after the scale multiply too. Not fused with the modulation; the norm is fused alone."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=FLOAT),
        *_norm("layer", x="xf", out="n0"),
        helper.make_node("Mul", ["n0", "gamma"], ["n1"]),
        helper.make_node("Add", ["n1", "beta"], ["n2"]),
        helper.make_node("Cast", ["n2"], ["n"], to=FLOAT16),
        helper.make_node("Add", ["one", "scale"], ["gate"]),
        helper.make_node("Mul", ["n", "gate"], ["p"]),
        helper.make_node("Add", ["p", "shift"], ["y"]),
    ]
    inits = [
        const("axes", [-1], np.int64),
        const("eps", 1e-5, np.float32),
        const("one", 1.0, np.float16),
        const("gamma", rng.normal(1, 0.2, D), np.float32),
        const("beta", rng.normal(0, 0.2, D), np.float32),
    ]
    inputs = [("x", FLOAT16, ["b", "s", D]), ("scale", FLOAT16, ["b", 1, D]), ("shift", FLOAT16, ["b", 1, D])]
    model = make_model(nodes, inputs, [("y", FLOAT16, ["b", "s", D])], inits, opset=18)
    optimized, report = optimize(model)
    reasons = " | ".join(m.reason for m in report.near_misses)
    assert "rounds to fp16 once after its scale and bias" in reasons, reasons
    assert fused_ops(optimized) == ["LayerNorm"]


def _single_node(op: str, dtype: int, **attrs: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    np_type = np.float16 if dtype == FLOAT16 else np.float32
    rng = np.random.default_rng(5)
    feeds = {
        "x": (rng.standard_normal((2, 3, D)) * 2 + 0.5).astype(np_type),
        "gamma": rng.normal(1, 0.3, D).astype(np_type),
        "beta": rng.normal(0, 0.3, D).astype(np_type),
    }
    names = ["x", "gamma", "beta"] if op == "LayerNormalization" else ["x", "gamma"]
    node = helper.make_node(op, names, ["y"], axis=-1, epsilon=1e-5, **attrs)
    model = make_model([node], [(n, dtype, list(feeds[n].shape)) for n in names], [("y", dtype, [2, 3, D])], opset=18)
    return model, {n: feeds[n] for n in names}


def _function_body(dtype: int) -> onnx.ModelProto:
    """LayerNormalization-17's function body spelled out (stash_type 1): statistics in float32, the normalised
    value cast to X's type, the scale multiply and the bias add in X's type."""
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=FLOAT),
        helper.make_node("ReduceMean", ["xf", "axes"], ["m"]),
        helper.make_node("Sub", ["xf", "m"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["nf"]),
        helper.make_node("Cast", ["nf"], ["nt"], to=dtype),
        helper.make_node("Mul", ["nt", "gamma"], ["p"]),
        helper.make_node("Add", ["p", "beta"], ["y"]),
    ]
    inputs = [("x", dtype, [2, 3, D]), ("gamma", dtype, [D]), ("beta", dtype, [D])]
    inits = [const("axes", [-1], np.int64), const("eps", 1e-5, np.float32)]
    return make_model(nodes, inputs, [("y", dtype, [2, 3, D])], inits, opset=18)


@pytest.mark.parametrize("dtype", [FLOAT, FLOAT16])
def test_evaluator_computes_layer_normalization_as_its_onnx_function(dtype: int) -> None:
    """The proof's interpreter against the op's function body run node by node by the onnx package's reference
    evaluator: the same rounding points. (ONNX Runtime's CPU provider computes fp16 Mul/Add in float32 and drops the
    roundings between them, and the onnx package's LayerNormalization computes the statistics in X's type, so
    neither is the definition.) Float64 statistics against float32 ones may move the normalised value by a unit in
    its last place."""
    import onnx_ir as ir
    from onnx.reference import ReferenceEvaluator

    from onnx_norm.rewrite.evaluate import evaluate

    model, feeds = _single_node("LayerNormalization", dtype)
    (want,) = ReferenceEvaluator(_function_body(dtype)).run(None, feeds)
    graph = ir.serde.deserialize_model(model).graph
    values = {v.name: v for v in graph.inputs}
    (got,) = evaluate([graph.outputs[0]], {values[n]: a for n, a in feeds.items()})
    assert got.dtype == want.dtype
    error = np.abs(got.astype(np.float64) - want.astype(np.float64))
    if dtype == FLOAT:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    else:
        assert np.all(error <= 2 * np.spacing(np.abs(want)).astype(np.float64))
        assert np.mean(error == 0) > 0.95  # rounded where the function rounds: a single final rounding is not
    (wide,) = evaluate([graph.outputs[0]], {values[n]: a for n, a in feeds.items()}, widen=True)
    assert wide.dtype == np.float64


def test_evaluator_refuses_statistics_it_cannot_stash() -> None:
    import onnx_ir as ir

    from onnx_norm.rewrite.evaluate import EvaluationError, evaluate

    model, feeds = _single_node("LayerNormalization", FLOAT16, stash_type=FLOAT16)
    graph = ir.serde.deserialize_model(model).graph
    values = {v.name: v for v in graph.inputs}
    with pytest.raises(EvaluationError, match="stash_type 10"):
        evaluate([graph.outputs[0]], {values[n]: a for n, a in feeds.items()})


def test_evaluator_gives_every_output_of_a_native_norm() -> None:
    """Mean and InvStdDev of LayerNormalization (stash type float32), inv_std_var of the contrib RMS op."""
    import onnx_ir as ir

    from onnx_norm.rewrite.evaluate import evaluate

    model, feeds = _single_node("LayerNormalization", FLOAT16)
    node = model.graph.node[0]
    node.output.extend(["mean", "inv"])
    graph = ir.serde.deserialize_model(model).graph
    values = {v.name: v for v in graph.inputs}
    y, mean, inv = evaluate(list(graph.node(0).outputs), {values[n]: a for n, a in feeds.items()})
    x = feeds["x"].astype(np.float64)
    assert y.dtype == np.float16 and mean.dtype == inv.dtype == np.float32
    assert mean.shape == inv.shape == (2, 3, 1)
    np.testing.assert_allclose(mean, x.mean(-1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(inv, 1 / np.sqrt(x.var(-1, keepdims=True) + np.float32(1e-5)), rtol=1e-6)
