"""The family registry is the whole interface of a norm family: a composite family registered from a test module
(a LayerNorm followed by a per-sample modulation, the shape of adaLN) is matched, proven against its reference,
emitted by its lowering, reported, and left to the built-in LayerNorm on a target that cannot express it."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper
from rewrite_support import FLOAT, const, layer_nodes, make_model, random_feeds, run

from onnx_norm.ops.schema import DOMAIN, LAYER_NORM, OPSET_VERSION
from onnx_norm.rewrite import constants, family, match, optimize
from onnx_norm.rewrite.families import layer_norm
from onnx_norm.rewrite.family import FusionRule, Lowering, NormFamily

D = 16
KIND = "test_modulated"


def modulated_model() -> onnx.ModelProto:
    """`LN(x) * (1 + scale) + shift` with scale and shift per sample ([b, 1, D]), LN without affine."""
    nodes = [
        *layer_nodes(y="n"),
        helper.make_node("Add", ["one", "scale"], ["gate"]),
        helper.make_node("Mul", ["n", "gate"], ["p"]),
        helper.make_node("Add", ["p", "shift"], ["y"]),
    ]
    inputs = [("x", FLOAT, ["b", "s", D]), ("scale", FLOAT, ["b", 1, D]), ("shift", FLOAT, ["b", 1, D])]
    inits = [const("eps", 1e-5, np.float32), const("one", 1.0, np.float32)]
    return make_model(nodes, inputs, [("y", FLOAT, ["b", "s", D])], inits)


def _find(anchor):
    """The final Add of `norm(x) * (1 + scale) + shift`; the inner norm is the built-in LayerNorm recogniser's."""
    product, shift = anchor.inputs
    mul = product.producer()
    if mul is None or mul.op_type != "Mul" or shift is None:
        return None
    normalised, gate = mul.inputs
    plus = gate.producer()
    if plus is None or plus.op_type != "Add" or constants.scalar(plus.inputs[0]) != 1.0:
        return None
    inner = match.find_norm(normalised.producer(), kinds=frozenset({layer_norm.KIND}), channels_first=False)
    if inner is None or inner.spec.scale is not None or inner.spec.bias is not None:
        return None
    extra = {"scale": plus.inputs[1], "shift": shift}
    spec = dataclasses.replace(inner.spec, kind=KIND, y=anchor.outputs[0], extra_inputs=extra)
    return dataclasses.replace(inner, spec=spec, nodes=[*inner.nodes, plus, mul, anchor])


def _reference(x, params, attrs):
    y, inv, mean = layer_norm.reference(x, {"scale": None, "bias": None}, attrs)
    return y * (1 + params["scale"]) + params["shift"], inv, mean


def _emit(op, spec, opset):
    """Our LayerNorm, then the modulation as it was (a stand-in for a fused op)."""
    attrs = dataclasses.asdict(spec.attrs)
    normalised = op.op(LAYER_NORM.name, spec.x, _domain=DOMAIN, _version=OPSET_VERSION, **attrs)
    one = op.Constant(value=ir.tensor(np.array(1.0, np.float32)))
    return [op.Add(op.Mul(normalised, op.Add(one, spec.extra_inputs["scale"])), spec.extra_inputs["shift"])]


@pytest.fixture
def modulated(monkeypatch):
    family.families()  # the built-in families first, as in a run
    # The built-in statistic families only: the real modulated-norm family (families/modulated_norm.py) would match
    # this model before the stand-in does.
    registry = {kind: f for kind, f in family._REGISTRY.items() if f.statistic is not None}
    monkeypatch.setattr(family, "_REGISTRY", registry)
    family.register(
        NormFamily(
            kind=KIND,
            summary="LayerNorm then modulate",
            rules=(FusionRule("test_modulated_norm", KIND),),
            reference=_reference,
            lowerings={"onnx-norm": Lowering(emit=_emit), "onnx": "no modulated norm in ONNX"},
            find=_find,
            anchor_ops=frozenset({"Add"}),
            sweep=-1,
        )
    )
    return registry[KIND]


def test_a_registered_family_is_matched_proven_and_emitted(modulated):
    model = modulated_model()
    optimized, report = optimize(model)
    assert report.rule_counts == {"test_modulated_norm": 1}, report.near_misses
    assert [n.op_type for n in optimized.graph.node if n.domain == DOMAIN] == ["LayerNorm"]
    assert report.norms[0].kind == KIND
    feeds = random_feeds(model, {"x": [2, 3, D], "scale": [2, 1, D], "shift": [2, 1, D]})
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_target_without_the_family_fuses_the_inner_norm(modulated):
    optimized, report = optimize(modulated_model(), target="onnx")
    assert report.rule_counts == {"layer_norm": 1}
    assert any("no modulated norm in ONNX" in m.reason for m in report.near_misses), report.near_misses
    assert "LayerNormalization" in [n.op_type for n in optimized.graph.node]


def test_the_proof_uses_the_family_reference(modulated, monkeypatch):
    """A reference that disagrees with the graph (no `1 +`) makes the match a near-miss, not a rewrite."""
    wrong = dataclasses.replace(modulated, reference=lambda x, p, a: _reference(x, p | {"scale": p["scale"] - 1}, a))
    monkeypatch.setitem(family._REGISTRY, KIND, wrong)
    _, report = optimize(modulated_model())
    assert "test_modulated_norm" not in report.rule_counts
    assert any("proof failed" in m.reason for m in report.near_misses), report.near_misses


def test_a_family_needs_exactly_one_recogniser():
    base = family.get(layer_norm.KIND)
    with pytest.raises(ValueError, match="exactly one of statistic and find"):
        family.register(dataclasses.replace(base, kind="both", rules=(), find=_find, anchor_ops=frozenset({"Add"})))
    with pytest.raises(ValueError, match="taken"):
        family.register(dataclasses.replace(base, kind="again"))
