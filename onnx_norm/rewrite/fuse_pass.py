"""The fusion step of FuseNormsPass as an onnx-ir pass (in place): the driver (driver.py) rewrites every norm the
enabled rules match and prove, in the main graph, If/Loop/Scan bodies and model-local functions; then the silent-miss
check (silent.py) turns any norm-like subgraph left without a reason into a near-miss."""

from __future__ import annotations

import onnx_ir as ir

from onnx_norm.rewrite import constants, driver, silent
from onnx_norm.rewrite.family import FusionRule
from onnx_norm.rewrite.session import Session


class FuseDecomposedPass(ir.passes.InPlacePass):
    """Fuses decomposed norms in place, recording each in `session` (its records and near-misses); `self.count` is
    how many the last run fused, and the result is modified exactly when it fused one."""

    def __init__(self, session: Session, rules: list[FusionRule]) -> None:
        super().__init__()
        self.session = session
        self.rules = rules
        self.count = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        with constants.folding():
            self.count = driver.fuse(model, self.session, self.rules)
        if not self.session.disabled:  # with rules disabled, unfused norms are expected, not misses
            for node, graph, miss in silent.silent_misses(model, self.session.open_near_miss_nodes()):
                self.session.near_miss(node, graph, miss)
        return ir.passes.PassResult(model, modified=bool(self.count))
