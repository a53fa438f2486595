"""Channels-last GroupNorm (onnx_norm/rewrite/families/group_norm.py): tf2onnx's spelling of Keras'
`layers.GroupNormalization` and jax2onnx's of flax's `nnx.GroupNorm` over [N, H, W, C], from fixtures made by
tools/group_norm_nhwc_fixtures.py (CI has no tensorflow or jax). Fused into our NCHW op between two Transposes, with
its swish/SiLU, the numbers ONNX Runtime's."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from repo_paths import DATA
from rewrite_support import run

import onnx_norm
from onnx_norm.rewrite import optimize

FIXTURES = DATA / "group_norm"
_MANIFEST = json.loads((FIXTURES / "manifest-channels-last.json").read_text())
_IDS = [e["file"].removesuffix(".onnx") for e in _MANIFEST]


def _with_library(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = onnx_norm.session_options()
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _feeds(model: onnx.ModelProto, shape: list[int]) -> dict[str, np.ndarray]:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 2 + 0.5
    return {model.graph.input[0].name: x}


@pytest.mark.parametrize("entry", _MANIFEST, ids=_IDS)
def test_channels_last_exports_fuse_with_parity(entry: dict) -> None:
    """Every spelling (G = 1 and 1 < G < C, with and without swish, static and dynamic batch) becomes one GroupNorm
    of the fixture's group count, its swish fused as SiLU; nothing of the decomposition is left."""
    model = onnx.load(str(FIXTURES / entry["file"]))
    optimized, report = optimize(model)
    nodes = [n for n in optimized.graph.node if n.op_type == "GroupNorm"]
    assert len(nodes) == entry["group_norms"], report
    attrs = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attrs["num_groups"] == entry["groups"]
    assert attrs.get("activation", 0) == int(entry["silu"])
    left = {n.op_type for n in optimized.graph.node}
    assert not {"ReduceMean", "Sigmoid", "Reshape"} & left
    assert sorted(n.op_type for n in optimized.graph.node if n.op_type == "Transpose") == ["Transpose"] * 2
    for batch in (entry["shape"][0], 1) if not entry["static_batch"] else (entry["shape"][0],):
        feeds = _feeds(model, [batch, *entry["shape"][1:]])
        np.testing.assert_allclose(_with_library(optimized, feeds), run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_keras_group_normalization_onnx_target_writes_instance_normalization() -> None:
    """`--target onnx` on the channels-last match: Reshape, InstanceNormalization, Reshape and the affine between
    the Transposes, at the exported opset 17 (no GroupNormalization-21, no opset raise), the numbers ONNX Runtime's
    on the original."""
    entry = next(e for e in _MANIFEST if e["silu"] and e["groups"] > 1)
    model = onnx.load(str(FIXTURES / entry["file"]))
    optimized, report = optimize(model, target="onnx")
    ops = [n.op_type for n in optimized.graph.node]
    assert ops.count("InstanceNormalization") == 1 and "GroupNormalization" not in ops, report
    assert "ReduceMean" not in ops and ops.count("Transpose") == 2
    feeds = _feeds(model, entry["shape"])
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-4)
    assert onnx_norm.verify(model, optimized, inputs=[feeds]).passed


def test_a_region_read_from_outside_is_not_fused() -> None:
    """The grouped mean is also a graph output: fusing would drop it, so the channels-last match declines."""
    entry = next(e for e in _MANIFEST if not e["silu"] and e["static_batch"])
    model = onnx.load(str(FIXTURES / entry["file"]))
    mean = next(n.output[0] for n in model.graph.node if n.op_type == "ReduceMean")
    model.graph.output.append(helper.make_tensor_value_info(mean, onnx.TensorProto.FLOAT, None))
    optimized, _ = optimize(model)
    assert "GroupNorm" not in {n.op_type for n in optimized.graph.node}
    feeds = _feeds(model, entry["shape"])
    np.testing.assert_allclose(_with_library(optimized, feeds), run(model, feeds)[0], rtol=1e-4, atol=1e-4)


_FP16_MANIFEST = json.loads((FIXTURES / "manifest-channels-last-fp16.json").read_text())


def _fused_no_less_accurate(model: onnx.ModelProto, shape: list[int], **tolerance: float) -> onnx.ModelProto:
    """`model` optimized: its one GroupNorm within fp16's tolerance of the original under ONNX Runtime, and no farther
    from the float64 evaluation than the original, in max and in mean, up to float32 noise (1%; verify's rule allows
    an fp16 ulp of margin, 1.95e-3 here, above every max error; rounding where the graph rounds was 1.4-2.5x farther
    in mean and passed it). Returns the optimized model."""
    optimized, report = optimize(model)
    assert [n.op_type for n in optimized.graph.node].count("GroupNorm") == 1, report.near_misses
    assert not {"ReduceMean", "Reshape"} & {n.op_type for n in optimized.graph.node}
    parity = onnx_norm.verify(model, optimized, shapes={model.graph.input[0].name: shape}, **tolerance)
    golden = parity.outputs[0].golden
    assert parity.passed and golden is not None, [o.message for o in parity.outputs]
    assert golden.optimized_mean_abs <= 1.01 * golden.original_mean_abs, golden
    assert golden.optimized_max_abs <= 1.01 * golden.original_max_abs, golden
    return optimized


@pytest.mark.parametrize("keep_io_types", [True, False], ids=["fp32-io", "fp16-io"])
@pytest.mark.parametrize("entry", _MANIFEST, ids=_IDS)
def test_exports_converted_to_float16_fuse_no_less_accurate(entry: dict, keep_io_types: bool) -> None:
    """The exports converted to float16 after export as users do (onnxconverter-common's float16 converter, with
    float32 inputs and outputs kept or not): one GroupNorm, which rounds once (at its output, or not at all where the
    converted graph's float16 result is Cast back to float32: the op then reads X widened and writes float32), with
    the converter's second Cast of X (a dynamic batch's Reshape back reads X's Shape through it) taken as X."""
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16(onnx.load(str(FIXTURES / entry["file"])), keep_io_types=keep_io_types)
    # fp32 outputs computed in fp16 inside get fp16's tolerance, as tests/rewrite/test_exporter_fixtures.py gives them
    tolerance = {"atol": 1e-2, "rtol": 1e-2} if keep_io_types else {}
    optimized = _fused_no_less_accurate(model, entry["shape"], **tolerance)
    (node,) = [n for n in optimized.graph.node if n.op_type == "GroupNorm"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["num_groups"], attrs["activation"]) == (entry["groups"], int(entry["silu"]))
    # float32 outputs: the op reads X widened to float32 and writes float32 (the library types Y like X)
    producers = {o: n for n in optimized.graph.node for o in n.output}
    widen = producers.get(node.input[0])
    to = [helper.get_attribute_value(a) for a in widen.attribute if a.name == "to"] if widen is not None else []
    assert (widen is not None and widen.op_type == "Cast" and to == [onnx.TensorProto.FLOAT]) == keep_io_types
    assert attrs["output_type"] == 0


@pytest.mark.parametrize("entry", _FP16_MANIFEST, ids=[e["file"].removesuffix(".onnx") for e in _FP16_MANIFEST])
def test_keras_mixed_float16_exports_fuse_no_less_accurate(entry: dict) -> None:
    """Keras' mixed_float16 policy: the GroupNormalization computes in float32, its output is Cast to float16 and
    the swish computes in float16; fused with that swish, which the op computes in float32 before one Cast to
    float16 (float16 outputs, fp16's tolerance)."""
    optimized = _fused_no_less_accurate(onnx.load(str(FIXTURES / entry["file"])), entry["shape"])
    (node,) = [n for n in optimized.graph.node if n.op_type == "GroupNorm"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["num_groups"], attrs["activation"]) == (entry["groups"], int(entry["silu"]))
    assert not {"Sigmoid", "Mul"} & {n.op_type for n in optimized.graph.node}
    casts = [n for n in optimized.graph.node if n.op_type == "Cast"]
    assert [helper.get_attribute_value(c.attribute[0]) for c in casts] == [onnx.TensorProto.FLOAT16]
    assert entry["policy"] == "mixed_float16" and optimized.graph.output[0].type.tensor_type.elem_type == 10
