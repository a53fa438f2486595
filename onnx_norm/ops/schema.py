"""Names, signatures and attribute defaults of the fused norm ops (semantics: docs/ops.md)."""

from __future__ import annotations

import dataclasses

from onnx_norm.dtypes import FLOAT_TYPES

__all__ = [
    "ACTIVATIONS",
    "DOMAIN",
    "FLOAT_TYPES",
    "MODULATED_OPS",
    "OPS",
    "OPSET_VERSION",
    "GroupNormAttributes",
    "NormAttributes",
    "OpSignature",
]

DOMAIN = "onnx_norm"
OPSET_VERSION = 1


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


#: GroupNorm's `activation` attribute: what follows the affine, fused into the op.
ACTIVATIONS: dict[str, int] = {"none": 0, "silu": 1}


@dataclasses.dataclass(frozen=True)
class GroupNormAttributes(NormAttributes):
    """GroupNorm's attributes: the shared ones (its groups are fixed by the op, so `axis` is not an attribute of
    the op; the rewrite keeps it as -(rank - 1), the dims a group spans), plus the number of groups the channels
    (dim 1) are split into and the activation applied after the affine (ACTIVATIONS)."""

    num_groups: int = 1
    activation: int = 0

    def as_dict(self) -> dict[str, int | float]:
        values = dataclasses.asdict(self)
        del values["axis"]
        return values


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
    #: The op's attributes, as a dataclass whose fields are the attribute names (the C++ table is checked against
    #: them, the function bodies and the rewrite read them).
    attributes: type[NormAttributes] = NormAttributes
    #: One of the LayerNorm/RMSNorm ops the built-in targets' tables hold; ops of a family module of their own
    #: (the modulated ones, GroupNorm) are emitted by that module.
    standard: bool = True

    @property
    def attribute_names(self) -> tuple[str, ...]:
        """The attributes a node of this op may carry, in the order the C++ table lists them."""
        return tuple(self.attributes().as_dict())


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
    standard=False,
)
MODULATED_RMS_NORM = OpSignature(
    "ModulatedRMSNorm",
    ("X", "Scale", "ModScale", "ModShift"),
    frozenset({"Scale"}),
    ("Y",),
    True,
    False,
    True,
    standard=False,
)
#: GroupNorm over NCHW (any rank >= 3): the channels (dim 1) split into num_groups groups, each group of a sample
#: normalised over its channels and every dim after them, then Scale and Bias per channel, then the activation.
GROUP_NORM = OpSignature(
    "GroupNorm",
    ("X", "Scale", "Bias"),
    frozenset({"Scale", "Bias"}),
    ("Y",),
    False,
    False,
    attributes=GroupNormAttributes,
    standard=False,
)

#: Every op of the domain, by name: the norms, the Skip norms, the modulated (adaLN) norms and GroupNorm.
OPS: dict[str, OpSignature] = {
    op.name: op
    for op in (
        LAYER_NORM,
        RMS_NORM,
        SKIP_LAYER_NORM,
        SKIP_RMS_NORM,
        MODULATED_LAYER_NORM,
        MODULATED_RMS_NORM,
        GROUP_NORM,
    )
}
#: The modulated ops (a norm, then per-sample `* (1 + ModScale) + ModShift`; no statistics outputs): code written
#: for the statistics/Skip ops filters them out with `OpSignature.modulated`.
MODULATED_OPS: dict[str, OpSignature] = {name: op for name, op in OPS.items() if op.modulated}
