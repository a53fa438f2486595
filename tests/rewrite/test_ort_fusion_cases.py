"""The shapes of ONNX Runtime's own LayerNorm / SimplifiedLayerNorm / SkipLayerNorm fusion test models, rebuilt
here (written for these tests from what its generator scripts in onnxruntime/test/testdata/transform/fusion and
its graph-transform tests in onnxruntime/test/optimizer/graph_transform_test_layernorm.cc exercise): nodes appended
after their consumers, residual and bias Adds after the norm, a duplicated centring Sub, gamma on either side of the
Mul, graph outputs without a type, two norms of one input, Casts around any step, ReduceMean axes as attribute or
input and over two axes, integer Pow exponents, exponents shared between norms, gamma and beta behind Identity
nodes, residual sums also read elsewhere or graph outputs, residual Adds in front of native LayerNormalization.
Every positive case is fused and passes verify (parity, and never less accurate than the original); every
negative one is left exactly as it was. tools/ort_fusion_cases.py counts what ONNX Runtime's own optimizer fuses
on the same models (docs/recognised.md)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_norm

H = 4
SHAPE = [16, 32, H]
F32 = TensorProto.FLOAT


def _t(name: str, values, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def _model(nodes, inputs, initializers, *, typed_output: bool = False, dtype: int = F32) -> onnx.ModelProto:
    """Nodes as given (consumers first, as the generators append them), opset 13, output typed or not."""
    output = helper.make_tensor_value_info("C", dtype, SHAPE) if typed_output else onnx.ValueInfoProto(name="C")
    graph = helper.make_graph(
        nodes, "ort_case", [helper.make_tensor_value_info(n, dtype, SHAPE) for n in inputs], [output], initializers
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _layer_norm_nodes(x: str, *, two_subs: bool, gamma_first: bool) -> list[onnx.NodeProto]:
    centred_for_div = "sb1" if two_subs else "sb2"
    nodes = [
        helper.make_node("Mul", ["gamma", "div"] if gamma_first else ["div", "gamma"], ["mul"]),
        helper.make_node("Add", ["mul", "beta"], ["C"]),
        helper.make_node("Div", [centred_for_div, "sqrt"], ["div"]),
        helper.make_node("Sqrt", ["ve"], ["sqrt"]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("ReduceMean", ["pow"], ["var"], axes=[-1], keepdims=1),
        helper.make_node("Pow", ["sb2", "two"], ["pow"]),
        helper.make_node("Sub", [x, "mean"], ["sb2"]),
        helper.make_node("ReduceMean", [x], ["mean"], axes=[-1], keepdims=1),
    ]
    if two_subs:
        nodes.append(helper.make_node("Sub", [x, "mean"], ["sb1"]))
    return nodes


def _ln_constants(eps: float = 1e-12) -> list[onnx.TensorProto]:
    return [
        _t("two", 2.0),
        _t("eps", eps),
        _t("gamma", [1.0, 2.0, 3.0, 4.0]),
        _t("beta", [0.1, 0.2, 0.3, 0.4]),
    ]


def _skip(fmt: int, partial: bool) -> onnx.ModelProto:
    """Format 1: (A + bias) + B; format 2: A + (B + bias); format 3: A + B. `partial`: the sum before the
    residual Add (or the residual sum itself, format 3) has another consumer too."""
    nodes = _layer_norm_nodes("ln_in", two_subs=True, gamma_first=True)
    constants = _ln_constants()
    if fmt == 1:
        nodes += [helper.make_node("Add", ["A", "bias"], ["a3"]), helper.make_node("Add", ["a3", "B"], ["ln_in"])]
    elif fmt == 2:
        nodes += [helper.make_node("Add", ["B", "bias"], ["a3"]), helper.make_node("Add", ["A", "a3"], ["ln_in"])]
    else:
        nodes += [helper.make_node("Add", ["A", "B"], ["ln_in"])]
    if fmt != 3:
        constants.append(_t("bias", [0.1, 0.2, 0.3, 0.4]))
    model = _model(nodes, ["A", "B"], constants)
    if partial:
        model.graph.node.append(helper.make_node("Neg", ["ln_in" if fmt == 3 else "a3"], ["neg"]))
        model.graph.output.append(onnx.ValueInfoProto(name="neg"))
    return model


def _simplified(reciprocal: bool) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Mul", ["scale", "normed"], ["C"]),
        helper.make_node("Mul", ["x", "inv"], ["normed"])
        if reciprocal
        else helper.make_node("Div", ["x", "sqrt"], ["normed"]),
        helper.make_node("Sqrt", ["ve"], ["sqrt"]),
        helper.make_node("Add", ["ms", "eps"], ["ve"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Pow", ["x", "two"], ["sq"]),
    ]
    if reciprocal:
        nodes.insert(2, helper.make_node("Reciprocal", ["sqrt"], ["inv"]))
    constants = [_t("two", 2.0), _t("eps", 1e-6), _t("scale", [1.0, 2.0, 3.0, 4.0])]
    return _model(nodes, ["x"], constants)


def _fp16_with_casts(skip: bool) -> onnx.ModelProto:
    """fp16 in and out, the norm in fp32 between Casts (ORT's layer_norm_with_cast cases)."""
    nodes = _layer_norm_nodes("x32", two_subs=False, gamma_first=False)
    nodes[1] = helper.make_node("Add", ["mul", "beta"], ["c32"])
    nodes += [helper.make_node("Cast", ["c32"], ["C"], to=TensorProto.FLOAT16)]
    if skip:
        nodes += [helper.make_node("Add", ["A", "B"], ["x16"]), helper.make_node("Cast", ["x16"], ["x32"], to=F32)]
        inputs = ["A", "B"]
    else:
        nodes += [helper.make_node("Cast", ["x"], ["x32"], to=F32)]
        inputs = ["x"]
    return _model(nodes, inputs, _ln_constants(1e-5), dtype=TensorProto.FLOAT16)


def _fp16_skip_to_fp32() -> onnx.ModelProto:
    """fp16 residual Add, Cast to fp32 before the norm, fp32 out: Y needs another type than X."""
    nodes = _layer_norm_nodes("x32", two_subs=False, gamma_first=False)
    nodes += [helper.make_node("Add", ["A", "B"], ["x16"]), helper.make_node("Cast", ["x16"], ["x32"], to=F32)]
    graph = helper.make_graph(
        nodes,
        "ort_case",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT16, SHAPE) for n in ("A", "B")],
        [onnx.ValueInfoProto(name="C")],
        _ln_constants(1e-5),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


F16 = TensorProto.FLOAT16
_node = helper.make_node


def _graph_model(nodes, inputs, outputs, initializers, opset: int) -> onnx.ModelProto:
    """inputs/outputs: (name, elem type, shape) triples, nodes in the order given."""
    graph = helper.make_graph(
        nodes,
        "ort_case",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _shared_input() -> onnx.ModelProto:
    """layer_norm_shared_input.py (GPT-J's parallel residual): two LayerNorms of one input, epsilon 0, gamma
    first in the Mul and beta first in the Add."""
    nodes, constants = [], []
    for p in ("LN1/", "LN2/"):
        nodes += [
            _node("ReduceMean", ["A"], [p + "m"], axes=[-1]),
            _node("Sub", ["A", p + "m"], [p + "d"]),
            _node("Pow", [p + "d", p + "two"], [p + "sq"]),
            _node("ReduceMean", [p + "sq"], [p + "v"], axes=[-1]),
            _node("Add", [p + "v", p + "eps"], [p + "ve"]),
            _node("Sqrt", [p + "ve"], [p + "s"]),
            _node("Div", [p + "d", p + "s"], [p + "n"]),
            _node("Mul", [p + "gamma", p + "n"], [p + "g"]),
            _node("Add", [p + "beta", p + "g"], [p + "C"]),
        ]
        constants += [
            _t(p + "two", 2.0),
            _t(p + "eps", 0.0),
            _t(p + "gamma", [1, 2, 3, 4]),
            _t(p + "beta", [1, 2, 3, 4]),
        ]
    outputs = [("LN1/C", F32, SHAPE), ("LN2/C", F32, SHAPE)]
    return _graph_model(nodes, [("A", F32, SHAPE)], outputs, constants, 12)


def _with_cast_2() -> onnx.ModelProto:
    """layer_norm_with_cast_2.py: fp16 throughout, the exponent a Cast of an fp32 2 to fp16, epsilon 0 in fp16."""
    nodes = [
        _node("ReduceMean", ["A"], ["m"], axes=[-1]),
        _node("Sub", ["A", "m"], ["d"]),
        _node("Cast", ["two32"], ["two"], to=F16),
        _node("Pow", ["d", "two"], ["sq"]),
        _node("ReduceMean", ["sq"], ["v"], axes=[-1]),
        _node("Add", ["v", "eps"], ["ve"]),
        _node("Sqrt", ["ve"], ["s"]),
        _node("Div", ["d", "s"], ["n"]),
        _node("Mul", ["gamma", "n"], ["g"]),
        _node("Add", ["beta", "g"], ["C"]),
    ]
    constants = [
        _t("two32", 2.0),
        _t("eps", 0.0, np.float16),
        _t("gamma", [1, 2, 3, 4], np.float16),
        _t("beta", [1, 2, 3, 4], np.float16),
    ]
    return _graph_model(nodes, [("A", F16, SHAPE)], [("C", F16, SHAPE)], constants, 12)


def _with_cast_3() -> onnx.ModelProto:
    """layer_norm_with_cast_3.py: fp32 in, the normalised value cast to fp16, fp16 gamma and beta, fp16 out."""
    nodes = [
        _node("ReduceMean", ["A"], ["m"], axes=[-1]),
        _node("Sub", ["A", "m"], ["d"]),
        _node("Pow", ["d", "two"], ["sq"]),
        _node("ReduceMean", ["sq"], ["v"], axes=[-1]),
        _node("Add", ["v", "eps"], ["ve"]),
        _node("Sqrt", ["ve"], ["s"]),
        _node("Div", ["d", "s"], ["n"]),
        _node("Cast", ["n"], ["n16"], to=F16),
        _node("Mul", ["gamma", "n16"], ["g"]),
        _node("Add", ["beta", "g"], ["C"]),
    ]
    constants = [
        _t("two", 2.0),
        _t("eps", 0.0),
        _t("gamma", [1, 2, 3, 4], np.float16),
        _t("beta", [1, 2, 3, 4], np.float16),
    ]
    return _graph_model(nodes, [("A", F32, SHAPE)], [("C", F16, SHAPE)], constants, 12)


def _scale_bias_identity() -> onnx.ModelProto:
    """layer_norm_fusion_scale_bias.py: fp16 in, the centred value cast to fp32, the normalised one back to fp16,
    gamma and beta through Identity nodes (neither a graph input nor an initializer where the Mul reads them)."""
    nodes = [
        _node("ReduceMean", ["A"], ["m"], axes=[-1], keepdims=1),
        _node("Sub", ["A", "m"], ["d"]),
        _node("Pow", ["d32", "two"], ["sq"]),
        _node("ReduceMean", ["sq"], ["v"], axes=[-1], keepdims=1),
        _node("Add", ["v", "eps"], ["ve"]),
        _node("Sqrt", ["ve"], ["s"]),
        _node("Div", ["d32", "s"], ["n"]),
        _node("Mul", ["gamma_id", "n16"], ["g"]),
        _node("Add", ["g", "beta_id"], ["C"]),
        _node("Cast", ["d"], ["d32"], to=F32),
        _node("Cast", ["n"], ["n16"], to=F16),
        _node("Identity", ["gamma"], ["gamma_id"]),
        _node("Identity", ["beta"], ["beta_id"]),
    ]
    constants = [
        _t("two", 2.0),
        _t("eps", 1e-12),
        _t("beta", [1e-6] * 4, np.float16),
        _t("gamma", [1, 2, 3, 4], np.float16),
    ]
    return _graph_model(nodes, [("A", F16, SHAPE)], [("C", F16, SHAPE)], constants, 12)


def _t5_with_casts() -> onnx.ModelProto:
    """layer_norm_t5_gen.py's simplified_layer_norm_with_casts: fp16 in, RMSNorm in fp32, Cast to fp16, fp16 gamma."""
    nodes = [
        _node("Pow", ["A32", "two"], ["sq"]),
        _node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        _node("Add", ["ms", "eps"], ["ve"]),
        _node("Sqrt", ["ve"], ["s"]),
        _node("Div", ["A32", "s"], ["n"]),
        _node("Mul", ["gamma", "n16"], ["C"]),
        _node("Cast", ["A"], ["A32"], to=F32),
        _node("Cast", ["n"], ["n16"], to=F16),
    ]
    constants = [_t("two", 2.0), _t("eps", 1e-12), _t("gamma", [1, 2, 3, 4], np.float16)]
    return _graph_model(nodes, [("A", F16, SHAPE)], [("C", F16, SHAPE)], constants, 12)


def _build_layer_norm(axes1, axes2, opset: int, *, eps_first: bool = False, eps: float = 1e-5) -> onnx.ModelProto:
    """graph_transform_test_layernorm.cc's BuildLayerNorm: fp16 [2, 3, 3, 3] in, the centred value cast to fp32,
    the normalised one back to fp16, fp16 gamma (ones) and beta (zeros) of the normalised dims' shape; the
    ReduceMean axes as an attribute below opset 18, an input from it."""
    shape = [2, 3, 3, 3]
    normalised = [shape[a] for a in sorted(a % 4 for a in axes1)]

    def reduce(x: str, out: str, axes, name: str) -> list[onnx.NodeProto]:
        if opset >= 18:
            return [_node("ReduceMean", [x, name], [out])]
        return [_node("ReduceMean", [x], [out], axes=list(axes))]

    nodes = [
        *reduce("X", "m", axes1, "axes1"),
        _node("Sub", ["X", "m"], ["d"]),
        _node("Cast", ["d"], ["d32"], to=F32),
        _node("Pow", ["d32", "two"], ["sq"]),
        *reduce("sq", "v", axes2, "axes2"),
        _node("Add", ["eps", "v"] if eps_first else ["v", "eps"], ["ve"]),
        _node("Sqrt", ["ve"], ["s"]),
        _node("Div", ["d32", "s"], ["n"]),
        _node("Cast", ["n"], ["n16"], to=F16),
        _node("Mul", ["n16", "gamma"], ["g"]),
        _node("Add", ["g", "beta"], ["Y"]),
    ]
    constants = [
        _t("two", 2.0),
        _t("eps", eps),
        _t("gamma", np.ones(normalised), np.float16),
        _t("beta", np.zeros(normalised), np.float16),
    ]
    if opset >= 18:
        constants += [_t("axes1", list(axes1), np.int64), _t("axes2", list(axes2), np.int64)]
    return _graph_model(nodes, [("X", F16, shape)], [("Y", F16, shape)], constants, opset)


def _rms_nodes(x: str, out: str, p: str, *, two: str = "two", eps: str = "eps", scale: str = "scale", eps_first=False):
    return [
        _node("Pow", [x, two], [p + "sq"]),
        _node("ReduceMean", [p + "sq"], [p + "ms"], axes=[-1]),
        _node("Add", [eps, p + "ms"] if eps_first else [p + "ms", eps], [p + "ve"]),
        _node("Sqrt", [p + "ve"], [p + "s"]),
        _node("Div", [x, p + "s"], [p + "n"]),
        _node("Mul", [p + "n", scale], [out]),
    ]


def _rms_shared_cast_exponent(leading_cast: bool) -> onnx.ModelProto:
    """SimplifiedLayerNormFusionSharedCastPowExponent: two RMSNorms sharing one Cast(fp16 2 -> fp32) exponent;
    with `leading_cast` their inputs are fp16, each cast to fp32 first."""
    nodes = [_node("Cast", ["two16"], ["two"], to=F32)]
    inputs, outputs = [], []
    for i in (1, 2):
        x = f"x{i}"
        if leading_cast:
            nodes.append(_node("Cast", [x], [f"x{i}_32"], to=F32))
        nodes += _rms_nodes(f"x{i}_32" if leading_cast else x, f"y{i}", f"n{i}/")
        inputs.append((x, F16 if leading_cast else F32, [2, 4]))
        outputs.append((f"y{i}", F32, [2, 4]))
    constants = [_t("two16", 2.0, np.float16), _t("eps", 1e-5), _t("scale", [1, 1, 1, 1])]
    return _graph_model(nodes, inputs, outputs, constants, 17)


def _rms_single(exponent: np.ndarray, *, eps_first: bool = False, cast_exponent: bool = False) -> onnx.ModelProto:
    """One fp32 RMSNorm over [2, 4], as graph_transform_test_layernorm.cc builds them: the Pow exponent of any type
    (or a Cast of an fp16 one), epsilon 1e-4 on either side of the Add."""
    nodes = _rms_nodes("x", "y", "", eps_first=eps_first)
    constants = [_t("eps", 1e-4), _t("scale", [1, 1, 1, 1])]
    if cast_exponent:
        nodes.insert(0, _node("Cast", ["two16"], ["two"], to=F32))
        constants.append(_t("two16", exponent, np.float16))
    else:
        constants.append(numpy_helper.from_array(exponent, "two"))
    return _graph_model(nodes, [("x", F32, [2, 4])], [("y", F32, [2, 4])], constants, 17)


def _rms_fp16_shared_exponent() -> onnx.ModelProto:
    """SimplifiedLayerNormFusionOptimizationLoopSharedPowExponent: two fp16 RMSNorms sharing one fp16 exponent,
    fp16 epsilon and scale, beside an independent fp16 Conv."""
    nodes = []
    for i in (1, 2):
        nodes += _rms_nodes(f"x{i}", f"y{i}", f"n{i}/", eps=f"eps{i}", scale=f"scale{i}")
    nodes.append(_node("Conv", ["c", "w", "b"], ["cy"]))
    constants = [
        _t("two", 2.0, np.float16),
        _t("w", np.full([1, 1, 3, 3], 0.25), np.float16),
        _t("b", [0.0], np.float16),
    ]
    for i in (1, 2):
        constants += [_t(f"eps{i}", 1e-4, np.float16), _t(f"scale{i}", [1, 1, 1, 1], np.float16)]
    inputs = [("x1", F16, [2, 4]), ("x2", F16, [2, 4]), ("c", F16, [1, 1, 5, 5])]
    outputs = [("y1", F16, [2, 4]), ("y2", F16, [2, 4]), ("cy", F16, [1, 1, 3, 3])]
    return _graph_model(nodes, inputs, outputs, constants, 17)


def _current_opset_layer_norm() -> onnx.ModelProto:
    """LayerNormFusionCurrentOpsetTest at the newest opset ONNX Runtime 1.31 runs (axes as inputs), hidden 64."""
    nodes = [
        _node("ReduceMean", ["x", "axes"], ["m"]),
        _node("Sub", ["x", "m"], ["d"]),
        _node("Pow", ["d", "two"], ["sq"]),
        _node("ReduceMean", ["sq", "axes"], ["v"]),
        _node("Add", ["v", "eps"], ["ve"]),
        _node("Sqrt", ["ve"], ["s"]),
        _node("Div", ["d", "s"], ["n"]),
        _node("Mul", ["n", "gamma"], ["g"]),
        _node("Add", ["g", "beta"], ["y"]),
    ]
    constants = [
        _t("axes", [-1], np.int64),
        _t("two", 2.0),
        _t("eps", 1e-5),
        _t("gamma", np.linspace(-1, 1, 64)),
        _t("beta", np.linspace(-0.5, 0.5, 64)),
    ]
    return _graph_model(nodes, [("x", F32, [2, 3, 64])], [("y", F32, [2, 3, 64])], constants, 21)


def _skip_graph_output(fmt: int) -> onnx.ModelProto:
    """skip_layer_norm_gen.py's *_graph_output models: the sum before the residual Add (format 3: the residual sum)
    is also a graph output."""
    model = _skip(fmt, False)
    extra = "ln_in" if fmt == 3 else "a3"
    model.graph.output.append(helper.make_tensor_value_info(extra, F32, SHAPE))
    return model


def _skip_with_cast(fmt: int, variant: str) -> onnx.ModelProto:
    """The *_with_cast SkipLayerNorm models (ORT keeps 3 Casts after fusing formats 1/2, 2 for format 3): fp16 A,
    B (and bias) each cast to fp32, the residual pattern and LayerNorm in fp32. `variant`: "" | "partial" (the
    bias sum, or format 3's residual sum, also read by a Neg) | "graph_output" (that sum also a graph output)."""
    model = _skip(fmt, variant == "partial")
    graph = model.graph
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in ("A", "B", "bias"):
                node.input[i] = name + "32"
    casts = [_node("Cast", [n], [n + "32"], to=F32) for n in ("A", "B")]
    if fmt != 3:
        bias = next(t for t in graph.initializer if t.name == "bias")
        bias.CopyFrom(_t("bias", numpy_helper.to_array(bias), np.float16))
        casts.append(_node("Cast", ["bias"], ["bias32"], to=F32))
    graph.node.extend(casts)
    for value in graph.input:
        value.type.tensor_type.elem_type = F16
    if variant == "graph_output":
        graph.output.append(helper.make_tensor_value_info("ln_in" if fmt == 3 else "a3", F32, SHAPE))
    return model


def _skip_fp16_sum_cast(fmt: int, variant: str) -> onnx.ModelProto:
    """The *_with_cast SkipLayerNorm models with the Cast after the residual sum: fp16 A, B (and bias) added in fp16,
    the sum cast to fp32 and normalised in fp32, fp32 out (ORT also keeps 3 Casts for formats 1/2, 2 for format 3,
    moving them in front of its fused op). Every format is fused as the Skip op on the fp16 addends with
    output_type float32 (a bias Add in front stays): on the CPU it runs in float32 between ONNX Runtime's Casts,
    reading the addends unrounded as the original's Add does. `variant` as for _skip_with_cast (the other sums
    stay fp16)."""
    model = _skip(fmt, variant == "partial")
    graph = model.graph
    for node in graph.node:
        if node.op_type != "Add" or node.output[0] != "ln_in":
            for i, name in enumerate(node.input):
                if name == "ln_in":
                    node.input[i] = "ln_in32"
    graph.node.append(_node("Cast", ["ln_in"], ["ln_in32"], to=F32))
    if fmt != 3:
        bias = next(t for t in graph.initializer if t.name == "bias")
        bias.CopyFrom(_t("bias", numpy_helper.to_array(bias), np.float16))
    for value in graph.input:
        value.type.tensor_type.elem_type = F16
    if variant == "graph_output":
        graph.output.append(helper.make_tensor_value_info("ln_in" if fmt == 3 else "a3", F16, SHAPE))
    return model


def _add_then_native_layer_norm(*, beta: bool, with_cast: bool, gamma_shape=(H,)) -> onnx.ModelProto:
    """SkipLayerNormFusion_NoBeta / CurrentOpset / 3DGamma: a residual Add in front of a native LayerNormalization
    (opset 17), with or without beta, fp16 inputs cast to fp32 first, gamma of another rank."""
    a, b = ("A32", "B32") if with_cast else ("A", "B")
    nodes = [
        _node("Add", [a, b], ["s"]),
        _node("LayerNormalization", ["s", "gamma", *(["beta"] if beta else [])], ["C"], axis=-1),
    ]
    if with_cast:
        nodes = [_node("Cast", ["A"], ["A32"], to=F32), _node("Cast", ["B"], ["B32"], to=F32), *nodes]
    constants = [_t("gamma", np.reshape([1.0, 2.0, 3.0, 4.0], gamma_shape))]
    if beta:
        constants.append(_t("beta", np.reshape([0.1, 0.2, 0.3, 0.4], gamma_shape)))
    x_type = F16 if with_cast else F32
    return _graph_model(nodes, [("A", x_type, SHAPE), ("B", x_type, SHAPE)], [("C", F32, SHAPE)], constants, 17)


POSITIVE = {
    "layer_norm": (
        lambda: _model(_layer_norm_nodes("x", two_subs=False, gamma_first=False), ["x"], _ln_constants()),
        {"LayerNorm": 1},
    ),
    "layer_norm_two_subs_gamma_first": (
        lambda: _model(
            _layer_norm_nodes("x", two_subs=True, gamma_first=True), ["x"], _ln_constants(), typed_output=True
        ),
        {"LayerNorm": 1},
    ),
    "skip_format1": (lambda: _skip(1, False), {"SkipLayerNorm": 1}),
    "skip_format2": (lambda: _skip(2, False), {"SkipLayerNorm": 1}),
    "skip_format3": (lambda: _skip(3, False), {"SkipLayerNorm": 1}),
    "skip_format1_partial": (lambda: _skip(1, True), None),
    "skip_format2_partial": (lambda: _skip(2, True), None),
    "skip_format3_sum_also_used": (lambda: _skip(3, True), None),
    "simplified_div": (lambda: _simplified(False), {"RMSNorm": 1}),
    "simplified_reciprocal": (lambda: _simplified(True), {"RMSNorm": 1}),
    "layer_norm_fp16_casts": (lambda: _fp16_with_casts(False), {"LayerNorm": 1}),
    "skip_layer_norm_fp16_casts": (lambda: _fp16_with_casts(True), {"SkipLayerNorm": 1}),
    # The cases below were added after the first 12 (issue 21): one per ORT generator script or C++ builder.
    "layer_norm_shared_input": (_shared_input, {"LayerNorm": 2}),
    "layer_norm_with_cast_2": (_with_cast_2, {"LayerNorm": 1}),
    "layer_norm_with_cast_3": (_with_cast_3, {"LayerNorm": 1}),
    "layer_norm_scale_bias_identity": (_scale_bias_identity, {"LayerNorm": 1}),
    "simplified_layer_norm_with_casts": (_t5_with_casts, {"RMSNorm": 1}),
    "layer_norm_with_cast_5_opset18": (lambda: _build_layer_norm([-1], [-1], 18), {"LayerNorm": 1}),
    "layer_norm_with_cast_5_opset14": (lambda: _build_layer_norm([-1], [-1], 14), {"LayerNorm": 1}),
    "layer_norm_epsilon_first": (
        lambda: _build_layer_norm([-1], [-1], 14, eps_first=True, eps=1e-4),
        {"LayerNorm": 1},
    ),
    # Two normalised axes, listed in another order (ORT fuses them only in its training build).
    "layer_norm_with_cast_7_opset18": (lambda: _build_layer_norm([-2, -1], [-1, -2], 18), {"LayerNorm": 1}),
    "layer_norm_with_cast_7_opset14": (lambda: _build_layer_norm([-2, -1], [-1, -2], 14), {"LayerNorm": 1}),
    "layer_norm_with_cast_9_opset18": (lambda: _build_layer_norm([2, -1], [-1, -2], 18), {"LayerNorm": 1}),
    "layer_norm_with_cast_9_opset14": (lambda: _build_layer_norm([2, -1], [-1, -2], 14), {"LayerNorm": 1}),
    "layer_norm_current_opset": (_current_opset_layer_norm, {"LayerNorm": 1}),
    # ORT's negative LayerNormWithCastFusionTest_6: the mean over dim -2, the variance over dim -1. Not a LayerNorm,
    # but an RMSNorm over dim -1 of the centred value x - mean_-2(x), which it computes exactly (scale ones).
    "with_cast_6_rms_of_the_centred_value": (lambda: _build_layer_norm([-2], [-1], 14), {"RMSNorm": 1}),
    "with_cast_6_rms_of_the_centred_value_opset18": (lambda: _build_layer_norm([-2], [-1], 18), {"RMSNorm": 1}),
    "simplified_shared_cast_exponent": (lambda: _rms_shared_cast_exponent(False), {"RMSNorm": 2}),
    "simplified_shared_cast_exponent_leading_cast": (lambda: _rms_shared_cast_exponent(True), {"RMSNorm": 2}),
    "simplified_epsilon_first": (lambda: _rms_single(np.float32(2.0), eps_first=True), {"RMSNorm": 1}),
    "simplified_int8_exponent": (lambda: _rms_single(np.int8(2)), {"RMSNorm": 1}),
    "simplified_uint8_exponent": (lambda: _rms_single(np.uint8(2)), {"RMSNorm": 1}),
    "simplified_int32_exponent": (lambda: _rms_single(np.int32(2)), {"RMSNorm": 1}),
    "simplified_int64_exponent": (lambda: _rms_single(np.int64(2)), {"RMSNorm": 1}),
    "simplified_fp16_shared_exponent": (_rms_fp16_shared_exponent, {"RMSNorm": 2}),
    "skip_format1_graph_output": (lambda: _skip_graph_output(1), None),
    "skip_format2_graph_output": (lambda: _skip_graph_output(2), None),
    "skip_format3_graph_output": (lambda: _skip_graph_output(3), None),
    "skip_format1_with_cast": (lambda: _skip_with_cast(1, ""), {"SkipLayerNorm": 1}),
    "skip_format2_with_cast": (lambda: _skip_with_cast(2, ""), {"SkipLayerNorm": 1}),
    "skip_format3_with_cast": (lambda: _skip_with_cast(3, ""), {"SkipLayerNorm": 1}),
    "skip_format1_partial_with_cast": (lambda: _skip_with_cast(1, "partial"), None),
    "skip_format2_partial_with_cast": (lambda: _skip_with_cast(2, "partial"), None),
    "skip_format3_sum_also_used_with_cast": (lambda: _skip_with_cast(3, "partial"), None),
    "skip_format1_graph_output_with_cast": (lambda: _skip_with_cast(1, "graph_output"), None),
    "skip_format2_graph_output_with_cast": (lambda: _skip_with_cast(2, "graph_output"), None),
    "skip_format3_graph_output_with_cast": (lambda: _skip_with_cast(3, "graph_output"), None),
    # One Skip op on the fp16 addends with output_type float32 (a bias Add in front stays; docs/ops.md).
    "skip_format1_fp16_sum_cast": (lambda: _skip_fp16_sum_cast(1, ""), {"SkipLayerNorm": 1}),
    "skip_format2_fp16_sum_cast": (lambda: _skip_fp16_sum_cast(2, ""), {"SkipLayerNorm": 1}),
    "skip_format3_fp16_sum_cast": (lambda: _skip_fp16_sum_cast(3, ""), {"SkipLayerNorm": 1}),
    "skip_format1_partial_fp16_sum_cast": (lambda: _skip_fp16_sum_cast(1, "partial"), None),
    "skip_format2_partial_fp16_sum_cast": (lambda: _skip_fp16_sum_cast(2, "partial"), None),
    "skip_format3_sum_also_used_fp16_sum_cast": (lambda: _skip_fp16_sum_cast(3, "partial"), None),
    "skip_format1_graph_output_fp16_sum_cast": (lambda: _skip_fp16_sum_cast(1, "graph_output"), None),
    "skip_format2_graph_output_fp16_sum_cast": (lambda: _skip_fp16_sum_cast(2, "graph_output"), None),
    "skip_format3_graph_output_fp16_sum_cast": (lambda: _skip_fp16_sum_cast(3, "graph_output"), None),
    "skip_native_no_beta": (lambda: _add_then_native_layer_norm(beta=False, with_cast=False), {"SkipLayerNorm": 1}),
    "skip_native_no_beta_with_cast": (
        lambda: _add_then_native_layer_norm(beta=False, with_cast=True),
        {"SkipLayerNorm": 1},
    ),
    "skip_native_current_opset": (
        lambda: _add_then_native_layer_norm(beta=True, with_cast=False),
        {"SkipLayerNorm": 1},
    ),
    "skip_native_3d_gamma": (
        lambda: _add_then_native_layer_norm(beta=True, with_cast=False, gamma_shape=(1, 1, H)),
        None,
    ),
}


# ONNX Runtime has no CPU Pow kernel for an int8/uint8 exponent, so it cannot run those originals (its own test
# only runs the graph transformer): their optimized models are checked against the same graph with an int32 one.
PARITY_WITH = {
    "simplified_int8_exponent": lambda: _rms_single(np.int32(2)),
    "simplified_uint8_exponent": lambda: _rms_single(np.int32(2)),
}


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Random inputs of each input's own shape (SHAPE where it has none)."""
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = (rng.standard_normal(dims or SHAPE) * 2 + 0.5).astype(dtype)
    return feeds


def _norm_ops(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.domain == "onnx_norm":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("case", list(POSITIVE))
def test_onnx_runtime_positive_case_is_fused_with_parity(case: str):
    build, expected = POSITIVE[case]
    model = build()
    optimized, report = onnx_norm.optimize(model, take_over_native=case.startswith("skip_native"))
    fused = _norm_ops(optimized)
    norms = sum(expected.values()) if expected else 1
    assert sum(fused.values()) == norms, (fused, [m.reason for m in report.near_misses])
    if expected is not None:
        assert fused == expected
    runnable = PARITY_WITH[case]() if case in PARITY_WITH else model
    parity = onnx_norm.verify(runnable, optimized, inputs=[_feeds(model)])
    assert parity.passed, [o.message for o in parity.outputs]


@pytest.mark.parametrize("build", [_fp16_skip_to_fp32])
def test_onnx_runtime_mixed_precision_skip_case(build):
    model = build()
    optimized, report = onnx_norm.optimize(model)
    assert sum(_norm_ops(optimized).values()) == 1, [m.reason for m in report.near_misses]
    assert onnx_norm.verify(model, optimized, inputs=[_feeds(model)]).passed


def _negative(kind: str) -> onnx.ModelProto:
    nodes = _layer_norm_nodes("x", two_subs=False, gamma_first=False)
    constants = _ln_constants()
    if kind == "cube":  # Pow(d, 3): not a variance
        constants[0] = _t("two", 3.0)
    elif kind == "variance_over_another_axis":
        nodes[5] = helper.make_node("ReduceMean", ["pow"], ["var"], axes=[1], keepdims=1)
    elif kind == "mean_of_another_tensor":
        nodes[7] = helper.make_node("Sub", ["x", "mean_y"], ["sb2"])
        nodes.append(helper.make_node("ReduceMean", ["y"], ["mean_y"], axes=[-1], keepdims=1))
        return _model(nodes, ["x", "y"], constants)
    return _model(nodes, ["x"], constants)


@pytest.mark.parametrize("kind", ["cube", "variance_over_another_axis", "mean_of_another_tensor"])
def test_onnx_runtime_negative_case_is_left_exactly_as_it_was(kind: str):
    import onnxruntime as ort

    model = _negative(kind)
    optimized, _ = onnx_norm.optimize(model)
    assert _norm_ops(optimized) == {}
    feeds = _feeds(model)

    def run(m: onnx.ModelProto) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

    for before, after in zip(run(model), run(optimized), strict=True):
        np.testing.assert_array_equal(after, before)


def _double_norm(rms: bool) -> onnx.ModelProto:
    """LayerNormFusionsRejectLossyDoubleEpsilon: float64 norms with epsilon 1e-50 (0 in float32)."""
    d = TensorProto.DOUBLE
    if rms:
        nodes = _rms_nodes("x", "y", "")
        constants = [_t("two", 2.0, np.float64), _t("eps", 1e-50, np.float64), _t("scale", [1, 1, 1, 1], np.float64)]
    else:
        nodes = [
            _node("ReduceMean", ["x"], ["m"], axes=[-1]),
            _node("Sub", ["x", "m"], ["d"]),
            _node("Pow", ["d", "two"], ["sq"]),
            _node("ReduceMean", ["sq"], ["v"], axes=[-1]),
            _node("Add", ["v", "eps"], ["ve"]),
            _node("Sqrt", ["ve"], ["s"]),
            _node("Div", ["d", "s"], ["n"]),
            _node("Mul", ["n", "scale"], ["g"]),
            _node("Add", ["g", "bias"], ["y"]),
        ]
        constants = [
            _t("two", 2.0, np.float64),
            _t("eps", 1e-50, np.float64),
            _t("scale", [1, 1, 1, 1], np.float64),
            _t("bias", [0, 0, 0, 0], np.float64),
        ]
    return _graph_model(nodes, [("x", d, [2, 4])], [("y", d, [2, 4])], constants, 14)


def _fp16_pow_edge() -> onnx.ModelProto:
    """gen_simplified_layer_norm_fp16_pow_edge.py: the "epsilon" and the scale are graph inputs of shape [1, 4, 1],
    one value per row: neither a constant epsilon nor a scale over the normalised dim."""
    nodes = [
        _node("Cast", ["exponent"], ["exponent16"], to=F16),
        _node("Pow", ["x", "exponent16"], ["sq"]),
        _node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        _node("Add", ["ms", "bias"], ["ve"]),
        _node("Sqrt", ["ve"], ["s"]),
        _node("Div", ["x", "s"], ["n"]),
        _node("Mul", ["n", "scale"], ["y"]),
    ]
    inputs = [("x", F16, [1, 4, 8]), ("bias", F16, [1, 4, 1]), ("scale", F16, [1, 4, 1])]
    return _graph_model(nodes, inputs, [("y", F16, [1, 4, 8])], [_t("exponent", [2.0])], 12)


# ONNX Runtime's negative cases from its generators and graph_transform_test_layernorm.cc (the first three above
# are ours); the feeds for [1, 4, 1] inputs keep the per-row epsilon positive (squared normal values).
MORE_NEGATIVE = {
    "double_layer_norm_tiny_epsilon": lambda: _double_norm(False),
    "double_rms_norm_tiny_epsilon": lambda: _double_norm(True),
    "rms_exponent_three": lambda: _rms_single(np.float32(3.0)),
    "rms_cast_exponent_three": lambda: _rms_single(np.float32(3.0), cast_exponent=True),
    "rms_fp16_per_row_epsilon_and_scale": _fp16_pow_edge,
}


@pytest.mark.parametrize("kind", list(MORE_NEGATIVE))
def test_more_onnx_runtime_negative_cases_are_left_exactly_as_they_were(kind: str):
    import onnxruntime as ort

    model = MORE_NEGATIVE[kind]()
    optimized, _ = onnx_norm.optimize(model)
    assert _norm_ops(optimized) == {}
    feeds = {k: np.abs(v) if v.shape == (1, 4, 1) else v for k, v in _feeds(model).items()}

    def run(m: onnx.ModelProto) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

    for before, after in zip(run(model), run(optimized), strict=True):
        np.testing.assert_array_equal(after, before)


#: ONNX Runtime's negative cases that are no LayerNorm (the mean over three axes, the variance over two) but are an
#: RMSNorm of the centred value over the last two: its gamma of ones and beta of zeros, shaped [3, 3, 3], are the
#: same in every row group, so they are one row of ones and zeros (nothing to scale or shift).
CENTRED_RMS = {
    "with_cast_8_three_axes_against_two": lambda: _build_layer_norm([-3, -2, -1], [-1, -2], 14),
    "with_cast_8_opset18": lambda: _build_layer_norm([-3, -2, -1], [-1, -2], 18),
}


@pytest.mark.parametrize("kind", list(CENTRED_RMS))
def test_a_variance_over_fewer_axes_than_the_mean_is_an_rms_norm_of_the_centred_value(kind: str):
    import onnxruntime as ort

    model = CENTRED_RMS[kind]()
    optimized, _ = onnx_norm.optimize(model)
    (fused,) = [n for n in optimized.graph.node if n.domain]
    assert fused.op_type == "RMSNorm" and list(fused.input) == ["d"]  # no Scale: gamma is ones
    assert [n.op_type for n in optimized.graph.node] == ["ReduceMean", "Sub", "RMSNorm"]
    feeds = _feeds(model)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(
        optimized.SerializeToString(), onnx_norm.session_options(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    np.testing.assert_array_equal(got[0], want[0])


_ORT_NORM_OPS = {"LayerNormalization", "SimplifiedLayerNormalization"}
_ORT_NORM_OPS |= {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}


@pytest.mark.parametrize("case", [name for name in POSITIVE if "fp16" in name or "cast" in name])
def test_mixed_precision_cases_with_the_ort_target(case: str):
    """ONNX Runtime's own ops as the target: each norm fused, and never less accurate than the original on its
    CPU provider (a narrow residual sum is widened in front of an op computing in float32, as the graph did)."""
    build, expected = POSITIVE[case]
    model = build()
    optimized, report = onnx_norm.optimize(model, target="ort")
    fused = [n.op_type for n in optimized.graph.node if n.op_type in _ORT_NORM_OPS]
    assert len(fused) == (sum(expected.values()) if expected else 1), [m.reason for m in report.near_misses]
    runnable = PARITY_WITH[case]() if case in PARITY_WITH else model
    parity = onnx_norm.verify(runnable, optimized, inputs=[_feeds(model)])
    assert parity.passed, [o.message for o in parity.outputs]
