"""Small models the tests of several folders build (a LayerNorm as exporters write it, bf16)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 16


def layer_norm_model(input_name: str = "x", *, opset: int = 17) -> onnx.ModelProto:
    """The opset-13 export of nn.LayerNorm(16): the smallest model optimize fuses."""
    rng = np.random.default_rng(0)

    def const(name: str, value) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    nodes = [
        helper.make_node("ReduceMean", [input_name], ["mean"], axes=[-1], name="mean"),
        helper.make_node("Sub", [input_name, "mean"], ["centred"], name="sub"),
        helper.make_node("Pow", ["centred", "two"], ["sq"], name="pow"),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], name="var"),
        helper.make_node("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        helper.make_node("Sqrt", ["var_eps"], ["std"], name="sqrt"),
        helper.make_node("Div", ["centred", "std"], ["normed"], name="div"),
        helper.make_node("Mul", ["normed", "gamma"], ["scaled"], name="scale"),
        helper.make_node("Add", ["scaled", "beta"], ["y"], name="shift"),
    ]
    weights = [
        const("two", 2.0),
        const("eps", 1e-5),
        const("gamma", 1 + 0.1 * rng.standard_normal(HIDDEN)),
        const("beta", 0.1 * rng.standard_normal(HIDDEN)),
    ]
    graph = helper.make_graph(
        nodes,
        "layer_norm",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under root with a hash of its bytes: nothing written, nothing changed."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        for path in sorted(root.rglob("*"))
    }


def _bf16(name: str, values: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(values.astype(ml_dtypes.bfloat16), name)


def bf16_layer_norm(*, native: bool = False, gamma_scale: float = 1.0) -> onnx.ModelProto:
    """A bf16 LayerNorm as exporters write it (fp32 statistics between Casts), or a native LayerNormalization."""
    rng = np.random.default_rng(2)
    gamma = _bf16("gamma", gamma_scale * (1 + 0.1 * rng.standard_normal(HIDDEN)))
    beta = _bf16("beta", 0.1 * rng.standard_normal(HIDDEN))
    if native:
        nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], epsilon=1e-5, name="ln")]
        weights = [gamma, beta]
    else:
        nodes = [
            helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
            helper.make_node("ReduceMean", ["xf"], ["mean"], axes=[-1]),
            helper.make_node("Sub", ["xf", "mean"], ["centred"]),
            helper.make_node("Pow", ["centred", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
            helper.make_node("Add", ["var", "eps"], ["var_eps"]),
            helper.make_node("Sqrt", ["var_eps"], ["std"]),
            helper.make_node("Div", ["centred", "std"], ["normed"]),
            helper.make_node("Cast", ["normed"], ["normed16"], to=TensorProto.BFLOAT16),
            helper.make_node("Mul", ["normed16", "gamma"], ["scaled"]),
            helper.make_node("Add", ["scaled", "beta"], ["y"]),
        ]
        constants = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("two", 2.0), ("eps", 1e-5))]
        weights = [gamma, beta, *constants]
    graph = helper.make_graph(
        nodes,
        "ln_bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["batch", "sequence", HIDDEN])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
