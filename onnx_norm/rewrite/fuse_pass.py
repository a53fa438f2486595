"""The fusion step of FuseNormsPass as an onnx-ir pass (in place): the driver (driver.py) rewrites every norm the
enabled rules match and prove, in the main graph, If/Loop/Scan bodies and model-local functions; then the silent-miss
check (silent.py) turns any norm-like subgraph left without a reason into a near-miss."""

from __future__ import annotations

import onnx_ir as ir

from onnx_norm.rewrite import constants, driver, silent
from onnx_norm.rewrite.run_state import RunState


class FuseDecomposedPass(ir.passes.InPlacePass):
    """Fuses decomposed norms in place with the run's rules, recording each in its session (records and
    near-misses) and the count in `state.fused`; the result is modified exactly when it fused one."""

    def __init__(self, state: RunState) -> None:
        super().__init__()
        self.state = state

    @property
    def count(self) -> int:
        return self.state.fused

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        session = self.state.session
        with constants.folding():
            self.state.fused = driver.fuse(model, session, self.state.rules)
        if not session.disabled:  # with rules disabled, unfused norms are expected, not misses
            for node, graph, miss in silent.silent_misses(model, session.open_near_miss_nodes()):
                session.near_miss(node, graph, miss)
        return ir.passes.PassResult(model, modified=bool(self.state.fused))
