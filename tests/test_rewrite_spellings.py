"""Spellings that only some exporters write, each written out as an ONNX graph in the exporter's form: fused into
the right op with the original's numbers.

- `Identity` nodes between the residual `Add` and the norm (paddle2onnx's PP-OCR recognisers): Identity moves data,
  so the Skip fold looks through the chain, the sum staying an output wherever the Add or an Identity is read again.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import helper
from test_rewrite_support import FLOAT, assert_fused, const, fused_ops, layer_nodes, make_model

D = 16
rng = np.random.default_rng(7)
W = (rng.random(D) + 0.5).astype(np.float32)
B = rng.standard_normal(D).astype(np.float32)
ADDENDS = [("a", FLOAT, ["b", "s", D]), ("r", FLOAT, ["b", "s", D])]
ADDEND_SHAPES = {"a": [2, 3, D], "r": [2, 3, D]}


def _residual_through_identities(reader: str | None, identities: int = 2) -> onnx.ModelProto:
    """`h = a + r`, `Identity` `identities` times, a LayerNorm with scale and bias; `reader` (h, an Identity's
    output, or None) is read again after the norm, as the residual stream of a pre-norm block is."""
    names = ["h"] + [f"i{k}" for k in range(1, identities + 1)]
    nodes = [helper.make_node("Add", ["a", "r"], ["h"])]
    nodes += [helper.make_node("Identity", [src], [dst]) for src, dst in itertools.pairwise(names)]
    nodes += layer_nodes(names[-1], "y", scale="w", bias="bias")
    outputs = [("y", FLOAT, None)]
    if reader is not None:
        nodes.append(helper.make_node("Add", [reader, "y"], ["z"]))
        outputs = [("z", FLOAT, None)]
    inits = [const("eps", 1e-5, np.float32), const("w", W), const("bias", B)]
    return make_model(nodes, ADDENDS, outputs, inits)


@pytest.mark.parametrize("reader", [None, "h", "i1", "i2"])
def test_identities_between_the_residual_add_and_the_norm(reader):
    model = _residual_through_identities(reader)
    optimized, report = assert_fused(model, ADDEND_SHAPES, ["SkipLayerNorm"])
    assert report.norms[0].rule == "skip_layer_norm"
    assert report.norms[0].residual_sum_kept == (reader is not None)
    ops = [n.op_type for n in optimized.graph.node]
    assert "LayerNorm" not in fused_ops(optimized) and ops.count("Add") == (reader is not None)
    # The Identities stay only where something reads them, re-made from the fused op's Sum output.
    assert ops.count("Identity") == {None: 0, "h": 0, "i1": 1, "i2": 2}[reader], ops


def test_a_single_identity_before_a_plain_norm_is_read_through():
    """No residual Add: the norm reads the Identity's input, and the Identity is gone."""
    nodes = [helper.make_node("Identity", ["x"], ["i"]), *layer_nodes("i", "y", scale="w", bias="bias")]
    inits = [const("eps", 1e-5, np.float32), const("w", W), const("bias", B)]
    model = make_model(nodes, [("x", FLOAT, ["b", "s", D])], [("y", FLOAT, None)], inits)
    optimized, _ = assert_fused(model, {"x": [2, 3, D]}, ["LayerNorm"])
    assert [n.op_type for n in optimized.graph.node] == ["LayerNorm"]
