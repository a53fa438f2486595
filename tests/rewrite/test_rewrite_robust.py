"""A valid model never makes `optimize` fail: Mamba as the TorchScript exporter writes it (the Casts of its input
that the residual also reads), a match that cannot be applied (skipped and reported, the rest still fused), and
proofs that are never reused for another candidate."""

from __future__ import annotations

import dataclasses
import io
import logging
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper
from rewrite_support import FLOAT, assert_fused, const, fused_ops, make_model, random_feeds, run

from onnx_norm.ops.schema import NormAttributes
from onnx_norm.rewrite import driver, match, optimize, session
from onnx_norm.rewrite.passes import _infer_shapes

D = 16
W = (np.random.default_rng(3).random(D) + 0.5).astype(np.float32)


def rms_nodes(x: str, y: str, p: str) -> list[onnx.NodeProto]:
    """TorchScript's `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`, then `weight * h.to(dtype)`."""
    return [
        helper.make_node("Pow", [x, "two"], [f"{p}sq"]),
        helper.make_node("ReduceMean", [f"{p}sq"], [f"{p}ms"], axes=[-1]),
        helper.make_node("Add", [f"{p}ms", "eps"], [f"{p}ve"]),
        helper.make_node("Sqrt", [f"{p}ve"], [f"{p}s"]),
        helper.make_node("Div", ["one", f"{p}s"], [f"{p}r"]),
        helper.make_node("Mul", [x, f"{p}r"], [f"{p}n"]),
        helper.make_node("Cast", [f"{p}n"], [f"{p}nc"], to=FLOAT),
        helper.make_node("Mul", ["w", f"{p}nc"], [y]),
    ]


def mamba_block() -> onnx.ModelProto:
    """`hidden.to(float32)` twice before the norm (block and norm each cast), the residual reading the second."""
    nodes = [
        helper.make_node("Cast", ["x"], ["c1"], to=FLOAT),
        helper.make_node("Cast", ["c1"], ["c2"], to=FLOAT),
        *rms_nodes("c2", "n1", "a_"),
        helper.make_node("Cast", ["c2"], ["residual"], to=FLOAT),
        helper.make_node("Add", ["residual", "n1"], ["h"]),
        *rms_nodes("h", "y", "b_"),
    ]
    inits = [const("two", 2.0, np.float32), const("one", 1.0, np.float32), const("eps", 1e-5, np.float32)]
    inits.append(const("w", W))
    return make_model(nodes, [("x", FLOAT, ["b", "s", D])], [("y", FLOAT, None)], inits, opset=17)


def test_input_casts_read_by_the_residual_stay():
    optimized, report = assert_fused(mamba_block(), {"x": [2, 3, D]}, ["RMSNorm", "SkipRMSNorm"])
    assert report.near_misses == []
    ops = [n.op_type for n in optimized.graph.node]
    assert ops.count("Cast") >= 1  # the residual's Casts stay where they were read


@pytest.mark.parametrize("opset", [13, 17])
def test_mamba_torchscript_export(opset):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers", reason="Mamba is built from transformers' config")
    torch.manual_seed(0)
    config = transformers.MambaConfig(
        vocab_size=64, hidden_size=32, state_size=4, num_hidden_layers=2, expand=2, time_step_rank=4, use_cache=False
    )
    mamba = transformers.MambaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mamba = mamba

        def forward(self, ids):
            return self.mamba(ids, use_cache=False, return_dict=False)[0]

    ids = torch.randint(0, 64, (1, 6))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits(), (ids,), buffer, opset_version=opset, dynamo=False, input_names=["ids"])
    model = onnx.load_from_string(buffer.getvalue())
    optimized, report = optimize(model)
    onnx.checker.check_model(optimized)
    assert sorted(fused_ops(optimized)) == ["RMSNorm", "SkipRMSNorm", "SkipRMSNorm"], report.near_misses
    feeds = {"ids": ids.numpy()}
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def _two_norms() -> onnx.ModelProto:
    nodes = [*rms_nodes("x", "n1", "a_"), helper.make_node("Relu", ["n1"], ["h"]), *rms_nodes("h", "y", "b_")]
    inits = [const("two", 2.0, np.float32), const("one", 1.0, np.float32), const("eps", 1e-5, np.float32)]
    inits.append(const("w", W))
    return make_model(nodes, [("x", FLOAT, ["b", "s", D])], [("y", FLOAT, None)], inits)


def _check_one_skipped(model: onnx.ModelProto, optimized: onnx.ModelProto, report, reason: str) -> None:
    onnx.checker.check_model(optimized)
    assert fused_ops(optimized) == ["RMSNorm"]
    assert any(reason in m.reason for m in report.near_misses), report.near_misses
    feeds = random_feeds(model, {"x": [2, 3, D]})
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_match_that_would_leave_a_dangling_reader_is_skipped(monkeypatch):
    """A matcher mistake (a node read from outside the match claimed as replaced) must not break the graph."""
    model = _two_norms()
    real = driver.find_norm

    def too_greedy(anchor, **kwargs):
        candidate = real(anchor, **kwargs)
        if candidate is not None and candidate.spec.x.name == "h":
            relu = candidate.spec.x.producer()
            candidate = dataclasses.replace(candidate, nodes=[*candidate.nodes, relu])
        return candidate

    monkeypatch.setattr(driver, "find_norm", too_greedy)
    optimized, report = optimize(model)
    _check_one_skipped(model, optimized, report, "not applied: 'h' is also read by")


def test_an_error_while_rewriting_is_a_near_miss(monkeypatch):
    model = _two_norms()
    real = driver.targets.emit
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("emitter bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(driver.targets, "emit", failing_once)
    optimized, report = optimize(model)
    _check_one_skipped(model, optimized, report, "not applied (RuntimeError: emitter bug)")


def test_a_proof_is_not_reused_for_another_candidate():
    """The cache must key a proof by what the candidate is: the same object changed to an unsound candidate (the
    identity a freed candidate's successor may get) is proven again."""
    graph = ir.serde.deserialize_model(_two_norms())
    _infer_shapes(graph)
    anchor = next(n for n in graph.graph if n.outputs[0].name == "n1")
    candidate = match.find_norm(anchor)
    assert candidate is not None
    run = session.Session()
    assert run.proven(candidate) is None
    wrong = dataclasses.replace(candidate.spec.attrs, epsilon=0.5)
    assert isinstance(wrong, NormAttributes)
    candidate.spec = dataclasses.replace(candidate.spec, attrs=wrong)
    reason = run.proven(candidate)
    assert reason is not None and "proof failed" in reason


def test_long_runs_say_what_they_do(monkeypatch, caplog):
    """Stages and (every PROGRESS_SECONDS while matching) how far matching got, at INFO."""
    monkeypatch.setattr(session, "PROGRESS_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="onnx_norm"):
        optimize(_two_norms())
    messages = [r.getMessage() for r in caplog.records]
    for stage in ("inferring shapes", "matching and proving norms", "removing what the 2 fused norm(s) replaced"):
        assert any(m.startswith(stage) for m in messages), messages
    assert any(m.startswith("matching: ") and "norm(s) fused" in m for m in messages), messages


def test_inline_save_writes_large_tensors_one_at_a_time(tmp_path, monkeypatch):
    """The streamed file reads back as the same model as onnx-ir's own serialisation."""
    from onnx_norm import model_io

    model = mamba_block()
    big = np.random.default_rng(0).standard_normal((64, D)).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(big, "big"))
    monkeypatch.setattr(model_io, "STREAMED_TENSOR_BYTES", 64)  # "w" (64 bytes) and "big" are streamed
    ir_model = model_io.load(model)
    model_io.save(ir_model, tmp_path / "streamed.onnx", external_data=False)
    streamed = onnx.load(tmp_path / "streamed.onnx")
    expected = ir.serde.serialize_model(ir_model)
    onnx.checker.check_model(streamed)
    assert {t.name: t for t in streamed.graph.initializer} == {t.name: t for t in expected.graph.initializer}
    assert list(streamed.graph.node) == list(expected.graph.node)
    assert ir_model.graph.initializers["big"].const_value is not None  # the model itself is left as it was
    feeds = random_feeds(model, {"x": [2, 3, D]})
    np.testing.assert_array_equal(run(streamed, feeds)[0], run(model, feeds)[0])


def test_a_slice_with_computed_bounds_keeps_the_dims_it_does_not_slice():
    """onnx's inference gives a Slice whose end is known only at run time its rank only; the dims off its constant
    `axes` are the input's (a batch dim lost there made every residual Add after it one that might broadcast)."""
    from onnx import TensorProto, numpy_helper

    from onnx_norm.rewrite.shape_pass import infer_shapes

    inits = [numpy_helper.from_array(np.array([0], np.int64), "start")]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "start", "end", "axes"], ["y"])],
        "slice",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 6]),
            helper.make_tensor_value_info("end", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    infer_shapes(model)
    dims = list(model.graph.outputs[0].shape)
    assert dims[0] == 1 and dims[2] == 6 and not isinstance(dims[1], int), dims
