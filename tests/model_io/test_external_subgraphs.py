"""External data outside the main graph's initializers (issue 20): an initializer of an If branch written to the data
file. Sessions of a modified model (weights handed over, a header in a temporary directory) must still find it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx_norm
from onnx_norm import model_io, sessions, weights
from onnx_norm.cli import main
from onnx_norm.sessions import RuntimeConfig


def _if_model(path: Path) -> dict[str, np.ndarray]:
    """x @ W, then + B_then or - B_else by `cond`; W and both branch initializers in m.onnx.data."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    b_then, b_else = (rng.standard_normal(64).astype(np.float32) for _ in range(2))

    def branch(name: str, op: str, bias: np.ndarray) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node(op, ["h", f"b_{name}"], [f"y_{name}"])],
            name,
            [],
            [helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [2, 64])],
            [onnx.numpy_helper.from_array(bias, f"b_{name}")],
        )

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node(
                "If",
                ["cond"],
                ["y"],
                then_branch=branch("then", "Add", b_then),
                else_branch=branch("else", "Sub", b_else),
            ),
        ],
        "if_model",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, path, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    return {"then": x @ w + b_then, "else": x @ w - b_else, "x": x, "xw": x @ w}


def test_branch_initializers_are_external(tmp_path: Path) -> None:
    _if_model(tmp_path / "m.onnx")
    header = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    assert len(model_io.external_tensors(header)) == 3  # w and both branches' biases


def test_a_session_of_the_proto_reads_the_branch_initializers(tmp_path: Path) -> None:
    """A modified model's session (main-graph weights handed over as OrtValues, the branch initializers read by ORT
    through the header's links) computes both branches from the data file."""
    expected = _if_model(tmp_path / "m.onnx")
    proto = model_io.load_proto(tmp_path / "m.onnx", resolve_external=True)
    assert all(Path(weights.reference(t).file).is_absolute() for t in model_io.external_tensors(proto))
    session = sessions.create_session(proto, RuntimeConfig("cpu", 1))
    for branch, cond in (("then", True), ("else", False)):
        result = sessions.run_model(session, {"x": expected["x"], "cond": np.array(cond)})
        np.testing.assert_allclose(result["y"], expected[branch], rtol=1e-5, atol=1e-5)


def test_verify_and_bench_of_a_model_with_external_branch_initializers(tmp_path: Path) -> None:
    """The CLI on such a model: verify against itself per node (a modified proto), bench optimized in memory."""
    _if_model(tmp_path / "m.onnx")
    source = str(tmp_path / "m.onnx")
    assert main(["verify", source, source, "--per-node"]) == 0
    assert main(["bench", source, "--repeat", "2", "--warmup", "0"]) == 0
    model, _ = onnx_norm.optimize(source)
    assert onnx_norm.verify(source, model).passed


def test_only_tensors_outside_the_main_initializers_go_inline(tmp_path: Path, monkeypatch) -> None:
    """The header holds inline only the tensors ORT reads itself: with no room for any, a session of a proto whose
    external tensors are all main-graph initializers is still made, and one with branch initializers is refused
    with a message naming why."""
    expected = _if_model(tmp_path / "m.onnx")
    proto = model_io.load_proto(tmp_path / "m.onnx", resolve_external=True)
    monkeypatch.setattr(weights, "_INLINE_LIMIT", 0)
    with pytest.raises(sessions.SessionError, match="subgraphs or functions"):
        sessions.create_session(proto, RuntimeConfig("cpu", 1))
    for branch in proto.graph.node[1].attribute:  # the branch biases inline: nothing left to write inline
        name = branch.g.initializer[0].name
        branch.g.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.zeros(64, np.float32), name))
    session = sessions.create_session(proto, RuntimeConfig("cpu", 1))
    result = sessions.run_model(session, {"x": expected["x"], "cond": np.array(True)})
    np.testing.assert_allclose(result["y"], expected["xw"], rtol=1e-5, atol=1e-5)
