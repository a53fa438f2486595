"""The take-over step of FuseNormsPass (`--take-over-native`) as an onnx-ir pass (in place): native norm ops moved
onto the target's ops (native.py), without attaching functions (AttachFunctionsPass does that once, after)."""

from __future__ import annotations

import onnx_ir as ir

from onnx_norm.rewrite import native
from onnx_norm.rewrite.run_state import RunState


class TakeOverNativePass(ir.passes.InPlacePass):
    """Replaces native norm ops with the run's target's ops in place; `state.taken_over` gets one record per native
    norm node (converted or why not), and the result is modified exactly when one was converted."""

    def __init__(self, state: RunState) -> None:
        super().__init__()
        self.state = state

    @property
    def records(self) -> list[dict]:
        return self.state.taken_over

    @property
    def converted(self) -> bool:
        return self.state.converted

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.state.taken_over = list(native.take_over(model, self.state.target, attach_functions=False))
        return ir.passes.PassResult(model, modified=self.state.converted)
