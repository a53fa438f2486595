"""The node builder handed to emitters: `op.Add(a, b)`, `op.op("LayerNorm", x, _domain=..., _outputs=3, **attrs)`.

A thin layer over onnx-ir's public `ir.tape.Tape`, with the calling convention of onnxscript's rewriter builder
(so an emitter also works inside an onnxscript rewrite rule): inputs positionally, attributes as keywords, and
`_domain`, `_version`, `_outputs` for the rest. The nodes it makes belong to no graph until the driver inserts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx_ir as ir


class Builder:
    """Records the nodes, initializers and opsets an emitter makes."""

    def __init__(self) -> None:
        self.tape = ir.tape.Tape()

    def __getattr__(self, op_type: str) -> Any:
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        return lambda *inputs, **attributes: self.op(op_type, *inputs, **attributes)

    def op(
        self,
        op_type: str,
        /,
        *inputs: ir.Value | None,
        _domain: str = "",
        _version: int | None = None,
        _outputs: int = 1,
        **attributes: Any,
    ) -> ir.Value | Sequence[ir.Value]:
        """One node; its output, or its outputs when `_outputs` > 1."""
        if _outputs == 1:
            return self.tape.op(op_type, inputs, attributes, domain=_domain, version=_version)
        return self.tape.op_multi_out(
            op_type, inputs, attributes, num_outputs=_outputs, domain=_domain, version=_version
        )

    def initializer(self, tensor: ir.TensorProtocol, name: str | None = None) -> ir.Value:
        return self.tape.initializer(tensor, name=name)

    @property
    def nodes(self) -> Sequence[ir.Node]:
        return self.tape.nodes

    @property
    def initializers(self) -> Sequence[ir.Value]:
        return self.tape.initializers

    @property
    def used_opsets(self) -> set[tuple[str, int | None]]:
        return self.tape.used_opsets
