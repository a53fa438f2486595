"""Nodes emitted for each target run in ONNX Runtime and compute what the numpy reference of the matched norm
computes, for every combination of optional inputs/outputs, element types with the rounding attributes, and
multi-axis norms; unsupported combinations are refused with a reason."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnxscript import rewriter

from onnx_norm import library
from onnx_norm.ops import functions
from onnx_norm.ops.reference import REFERENCES, elem_type, layer_norm, np_dtype, rms_norm
from onnx_norm.ops.schema import DOMAIN, NormAttributes
from onnx_norm.rewrite import targets
from onnx_norm.rewrite.builder import Builder
from onnx_norm.rewrite.spec import NormSpec

NotImplementedError_ = ort.capi.onnxruntime_pybind11_state.NotImplemented
F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
ALL_OUTPUTS = ("y", "sum", "mean", "inv_std")


def _value(name: str, elem: int, shape: tuple[int | str, ...]) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(ir.DataType(elem)), shape=ir.Shape(shape))


def _spec(
    kind: str,
    x_shape: tuple[int | str, ...],
    x_type: int,
    *,
    skip: bool = False,
    scale: bool = True,
    bias: bool = False,
    p_type: int = F32,
    p_shape: tuple[int, ...] | None = None,
    want: tuple[str, ...] = (),
    attrs: NormAttributes | None = None,
) -> NormSpec:
    attrs = attrs or NormAttributes()
    p_shape = p_shape if p_shape is not None else tuple(x_shape[attrs.axis :])
    y_type = attrs.output_type or x_type
    stat_shape = tuple(x_shape[: attrs.axis]) + (1,) * -attrs.axis
    return NormSpec(
        kind=kind,  # type: ignore[arg-type]
        x=_value("x", x_type, x_shape),
        skip=_value("skip", x_type, x_shape) if skip else None,
        scale=_value("scale", p_type, p_shape) if scale else None,
        bias=_value("bias", p_type, p_shape) if bias else None,
        attrs=attrs,
        y=_value("old_y", y_type, x_shape),
        sum=_value("old_sum", x_type, x_shape) if "sum" in want else None,
        mean=_value("old_mean", F32, stat_shape) if "mean" in want else None,
        inv_std=_value("old_inv_std", F32, stat_shape) if "inv_std" in want else None,
        rule="test-rule",
    )


def _model(spec: NormSpec, target: str, opset: int) -> tuple[ir.Model, Builder]:
    """A model whose inputs are the spec's inputs and whose outputs are what `emit` returned."""
    op = Builder()
    results = targets.emit(op, spec, target, opset)
    names = [n for n in ALL_OUTPUTS if n == "y" or getattr(spec, n) is not None]
    assert len(results) == len(names)
    for value, name in zip(results, names, strict=True):
        value.name = name
    inputs = [v for v in (spec.x, spec.skip, spec.scale, spec.bias) if v is not None]
    opsets = {"": opset, **targets.opset_requirements(target, [spec])}
    opsets[""] = max(opsets[""], opset)
    for domain, version in op.used_opsets:
        if domain and version is not None:
            opsets.setdefault(domain, version)
    graph = ir.Graph(inputs, results, nodes=op.nodes, opset_imports=opsets, name="g")
    model = ir.Model(graph, ir_version=10)
    if target == "onnx-norm":
        functions.attach_functions(model)
    return model, op


def _feeds(spec: NormSpec, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in (spec.x, spec.skip, spec.scale, spec.bias):
        if value is None:
            continue
        shape = tuple(d if isinstance(d, int) else 3 for d in value.shape)
        loc = 4.0 if value.name in ("x", "skip") else 1.0
        data = (rng.standard_normal(shape) * 2.0 + loc).astype(np.float32)
        feeds[value.name] = data.astype(np_dtype(int(value.dtype)))
    return feeds


def _expected(spec: NormSpec, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    attrs = spec.attrs.as_dict()
    x = feeds["x"]
    out: dict[str, np.ndarray] = {}
    if spec.skip is not None:
        op = "SkipRMSNorm" if spec.kind == "rms" else "SkipLayerNorm"
        args = [x, feeds["skip"], feeds.get("scale")] + ([feeds.get("bias")] if spec.kind == "layer" else [])
        out["y"], out["sum"] = REFERENCES[op](*args, **attrs)
        x = out["sum"]
    if spec.kind == "rms":
        y, out["inv_std"] = rms_norm(x, feeds.get("scale"), **attrs)
    else:
        y, out["mean"], out["inv_std"] = layer_norm(x, feeds.get("scale"), feeds.get("bias"), **attrs)
    out.setdefault("y", y)
    return out


def _run(model: ir.Model, feeds: dict[str, np.ndarray], options: ort.SessionOptions | None = None):
    """Runs on the CPU provider; bfloat16 travels as float32 through exact Casts (the Python API has no
    bfloat16 arrays)."""
    proto = ir.serde.serialize_model(model)
    graph = proto.graph
    bf16 = np_dtype(BF16)
    prologue, epilogue = [], []
    for value in list(graph.input) + list(graph.output):
        if value.type.tensor_type.elem_type != BF16:
            continue
        inner = value.name + "__bf16"
        is_input = value in graph.input
        for node in graph.node:
            names = node.input if is_input else node.output
            names[:] = [inner if n == value.name else n for n in names]
        for other in graph.output if is_input else ():
            if other.name == value.name:
                raise AssertionError("graph input passed through to an output")
        src, dst = (value.name, inner) if is_input else (inner, value.name)
        (prologue if is_input else epilogue).append(
            onnx.helper.make_node("Cast", [src], [dst], to=BF16 if is_input else F32)
        )
        value.type.tensor_type.elem_type = F32
    nodes = prologue + list(graph.node) + epilogue
    del graph.node[:]
    graph.node.extend(nodes)
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {k: v.astype(np.float32) if v.dtype == bf16 else v for k, v in feeds.items()}
    names = [o.name for o in session.get_outputs()]
    results = session.run(None, feeds)
    types = {o.name: int(o.dtype) for o in model.graph.outputs}
    return {n: r.astype(bf16) if types[n] == BF16 else r for n, r in zip(names, results, strict=True)}


def _tolerance(elem: int) -> float:
    # One ulp of the result type at values of order 10: float32 vs float64 accumulation may flip a rounding.
    return {F32: 3e-5, F16: 2e-2, BF16: 1.3e-1}[elem]


def _compare(spec: NormSpec, actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    for name, value in actual.items():
        want = expected[name]
        assert value.dtype == want.dtype, name
        assert value.shape == want.shape, name
        # Judge in ulps of the narrowest type the norm rounds to: ONNX Runtime's float16 LayerNormalization and
        # RMSNormalization kernels round once at the end, where the ONNX functions (and the graph) round twice.
        a = spec.attrs
        rounded = [t for t in (a.normalized_type, a.multiply_type, elem_type(want.dtype)) if t]
        tol = max(_tolerance(t) for t in rounded) if name in ("y", "sum") else _tolerance(F32)
        np.testing.assert_allclose(value.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol, err_msg=name)


def _check(spec: NormSpec, target: str, opset: int, seed: int = 0) -> ir.Model:
    model, _ = _model(spec, target, opset)
    feeds = _feeds(spec, seed)
    try:
        actual = _run(model, feeds)
    except NotImplementedError_ as error:
        # e.g. RMSNormalization in bfloat16: the CPU provider expands it into bfloat16 Muls it has no kernel for.
        pytest.skip(f"ONNX Runtime's CPU provider cannot run this model: {error}")
    _compare(spec, actual, _expected(spec, feeds))
    return model


# (x type, scale type, normalized_type, multiply_type, output_type)
DTYPE_CASES = [
    (F32, F32, 0, 0, 0),
    (F16, F16, F16, F16, 0),  # LLaMA / fp16 model without Casts
    (BF16, BF16, BF16, BF16, 0),
    (F16, F32, 0, 0, F16),  # Gemma: fp32 normalise and scale, fp16 output
    (BF16, F32, 0, 0, BF16),
    (F32, F16, F16, F16, F16),  # fp32 activations, fp16 weights
    (F16, F16, F16, F16, F32),
    (BF16, F32, BF16, 0, F32),
]


def _layouts(kind: str) -> list[dict]:
    layouts = []
    for skip, scale, bias in itertools.product([False, True], [False, True], [False, True]):
        if kind == "rms" and bias:
            continue
        wants: list[tuple[str, ...]] = [()]
        if skip:
            wants.append(("sum",))
        if kind == "layer":
            wants.append(("mean", "inv_std"))
        else:
            wants.append(("inv_std",))
        for want in wants:
            layouts.append({"skip": skip, "scale": scale, "bias": bias, "want": want})
    return layouts


def _cases(target: str) -> list:
    cases = []
    for kind in ("layer", "rms"):
        for layout in _layouts(kind):
            cases.append(pytest.param(kind, layout, (F32, F32, 0, 0, 0), id=f"{kind}-{layout}-f32"))
        full = {"skip": False, "scale": True, "bias": kind == "layer", "want": ()}
        for dtypes in DTYPE_CASES[1:]:
            for skip in (False, True):
                cases.append(pytest.param(kind, dict(full, skip=skip), dtypes, id=f"{kind}-skip{skip}-{dtypes}"))
    return cases


def _opset(target: str, kind: str) -> int:
    return {"onnx-norm": 18, "onnx": 23, "ort": 18}[target]


@pytest.mark.parametrize("target", ["onnx-norm", "onnx", "ort"])
@pytest.mark.parametrize(("kind", "layout", "dtypes"), _cases("all"))
def test_emitted_nodes_match_reference(target: str, kind: str, layout: dict, dtypes: tuple[int, ...]) -> None:
    x_type, p_type, nt, mt, ot = dtypes
    attrs = NormAttributes(axis=-1, epsilon=1e-5, normalized_type=nt, multiply_type=mt, output_type=ot)
    spec = _spec(kind, (2, 3, 16), x_type, p_type=p_type, attrs=attrs, **layout)
    opset = _opset(target, kind)
    reason = targets.unsupported_reason(spec, target, {"": opset})
    if reason is not None:
        if target == "onnx-norm":
            stats_on_skip = layout["skip"] and set(layout["want"]) & {"mean", "inv_std"}
            assert stats_on_skip or "types Y like X" in reason, reason
        with pytest.raises(ValueError, match="cannot emit"):
            targets.emit(Builder(), spec, target, opset)
        pytest.skip(reason)
    model = _check(spec, target, opset)
    for node in model.graph:
        assert node.metadata_props.get(targets.RULE_METADATA_KEY) == "test-rule", node


@pytest.mark.parametrize("target", ["onnx-norm", "onnx", "ort"])
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize(
    ("x_shape", "axis", "p_shape"), [((3, 4, 8), -2, (4, 8)), ((2, 3, 4, 5), -3, (3, 4, 5)), ((2, 3, 4, 5), -2, (5,))]
)
def test_multi_axis(target: str, kind: str, x_shape: tuple[int, ...], axis: int, p_shape: tuple[int, ...]) -> None:
    attrs = NormAttributes(axis=axis, epsilon=1e-6)
    if p_shape == (5,):
        x_shape = (2, 3, 1, 5)  # a scale without the leading 1 of the normalised dims
    spec = _spec(
        kind,
        x_shape,
        F32,
        bias=kind == "layer",
        p_shape=p_shape,
        attrs=attrs,
        want=("inv_std",) if target != "onnx" or kind == "layer" else (),
    )
    opset = _opset(target, kind)
    assert targets.unsupported_reason(spec, target, {"": opset}) is None
    _check(spec, target, opset)


def test_symbolic_dims_without_scale() -> None:
    """Ops that need a scale get ones of the normalised shape, computed at run time for symbolic dims."""
    attrs = NormAttributes(axis=-2)
    for target, opset in (("onnx", 17), ("ort", 16), ("ort", 18)):
        spec = _spec("layer", ("batch", "rows", "cols"), F32, scale=False, attrs=attrs)
        model, _ = _model(spec, target, opset)
        assert "ConstantOfShape" in {node.op_type for node in model.graph}
        rng = np.random.default_rng(0)
        for shape in [(2, 3, 4), (1, 5, 2)]:
            feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
            _compare(spec, _run(model, feeds), _expected(spec, feeds))


@pytest.mark.parametrize("opset", [16, 17])
def test_ort_layer_norm_below_and_above_opset_17(opset: int) -> None:
    spec = _spec(
        "layer", (2, 3, 16), F16, p_type=F32, bias=True, want=("mean", "inv_std"), attrs=NormAttributes(output_type=F16)
    )
    model = _check(spec, "ort", opset)
    ops = {node.op_type for node in model.graph}
    assert "LayerNormalization" in ops
    assert model.graph.opset_imports[""] == opset


def test_ort_uses_fused_skip_ops_for_float32() -> None:
    for kind, name in (("layer", "SkipLayerNormalization"), ("rms", "SkipSimplifiedLayerNormalization")):
        spec = _spec(kind, (2, 3, 16), F32, skip=True, bias=kind == "layer", want=("sum",))
        model = _check(spec, "ort", 18)
        assert [node.op_type for node in model.graph if node.domain == targets.MS_DOMAIN] == [name]
        # The residual of a float16 model is rounded before the norm: a separate Add, as in the graph.
        spec16 = _spec(
            kind,
            (2, 3, 16),
            F16,
            skip=True,
            p_type=F16,
            bias=kind == "layer",
            want=("sum",),
            attrs=NormAttributes(normalized_type=0, multiply_type=0),
        )
        model16 = _check(spec16, "ort", 18)
        assert "Add" in {node.op_type for node in model16.graph}


def test_fused_ops_fold_what_they_can() -> None:
    """fp32 norms become one op; a Gemma-style norm folds its scale; a LLaMA-style one keeps its Mul for ORT."""

    def plain():
        return _spec("rms", (2, 3, 16), F32)

    def gemma():
        return _spec("rms", (2, 3, 16), F16, p_type=F32, attrs=NormAttributes(output_type=F16))

    def llama():
        return _spec("rms", (2, 3, 16), F16, p_type=F16, attrs=NormAttributes(normalized_type=F16, multiply_type=F16))

    assert [n.op_type for n in _model(plain(), "ort", 18)[0].graph] == ["SimplifiedLayerNormalization"]
    # Y takes the scale's type in ORT's op: a float32 scale gives float32, then one Cast to float16.
    assert [n.op_type for n in _model(gemma(), "ort", 18)[0].graph] == ["SimplifiedLayerNormalization", "Cast"]
    assert "Mul" in [n.op_type for n in _model(llama(), "ort", 18)[0].graph]
    # The standard RMSNormalization in float16 rounds exactly like the LLaMA graph: one op.
    assert [n.op_type for n in _model(llama(), "onnx", 23)[0].graph] == ["RMSNormalization"]
    assert [n.op_type for n in _model(llama(), "onnx-norm", 18)[0].graph] == ["RMSNorm"]


def test_unsupported_reasons() -> None:
    layer = _spec("layer", (2, 16), F32)
    rms = _spec("rms", (2, 16), F32)
    assert "opset >= 17" in targets.unsupported_reason(layer, "onnx", {"": 16})
    assert "opset >= 23" in targets.unsupported_reason(rms, "onnx", {"": 22})
    assert targets.unsupported_reason(rms, "onnx", {"": 23}) is None
    assert "inverse-RMS" in targets.unsupported_reason(_spec("rms", (2, 16), F32, want=("inv_std",)), "onnx", {"": 23})
    assert "statistics" in targets.unsupported_reason(
        _spec("layer", (2, 16), F32, skip=True, want=("mean",)), "onnx-norm", {"": 18}
    )
    assert targets.unsupported_reason(layer, "onnx-norm", {"": 9}) is None  # paddle.onnx.export's default opset
    old = targets.unsupported_reason(layer, "onnx-norm", {"": 8})
    assert "opset >= 9" in old and "the 'ort' target has no such limit" in old
    assert targets.unsupported_reason(layer, "ort", {"": 8}) is None  # which the hint promises
    assert "unknown target" in targets.unsupported_reason(layer, "tensorrt", {"": 18})
    double = _spec("layer", (2, 16), TensorProto.DOUBLE)
    assert "fp64 is not fp32, fp16 or bf16" in targets.unsupported_reason(double, "onnx-norm", {"": 18})
    # A graph that rounds the normalised value to float16 and multiplies by a float32 scale: no op folds the
    # scale, the op runs in float32, a Cast rounds its result and the Mul stays separate.
    for target, opset in (("ort", 18), ("onnx", 23)):
        odd = _spec("rms", (2, 16), F32, p_type=F32, attrs=NormAttributes(normalized_type=F16))
        assert targets.unsupported_reason(odd, target, {"": opset}) is None
        model = _check(odd, target, opset)
        assert [n.op_type for n in model.graph if n.op_type in ("Cast", "Mul")] == ["Cast", "Cast", "Mul"]


def test_opset_requirements() -> None:
    layer, rms = _spec("layer", (2, 16), F32), _spec("rms", (2, 16), F32)
    assert targets.opset_requirements("onnx-norm", [layer]) == {DOMAIN: 1}
    assert targets.opset_requirements("onnx", [layer]) == {"": 17}
    assert targets.opset_requirements("onnx", [layer, rms]) == {"": 23}
    assert targets.opset_requirements("ort", [_spec("rms", (2, 3, 16), F32, skip=True)]) == {targets.MS_DOMAIN: 1}
    assert targets.opset_requirements("ort", []) == {}


def test_onnx_norm_nodes_set_every_attribute() -> None:
    attrs = NormAttributes(axis=-2, epsilon=1e-6, normalized_type=F16, multiply_type=BF16, output_type=BF16)
    spec = _spec("layer", (2, 3, 16), F16, p_type=F16, bias=True, want=("inv_std",), attrs=attrs)
    model, _ = _model(spec, "onnx-norm", 18)
    (node,) = list(model.graph)
    assert (node.domain, node.op_type) == (DOMAIN, "LayerNorm")
    assert {k: a.value for k, a in node.attributes.items()} == attrs.as_dict()
    assert len(node.outputs) == 3  # Y, Mean (unused), InvStdDev


def test_onnx_norm_nodes_write_output_type_of_x_as_zero() -> None:
    """output_type equal to X's type is the same Y as 0, and only 0 loads for a float16 X on ONNX Runtime's CPU
    provider (which runs the op in float32 between its own Casts, docs/ops.md)."""
    attrs = NormAttributes(axis=-2, epsilon=1e-6, normalized_type=F16, multiply_type=F16, output_type=F16)
    spec = _spec("layer", (2, 3, 16), F16, p_type=F16, bias=True, attrs=attrs)
    model = _check(spec, "onnx-norm", 18)
    (node,) = list(model.graph)
    assert {k: a.value for k, a in node.attributes.items()} == {**attrs.as_dict(), "output_type": 0}


def test_output_type_becomes_a_cast_where_exact() -> None:
    """Our library types Y like X, so a float32 Y after a float16 multiply is a Cast after the op; a float32 Y from
    a bfloat16 X whose result is not rounded to bfloat16 is the op on X cast to float32 (a Cast after it would
    round); a float16 Y from a bfloat16 X rounded elsewhere is the op with output_type, or refused where X's rank
    is unknown."""
    split = _spec(
        "rms", (2, 16), F16, p_type=F16, attrs=NormAttributes(normalized_type=F16, multiply_type=F16, output_type=F32)
    )
    model = _check(split, "onnx-norm", 18)
    assert [n.op_type for n in model.graph] == ["RMSNorm", "Cast"]
    assert model.graph.node(0).attributes["output_type"].value == 0
    widened = _spec("rms", (2, 16), BF16, p_type=F32, attrs=NormAttributes(normalized_type=BF16, output_type=F32))
    model = _check(widened, "onnx-norm", 18)
    assert [n.op_type for n in model.graph] == ["Cast", "RMSNorm"]
    assert model.graph.node(0).attributes["to"].value == F32
    assert model.graph.node(1).attributes["output_type"].value == 0
    assert model.graph.node(1).attributes["normalized_type"].value == BF16
    # A float16 Y from a bfloat16 X, rounded nowhere else: neither form exists, so the op carries output_type
    # where X's rank is known (ONNX Runtime then applies the type its shape inference gives Y), else is refused.
    other = _spec("rms", (2, 16), BF16, p_type=F32, attrs=NormAttributes(normalized_type=F32, output_type=F16))
    model = _check(other, "onnx-norm", 18)
    assert [n.op_type for n in model.graph] == ["RMSNorm"]
    assert model.graph.node(0).attributes["output_type"].value == F16
    refused = _spec("rms", (2, 16), BF16, p_type=F32, attrs=NormAttributes(normalized_type=F32, output_type=F16))
    refused.x.shape = None
    assert "types Y like X" in targets.unsupported_reason(refused, "onnx-norm", {"": 18})
    targets.LIBRARY_TYPES_Y_LIKE_X = False
    try:
        kept = _spec("rms", (2, 16), BF16, p_type=F32, attrs=NormAttributes(normalized_type=BF16, output_type=F32))
        model = _check(kept, "onnx-norm", 18)  # the function path honours output_type
    finally:
        targets.LIBRARY_TYPES_Y_LIKE_X = True
    assert [n.op_type for n in model.graph] == ["RMSNorm"]
    assert model.graph.node(0).attributes["output_type"].value == F32


needs_library = pytest.mark.skipif(not library.library_available(), reason="the onnx_norm library is not built")


@needs_library
@pytest.mark.parametrize(("kind", "layout", "dtypes"), _cases("all"))
def test_onnx_norm_target_with_the_library(kind: str, layout: dict, dtypes: tuple[int, ...]) -> None:
    """The same emitted models run by our kernels (the library registered) match the reference."""
    x_type, p_type, nt, mt, ot = dtypes
    attrs = NormAttributes(axis=-1, epsilon=1e-5, normalized_type=nt, multiply_type=mt, output_type=ot)
    spec = _spec(kind, (2, 3, 16), x_type, p_type=p_type, attrs=attrs, **layout)
    if targets.unsupported_reason(spec, "onnx-norm", {"": 18}) is not None:
        pytest.skip("not an onnx-norm signature")
    model, _ = _model(spec, "onnx-norm", 18)
    feeds = _feeds(spec, 0)
    options = library.session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    actual = _run(model, feeds, options)
    _compare(spec, actual, _expected(spec, feeds))


def test_through_a_rewrite_rule() -> None:
    """emit works with the builder the onnxscript rewriter passes to a rule's rewrite function."""
    x = _value("x", F32, (2, 8))
    scale = ir.Value(
        name="scale",
        type=ir.TensorType(ir.DataType.FLOAT),
        shape=ir.Shape((8,)),
        const_value=ir.tensor(np.linspace(0.5, 2.0, 8, dtype=np.float32), name="scale"),
    )
    graph = ir.Graph([x], [], nodes=[], initializers=[scale], opset_imports={"": 18}, name="g")
    tape = ir.tape.Tape(graph)
    mean = tape.op("ReduceMean", [x, tape.initializer(ir.tensor(np.array([-1], np.int64), name="axes"))])
    sq = tape.op("Mul", [x, x])
    ms = tape.op("ReduceMean", [sq, graph.initializers["axes"]])
    del mean  # an unused node to make sure the rule does not need the whole graph
    eps = tape.initializer(ir.tensor(np.array(1e-6, np.float32), name="eps"))
    inv = tape.op("Reciprocal", [tape.op("Sqrt", [tape.op("Add", [ms, eps])])])
    y = tape.op("Mul", [tape.op("Mul", [x, inv]), scale])
    y.name, y.dtype, y.shape = "y", ir.DataType.FLOAT, ir.Shape((2, 8))
    graph.outputs.append(y)
    model = ir.Model(graph, ir_version=10)

    def pattern(op, x, axes, eps, scale):
        ms = op.ReduceMean(op.Mul(x, x), axes)
        return op.Mul(op.Mul(x, op.Reciprocal(op.Sqrt(op.Add(ms, eps)))), scale)

    def rewrite(op, x, axes, eps, scale, **_):
        attrs = NormAttributes(axis=-1, epsilon=float(eps.const_value.numpy()))
        spec = NormSpec("rms", x, None, scale, None, attrs, y, rule="rms-test")
        return targets.emit(op, spec, "onnx-norm")[0]

    rule = rewriter.pattern.RewriteRule(pattern, rewrite)
    assert rule.apply_to_model(model) == 1
    functions.attach_functions(model)
    fused = [n for n in model.graph if n.domain == DOMAIN]
    assert len(fused) == 1
    assert fused[0].metadata_props[targets.RULE_METADATA_KEY] == "rms-test"
    assert model.opset_imports[DOMAIN] == 1
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    actual = _run(model, feeds)["y"]
    np.testing.assert_allclose(actual, rms_norm(feeds["x"], scale.const_value.numpy(), epsilon=1e-6)[0], rtol=3e-5)


def test_targets_come_from_the_registry() -> None:
    assert targets.TARGETS == tuple(targets._TARGETS) == ("onnx-norm", "onnx", "ort")
    for name in targets.TARGETS:
        target = targets.get(name)
        assert target.name == name and target.help
    with pytest.raises(ValueError, match="unknown target 'tensorrt'"):
        targets.get("tensorrt")


def test_a_rewrite_plans_each_norm_once(monkeypatch) -> None:
    """The check when a rule selects a candidate and the emission share one plan."""
    import dataclasses

    from rewrite_support import FLOAT, const, make_model

    from onnx_norm.rewrite import optimize

    nodes = [
        onnx.helper.make_node("Mul", ["x", "x"], ["sq"]),
        onnx.helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        onnx.helper.make_node("Add", ["ms", "eps"], ["ve"]),
        onnx.helper.make_node("Sqrt", ["ve"], ["s"]),
        onnx.helper.make_node("Div", ["x", "s"], ["n"]),
        onnx.helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    inits = [const("axes", [-1], np.int64), const("eps", 1e-6, np.float32), const("w", np.ones(8, np.float32))]
    model = make_model(nodes, [("x", FLOAT, ["b", 8])], [("y", FLOAT, None)], inits, opset=23)
    for name in targets.TARGETS:
        calls: list = []
        real = targets.get(name)

        def counting(spec, opset, real=real, calls=calls):
            calls.append(spec)
            return real.plan(spec, opset)

        monkeypatch.setitem(targets._TARGETS, name, dataclasses.replace(real, plan=counting))
        _, report = optimize(model, target=name)
        assert report.fused == 1 and len(calls) == 1, (name, len(calls))
