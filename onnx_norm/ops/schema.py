"""Names, signatures and attribute defaults of the fused norm ops (semantics: docs/ops.md)."""

from __future__ import annotations

import dataclasses

from onnx_norm.dtypes import FLOAT_TYPES

__all__ = [
    "DOMAIN",
    "FLOAT_TYPES",
    "MODULATED_OPS",
    "OPS",
    "OPSET_VERSION",
    "NormAttributes",
    "OpSignature",
]

DOMAIN = "onnx_norm"
OPSET_VERSION = 1


@dataclasses.dataclass(frozen=True)
class OpSignature:
    name: str
    inputs: tuple[str, ...]
    optional_inputs: frozenset[str]
    outputs: tuple[str, ...]
    rms: bool
    skip: bool
    # adaLN: the normalised row is then multiplied by (1 + ModScale) and shifted by ModShift, per sample.
    modulated: bool = False


LAYER_NORM = OpSignature(
    "LayerNorm", ("X", "Scale", "Bias"), frozenset({"Scale", "Bias"}), ("Y", "Mean", "InvStdDev"), False, False
)
RMS_NORM = OpSignature("RMSNorm", ("X", "Scale"), frozenset({"Scale"}), ("Y", "InvRMS"), True, False)
SKIP_LAYER_NORM = OpSignature(
    "SkipLayerNorm", ("X", "Skip", "Scale", "Bias"), frozenset({"Scale", "Bias"}), ("Y", "Sum"), False, True
)
SKIP_RMS_NORM = OpSignature("SkipRMSNorm", ("X", "Skip", "Scale"), frozenset({"Scale"}), ("Y", "Sum"), True, True)

MODULATED_LAYER_NORM = OpSignature(
    "ModulatedLayerNorm",
    ("X", "Scale", "Bias", "ModScale", "ModShift"),
    frozenset({"Scale", "Bias"}),
    ("Y",),
    False,
    False,
    True,
)
MODULATED_RMS_NORM = OpSignature(
    "ModulatedRMSNorm", ("X", "Scale", "ModScale", "ModShift"), frozenset({"Scale"}), ("Y",), True, False, True
)

#: Every op of the domain, by name: the norms, the Skip norms and the modulated (adaLN) norms.
OPS: dict[str, OpSignature] = {
    op.name: op
    for op in (LAYER_NORM, RMS_NORM, SKIP_LAYER_NORM, SKIP_RMS_NORM, MODULATED_LAYER_NORM, MODULATED_RMS_NORM)
}
#: The modulated ops (a norm, then per-sample `* (1 + ModScale) + ModShift`; no statistics outputs): code written
#: for the statistics/Skip ops filters them out with `OpSignature.modulated`.
MODULATED_OPS: dict[str, OpSignature] = {name: op for name, op in OPS.items() if op.modulated}


@dataclasses.dataclass(frozen=True)
class NormAttributes:
    """Attributes shared by all the ops. Types are TensorProto element types; 0 means "not set"."""

    axis: int = -1
    epsilon: float = 1e-5
    normalized_type: int = 0
    multiply_type: int = 0
    output_type: int = 0

    def as_dict(self) -> dict[str, int | float]:
        return dataclasses.asdict(self)
