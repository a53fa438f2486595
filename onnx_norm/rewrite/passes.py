"""The fusions as an onnx-ir pass, for pipelines (Olive, onnxscript's optimizer) and for `optimize()`.

FuseNormsPass is a sequence of small in-place onnx-ir passes, each in its own module with its own PassResult:
shape inference (shape_pass.py: InferShapesPass), the fusions (fuse_pass.py: FuseDecomposedPass), the take-over of
native norms (take_over_pass.py: TakeOverNativePass), the shapes put back (RestoreShapesPass), onnx-ir's clean-up
passes, and the model-local functions (functions_pass.py: AttachFunctionsPass); this module runs them in order and
writes the report."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from onnx_norm.rewrite.functions_pass import AttachFunctionsPass
from onnx_norm.rewrite.fuse_pass import FuseDecomposedPass
from onnx_norm.rewrite.report import OptimizeReport, op_counts
from onnx_norm.rewrite.rules import enabled_rules
from onnx_norm.rewrite.session import Session
from onnx_norm.rewrite.shape_pass import InferShapesPass, RestoreShapesPass, Shapes
from onnx_norm.rewrite.shape_pass import infer_shapes as _infer_shapes  # noqa: F401 (tests/test_rewrite_robust.py)
from onnx_norm.rewrite.shape_pass import infer_symbolic_shapes as _infer_symbolic_shapes
from onnx_norm.rewrite.take_over_pass import TakeOverNativePass

__all__ = ["FuseNormsPass", "Shapes"]

logger = logging.getLogger(__name__)


class FuseNormsPass(ir.passes.InPlacePass):
    """Replaces decomposed LayerNorm/RMSNorm subgraphs with fused ops, in place.

    Runs shape inference first (ranks and static normalised dims are needed to prove a match), then the driver
    (driver.py) over the main graph, If/Loop/Scan bodies and model-local functions, then removes what became
    unused and (for targets whose ops need them) attaches the model-local functions that keep the model runnable
    without our library; each step is an onnx-ir pass of its own (the module docstring).
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
        self.rules = enabled_rules(disable)
        self.take_over_native = take_over_native
        self.infer_shapes = infer_shapes
        self.report = OptimizeReport(target=target)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        target = self.session.target
        report = OptimizeReport(target=target, ops_before=op_counts(model))
        progress = _Progress()
        order = _initializer_order(model)
        # The symbolic inference is read from this module at each run: where tests (and callers) replace it.
        shapes = InferShapesPass(native_norms=self.take_over_native, symbolic=_infer_symbolic_shapes)
        if self.infer_shapes:
            progress.step(f"inferring shapes ({sum(report.ops_before.values())} nodes)")
            shapes(model)
        progress.step("matching and proving norms")
        fuse = FuseDecomposedPass(self.session, self.rules)
        fuse(model)
        take_over = TakeOverNativePass(target)
        if self.take_over_native:
            take_over(model)
        RestoreShapesPass(shapes.stored)(model)
        modified = bool(fuse.count) or take_over.converted
        if modified:
            progress.step(f"removing what the {fuse.count} fused norm(s) replaced")
            clean_up = [common_passes.RemoveUnusedNodesPass(), common_passes.RemoveUnusedOpsetsPass()]
            ir.passes.Sequential(*clean_up, AttachFunctionsPass(target))(model)
        _restore_initializer_order(order)
        self.report = _report(report, self.session, take_over.records, model)
        progress.step("done")
        if fuse.count:
            logger.info("fused %d norm(s): %s", fuse.count, self.report.rule_counts)
        return ir.passes.PassResult(model, modified)


def _report(report: OptimizeReport, session: Session, taken_over: list[Any], model: ir.Model) -> OptimizeReport:
    """The run's report: the fused norms, the near-misses left open, the native norms taken over, the op counts."""
    report.norms = list(session.records)
    report.near_misses = session.open_near_misses()
    counts: dict[str, int] = {}
    for record in report.norms:
        counts[record.rule] = counts.get(record.rule, 0) + 1
    report.rule_counts = counts
    report.native_taken_over = [_as_dict(r) for r in taken_over]
    report.ops_after = op_counts(model)
    return report


def _initializer_order(model: ir.Model) -> dict[ir.Graph, list[str]]:
    return {graph: list(graph.initializers) for graph in model.graphs()}


def _restore_initializer_order(order: dict[ir.Graph, list[str]]) -> None:
    """Puts the initializers that were there before back in their order, new ones after them in theirs.

    Shape inference moves the large initializers to the end (it runs without them). That alone made ONNX
    Runtime 1.31 refuse, above its basic level, a model it had optimised itself and loaded before ("Attempt to
    replace the existing tensor"): its MatMulAddFusion names the shape initializers it adds with the node-name
    generator (`gemm_input_shape_token_N`), which does not look at initializer names, so on a model where that
    fusion ran before it can mint a name an initializer holds; whether it does depends on the initializer order
    (disabling that one fusion makes the reordered model load). Writing the order we read keeps what ORT did with
    the input."""
    for graph, names in order.items():
        rank = {name: index for index, name in enumerate(names)}
        current = list(graph.initializers)
        wanted = sorted(current, key=lambda name: (name not in rank, rank.get(name, 0)))
        if wanted == current:
            continue
        values = [graph.initializers.pop(name) for name in wanted]
        for value in values:
            graph.register_initializer(value)


class _Progress:
    """INFO lines at each stage of a run, with the time the previous stage took (long runs say what they do)."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()

    def step(self, what: str) -> None:
        now = time.perf_counter()
        logger.info("%s (previous step %.1f s, %.1f s in all)", what, now - self.last, now - self.start)
        self.last = now


def _as_dict(record: Any) -> dict:
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return dataclasses.asdict(record)
    return dict(record) if isinstance(record, dict) else {"record": str(record)}
