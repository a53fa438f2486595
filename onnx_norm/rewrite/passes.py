"""The fusions as an onnx-ir pass, for pipelines (Olive, onnxscript's optimizer) and for `optimize()`.

FuseNormsPass is a sequence of small in-place onnx-ir passes, each in its own module with its own PassResult:
the opset raised when asked (opset_pass.py: RaiseOpsetPass), shape inference (shape_pass.py: InferShapesPass),
the fusions (fuse_pass.py: FuseDecomposedPass), the take-over of native norms (take_over_pass.py:
TakeOverNativePass), the shapes put back (RestoreShapesPass), onnx-ir's clean-up passes, and the model-local
functions (functions_pass.py: AttachFunctionsPass); this module runs them in order and writes the report."""

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
from onnx_norm.rewrite.opset_pass import RaiseOpsetPass
from onnx_norm.rewrite.report import OptimizeReport, op_counts
from onnx_norm.rewrite.rules import enabled_rules
from onnx_norm.rewrite.run_state import RunState
from onnx_norm.rewrite.session import Session
from onnx_norm.rewrite.shape_pass import InferShapesPass, RestoreShapesPass, Shapes
from onnx_norm.rewrite.shape_pass import infer_shapes as _infer_shapes  # noqa: F401

# (tests/rewrite/test_rewrite_robust.py)
from onnx_norm.rewrite.shape_pass import infer_symbolic_shapes as _infer_symbolic_shapes
from onnx_norm.rewrite.take_over_pass import TakeOverNativePass

__all__ = ["FuseNormsPass", "Shapes"]

logger = logging.getLogger(__name__)


class FuseNormsPass(ir.passes.InPlacePass):
    """Replaces decomposed LayerNorm/RMSNorm subgraphs with fused ops, in place.

    Runs shape inference first (ranks and static normalised dims are needed to prove a match), then the driver
    (driver.py) over the main graph, If/Loop/Scan bodies and model-local functions, then removes what became
    unused and (for targets whose ops need them) attaches the model-local functions that keep the model runnable
    without our library; each step is an onnx-ir pass of its own (the module docstring), all of them sharing one
    `RunState` made afresh by each call. `self.report` describes the last run. With `opset`, the model's
    default-domain opset is first raised to it (RaiseOpsetPass: onnx's version converter; never lowered).
    """

    def __init__(
        self,
        target: str = "onnx-norm",
        *,
        disable: Iterable[str] = (),
        take_over_native: bool = False,
        verify_rewrites: bool = True,
        infer_shapes: bool = True,
        opset: int | None = None,
    ) -> None:
        super().__init__()
        Session(target, verify_rewrites=verify_rewrites, disabled=disable)  # a bad target fails here, not at run
        self.raise_opset = None if opset is None else RaiseOpsetPass(opset)  # a bad opset fails here too
        self.target = target
        self.disable = tuple(disable)
        self.verify_rewrites = verify_rewrites
        self.rules = enabled_rules(self.disable)
        self.take_over_native = take_over_native
        self.infer_shapes = infer_shapes
        self.report = OptimizeReport(target=target)

    def new_state(self) -> RunState:
        """The state of one run: nothing of an earlier run carries over (a pass reused on a second model)."""
        session = Session(self.target, verify_rewrites=self.verify_rewrites, disabled=self.disable)
        return RunState(session, list(self.rules))

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        state = self.new_state()
        report = OptimizeReport(target=self.target, ops_before=op_counts(model))
        progress = _Progress()
        if self.raise_opset is not None:
            progress.step(f"raising the default opset to {self.raise_opset.opset}")
            self.raise_opset(model)
            report.opset_raised = _raised(self.raise_opset.raised)
        order = _initializer_order(model)
        for label, step in self._steps(state, sum(report.ops_before.values())):
            progress.step(label)
            step(model)
        if state.modified:
            progress.step(f"removing what the {state.fused} fused norm(s) replaced")
            clean_up = [common_passes.RemoveUnusedNodesPass(), common_passes.RemoveUnusedOpsetsPass()]
            ir.passes.Sequential(*clean_up, AttachFunctionsPass(self.target))(model)
        _restore_initializer_order(order)
        self.report = _report(report, state, model)
        progress.step("done")
        if state.fused:
            logger.info("fused %d norm(s): %s", state.fused, self.report.rule_counts)
        return ir.passes.PassResult(model, state.modified or report.opset_raised is not None)

    def _steps(self, state: RunState, nodes: int) -> list[tuple[str, ir.passes.PassBase]]:
        """Shape inference (when on), the fusions, the take-over (when on), the shapes put back, in order, each with
        the progress line said before it runs."""
        # The symbolic inference is read from this module at each run: where tests (and callers) replace it.
        shapes = InferShapesPass(state, native_norms=self.take_over_native, symbolic=_infer_symbolic_shapes)
        steps: list[tuple[str, ir.passes.PassBase]] = []
        if self.infer_shapes:
            steps.append((f"inferring shapes ({nodes} nodes)", shapes))
        steps.append(("matching and proving norms", FuseDecomposedPass(state)))
        if self.take_over_native:
            steps.append(("taking over native norms", TakeOverNativePass(state)))
        return [*steps, ("restoring the recorded shapes", RestoreShapesPass(state))]


def _report(report: OptimizeReport, state: RunState, model: ir.Model) -> OptimizeReport:
    """The run's report: the fused norms, the near-misses left open, the native norms taken over, the op counts."""
    report.norms = list(state.session.records)
    report.near_misses = state.session.open_near_misses()
    counts: dict[str, int] = {}
    for record in report.norms:
        counts[record.rule] = counts.get(record.rule, 0) + 1
    report.rule_counts = counts
    report.native_taken_over = [_as_dict(r) for r in state.taken_over]
    report.ops_after = op_counts(model)
    return report


def _raised(raised: tuple[int, int] | None) -> dict[str, int] | None:
    return None if raised is None else {"from": raised[0], "to": raised[1]}


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
