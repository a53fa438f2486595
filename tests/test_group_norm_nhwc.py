"""Channels-last GroupNorm (onnx_norm/rewrite/families/group_norm.py): tf2onnx's spelling of Keras'
`layers.GroupNormalization` and jax2onnx's of flax's `nnx.GroupNorm` over [N, H, W, C], from fixtures made by
tools/group_norm_nhwc_fixtures.py (CI has no tensorflow or jax). Fused into our NCHW op between two Transposes, with
its swish/SiLU, the numbers ONNX Runtime's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, version_converter
from test_rewrite_support import run

import onnx_norm
from onnx_norm.rewrite import optimize

FIXTURES = Path(__file__).resolve().parent / "data" / "group_norm"
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


def test_keras_group_normalization_onnx_target_writes_group_normalization_21() -> None:
    """`--target onnx` on the channels-last match: GroupNormalization-21 between the Transposes (the model
    upgraded to opset 21 first; at the exported 17 the target says why it does not fuse)."""
    entry = next(e for e in _MANIFEST if e["silu"] and e["groups"] > 1)
    model = onnx.load(str(FIXTURES / entry["file"]))
    skipped, _ = optimize(model, target="onnx")
    assert "GroupNormalization" not in {n.op_type for n in skipped.graph.node}
    model = version_converter.convert_version(model, 21)
    optimized, report = optimize(model, target="onnx")
    assert [n.op_type for n in optimized.graph.node].count("GroupNormalization") == 1, report
    feeds = _feeds(model, entry["shape"])
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-4)


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
