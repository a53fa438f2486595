"""The last step of FuseNormsPass as an onnx-ir pass (in place): the model-local ONNX functions of our ops
(ops/functions.py), for the targets whose ops need them, so that the model still runs where the library is not
installed."""

from __future__ import annotations

import onnx_ir as ir

from onnx_norm.rewrite import targets


class AttachFunctionsPass(ir.passes.InPlacePass):
    """Attaches (rebuilds) a function for every `onnx_norm` node signature, in place, when `target`'s ops need them;
    a target whose ops are standard or ONNX Runtime's leaves the model as it is (modified=False)."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not targets.get(self.target).attaches_functions:
            return ir.passes.PassResult(model, modified=False)
        from onnx_norm.ops.functions import attach_functions

        before = {key: id(function) for key, function in model.functions.items()}
        attach_functions(model)
        after = {key: id(function) for key, function in model.functions.items()}
        return ir.passes.PassResult(model, modified=before != after)
