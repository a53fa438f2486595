"""FuseNormsPass's steps (onnx_norm/rewrite/*_pass.py): each an in-place onnx-ir pass with its own PassResult, whose
`modified` says whether it changed what the model computes; run in order they do what FuseNormsPass does."""

from __future__ import annotations

import onnx_ir as ir
import pytest
from model_builders import bf16_layer_norm, layer_norm_model

from onnx_norm.rewrite import match, match_affine, match_outside, match_state
from onnx_norm.rewrite.functions_pass import AttachFunctionsPass
from onnx_norm.rewrite.fuse_pass import FuseDecomposedPass
from onnx_norm.rewrite.passes import FuseNormsPass
from onnx_norm.rewrite.rules import enabled_rules
from onnx_norm.rewrite.run_state import RunState
from onnx_norm.rewrite.session import Session
from onnx_norm.rewrite.shape_pass import InferShapesPass, RestoreShapesPass
from onnx_norm.rewrite.take_over_pass import TakeOverNativePass

STEPS = [
    InferShapesPass(),
    RestoreShapesPass(RunState.for_target()),
    FuseDecomposedPass(RunState.for_target()),
    TakeOverNativePass(RunState.for_target()),
    AttachFunctionsPass("onnx-norm"),
]


def _state(target: str = "onnx-norm") -> RunState:
    return RunState(Session(target), enabled_rules(()))


@pytest.mark.parametrize("step", STEPS, ids=lambda step: type(step).__name__)
def test_every_step_declares_the_in_place_contract(step):
    assert isinstance(step, ir.passes.InPlacePass)
    assert step.in_place and step.changes_input


def _ops(model: ir.Model) -> list[str]:
    return [f"{node.domain}::{node.op_type}" for node in model.graph]


def test_the_steps_in_order_fuse_a_norm_and_say_when_they_changed_the_model():
    model = ir.serde.deserialize_model(layer_norm_model())
    assert not InferShapesPass()(model).modified  # shapes for the matchers, not a change of the computation
    assert model.graph.node("div").outputs[0].shape is not None
    fuse = FuseDecomposedPass(_state())
    assert fuse(model).modified and fuse.count == 1
    assert not TakeOverNativePass(_state())(model).modified  # no native norm to take over
    assert AttachFunctionsPass("onnx-norm")(model).modified
    assert [f.name for f in model.functions.values()] == ["LayerNorm"]
    assert "onnx_norm::LayerNorm" in _ops(model)
    again = FuseDecomposedPass(_state())
    assert not again(model).modified and again.count == 0  # nothing left to fuse


def test_a_target_without_functions_attaches_none():
    model = ir.serde.deserialize_model(layer_norm_model())
    FuseDecomposedPass(_state("onnx"))(model)
    assert not AttachFunctionsPass("onnx")(model).modified
    assert not model.functions and "::LayerNormalization" in _ops(model)


def test_the_take_over_step_records_each_native_norm():
    model = ir.serde.deserialize_model(bf16_layer_norm(native=True))
    step = TakeOverNativePass(_state())
    assert step(model).modified and step.converted
    assert [(r["from"], r["converted"]) for r in step.records] == [("ai.onnx::LayerNormalization", True)]
    assert (
        TakeOverNativePass(_state("onnx"))(ir.serde.deserialize_model(bf16_layer_norm(native=True))).modified is False
    )


def test_fuse_norms_pass_reports_what_its_steps_did():
    model = ir.serde.deserialize_model(bf16_layer_norm(native=True))
    fuse = FuseNormsPass(take_over_native=True)
    assert fuse(model).modified
    assert fuse.report.fused == 0 and fuse.report.native_taken_over[0]["converted"]
    untouched = ir.serde.deserialize_model(bf16_layer_norm(native=True))
    assert not FuseNormsPass()(untouched).modified  # shape inference alone is no modification


def test_one_pass_object_reused_on_two_models_reports_each_alone():
    """Pipelines make a pass once and run it on many models: each run's report is that model's only."""
    fuse = FuseNormsPass()
    first = ir.serde.deserialize_model(layer_norm_model())
    assert fuse(first).modified and fuse.report.fused == 1
    second = ir.serde.deserialize_model(layer_norm_model())
    assert fuse(second).modified
    assert fuse.report.fused == 1 and [r.rule for r in fuse.report.norms] == list(fuse.report.rule_counts)
    already = fuse(first)  # nothing left to fuse: no record of the earlier runs
    assert not already.modified and fuse.report.fused == 0 and fuse.report.norms == []


def test_the_matcher_steps_are_importable_from_match():
    """Families import the matcher's names from `match`; the split into steps keeps them there."""
    assert match.runtime_rows is match_affine.runtime_rows and match.AffineInputs is match_affine.AffineInputs
    assert match.Replaced is match_outside.Replaced and match.Layout is match_state.Layout
