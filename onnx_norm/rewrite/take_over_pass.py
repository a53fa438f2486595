"""The take-over step of FuseNormsPass (`--take-over-native`) as an onnx-ir pass (in place): native norm ops moved
onto the target's ops (native.py), without attaching functions (AttachFunctionsPass does that once, after)."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from onnx_norm.rewrite import native


class TakeOverNativePass(ir.passes.InPlacePass):
    """Replaces native norm ops with `target`'s ops in place; `self.records` has one record per native norm node
    (converted or why not), and the result is modified exactly when one was converted."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.records: list[dict[str, Any]] = []

    @property
    def converted(self) -> bool:
        return any(record.get("converted") for record in self.records)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.records = list(native.take_over(model, self.target, attach_functions=False))
        return ir.passes.PassResult(model, modified=self.converted)
