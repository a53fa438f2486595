"""The fusions as an onnx-ir pass, for pipelines (Olive, onnxscript's optimizer) and for `optimize()`."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from onnx_norm.rewrite.report import OptimizeReport, op_counts
from onnx_norm.rewrite.rules import Session, make_rules

logger = logging.getLogger(__name__)


class FuseNormsPass(ir.passes.InPlacePass):
    """Replaces decomposed LayerNorm/RMSNorm subgraphs with fused ops, in place.

    Runs shape inference first (ranks and static normalised dims are needed to prove a match), then the rules of
    `rules.py` over the main graph, If/Loop bodies and model-local functions, then (target `onnx-norm`) attaches
    the model-local functions that keep the model runnable without our library, and removes what became unused.
    `self.report` describes the last run.
    """

    def __init__(
        self,
        target: str = "onnx-norm",
        *,
        disable: Iterable[str] = (),
        take_over_native: bool = False,
        verify_rewrites: bool = True,
        infer_shapes: bool = True,
    ) -> None:
        super().__init__()
        self.session = Session(target, verify_rewrites=verify_rewrites, disabled=disable)
        self.rules = make_rules(self.session)
        self.take_over_native = take_over_native
        self.infer_shapes = infer_shapes
        self.report = OptimizeReport(target=target)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from onnxscript.rewriter import pattern

        session = self.session
        report = OptimizeReport(target=session.target, ops_before=op_counts(model))
        if self.infer_shapes:
            _infer_shapes(model)
        count = pattern.RewriteRuleSet(self.rules).apply_to_model(model) if self.rules else 0
        taken_over: list = []
        if self.take_over_native:
            from onnx_norm.rewrite import native

            taken_over = list(native.take_over(model, session.target))
        modified = bool(count or taken_over)
        if modified:
            common_passes.RemoveUnusedNodesPass()(model)
            common_passes.RemoveUnusedOpsetsPass()(model)
            if session.target == "onnx-norm":
                from onnx_norm.ops.functions import attach_functions

                attach_functions(model)
        report.norms = list(session.records)
        report.near_misses = list(session.near_misses.values())
        counts: dict[str, int] = {}
        for record in report.norms:
            counts[record.rule] = counts.get(record.rule, 0) + 1
        report.rule_counts = counts
        report.native_taken_over = [_as_dict(r) for r in taken_over]
        report.ops_after = op_counts(model)
        self.report = report
        if count:
            logger.info("fused %d norm(s): %s", count, counts)
        return ir.passes.PassResult(model, modified)


def _as_dict(record) -> dict:
    import dataclasses

    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return dataclasses.asdict(record)
    return dict(record) if isinstance(record, dict) else {"record": str(record)}


def _infer_shapes(model: ir.Model) -> None:
    """onnx shape inference on a copy without large initializers; on failure keep the shapes the model has."""
    try:
        common_passes.ShapeInferencePass(strict_mode=False)(model)
    except Exception as err:  # shape inference is best effort: unknown shapes make candidates near-misses
        logger.warning("shape inference failed, continuing with the shapes stored in the model: %s", err)
