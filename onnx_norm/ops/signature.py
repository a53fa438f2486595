"""The base types of an op record: the attributes every fused op shares, the ONNX/ONNX Runtime ops an op maps to
and from, and the record itself (semantics: docs/ops.md). Each op module (`norms.py`, and one per other op) builds
its records from these; `schema.py` lists them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from onnx_norm.dtypes import NARROW_TYPES, ONNX_DOMAINS

__all__ = ["DOMAIN", "MS_DOMAIN", "OPSET_VERSION", "FixedAxisAttributes", "NativeOp", "NormAttributes"]
__all__ += ["NormOpAttributes", "OpSignature"]

DOMAIN = "onnx_norm"
OPSET_VERSION = 1
#: ONNX Runtime's contrib-op domain.
MS_DOMAIN = "com.microsoft"


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

    def unsupported_by(self, record: OpSignature) -> list[str]:
        """The attributes set here to other than their default that `record`'s op does not have (a family whose op
        is built on an inner norm must not drop what that norm computes)."""
        defaults = type(self)()
        names = set(record.attribute_names)
        return [
            field.name
            for field in dataclasses.fields(self)
            if field.name not in names and getattr(self, field.name) != getattr(defaults, field.name)
        ]

    def native_reason(self) -> str | None:
        """Why no ONNX/ONNX Runtime norm op computes a norm with these attributes; None when one can."""
        return None


@dataclasses.dataclass(frozen=True)
class FixedAxisAttributes(NormAttributes):
    """The attributes of an op whose normalised dims are fixed by the op itself (not an attribute): `axis` is kept
    for the rewrite's reference but is not an attribute of the op, so the node's attributes leave it out."""

    def as_dict(self) -> dict[str, int | float]:
        values = dataclasses.asdict(self)
        del values["axis"]
        return values


@dataclasses.dataclass(frozen=True)
class NormOpAttributes(NormAttributes):
    """The attributes of the LayerNorm/RMSNorm ops (ops/norms.py): the shared ones, plus `epsilon_outside`: 1 adds
    epsilon to the standard deviation instead of the variance, `(x - mean) / (sqrt(var) + eps)` (the Annotated
    Transformer's LayerNorm, `a * (x - mean) / (x.std(-1) + eps) + b`, copied into much hand-written model code),
    which no ONNX or ONNX Runtime op computes."""

    epsilon_outside: int = 0

    def native_reason(self) -> str | None:
        if self.epsilon_outside:
            return (
                "epsilon is added to the standard deviation, outside the square root ((x - mean) / (std + eps)); "
                "the standard ops add it to the variance"
            )
        return None


@dataclasses.dataclass(frozen=True)
class NativeOp:
    """An ONNX or ONNX Runtime op computing what one of our ops computes: emitted for a target, taken over from a
    model, run by the proof's evaluator and by the GPU check's ORT comparison.

    `targets`: the `--target`s that emit it (`rewrite/targets.py` picks, per target, the newest version the model's
    opset allows). `take_over`: the domains the built-in take-over reads it in (`rewrite/native.py`); empty when the
    op's family reads it itself (`NormFamily.native`). `single_type`: X, scale, bias and Y share one type (else Y
    takes the scale's type and X keeps its own; ONNX Runtime's contrib semantics: computed in float32, rounded
    once). `outputs`: the index of each statistic it can also return ("mean", "inv_std", "sum").
    """

    op_type: str
    domain: str
    version: int
    single_type: bool = True
    outputs: Mapping[str, int] = dataclasses.field(default_factory=dict)
    targets: tuple[str, ...] = ()
    take_over: tuple[str, ...] = ()
    takes_bias: bool = True
    axis_attrs: bool = True  # takes axis and stash_type (the Skip ops normalise the last dim only)
    takes_skip: bool = False
    #: Narrow X types the op's CPU kernels take with a float32 scale and Y (not `single_type` ops); another X is
    #: cast to float32 in front, exactly, so that the written model loads on ONNX Runtime's CPU provider.
    narrow_x_with_float_y: frozenset[int] = frozenset(NARROW_TYPES)


#: `reference(*inputs in schema order, **attributes) -> outputs in schema order` (numpy, float64 statistics).
Reference = Callable[..., tuple[np.ndarray, ...]]
#: `body(body, formal inputs by name, results by output name, number of formal outputs)`: writes the op's model-local
#: function on `body` (an `onnx_norm.ops.body.Body`) and puts its outputs into `results`.
BodyBuilder = Callable[[Any, dict[str, Any], dict[str, Any], int], None]


def _no_reference(*inputs: np.ndarray, **attrs: Any) -> tuple[np.ndarray, ...]:
    raise NotImplementedError("this op record has no reference")


def _no_body(body: Any, formal: dict[str, Any], results: dict[str, Any], n_out: int) -> None:
    raise NotImplementedError("this op record has no function body")


def _trailing_shapes(x_shape: tuple[int, ...], attrs: NormAttributes) -> dict[str, tuple[int, ...]]:
    return {"Skip": x_shape, "Scale": x_shape[attrs.axis :], "Bias": x_shape[attrs.axis :]}


@dataclasses.dataclass(frozen=True)
class OpSignature:
    """One fused op's record: everything the schemas, the function bodies, the targets, the take-over, the
    evaluator, the kernels' table check and the GPU harness read about it."""

    name: str
    inputs: tuple[str, ...]
    optional_inputs: frozenset[str]
    outputs: tuple[str, ...]
    #: The statistic: mean-free (RMS) or centred (LayerNorm).
    rms: bool
    #: The op adds a residual (Skip) input to X and returns the sum.
    skip: bool
    #: The op's attributes, as a dataclass whose fields are the attribute names (the C++ table is checked against
    #: them, the function bodies and the rewrite read them).
    attributes: type[NormAttributes] = NormAttributes
    #: The `NormSpec.kind` of the matches the op fuses (its family's kind); with `skip`, how the built-in targets
    #: find the op of a match.
    kind: str = ""
    #: The float64 reference (`Reference`).
    reference: Reference = _no_reference
    #: The model-local function body (`BodyBuilder`).
    body: BodyBuilder = _no_body
    #: What the body's statistic reads instead of X (`onnx_norm.ops.body.InputStage`; None: X itself).
    input_stage: Callable[..., Any] | None = None
    #: The ONNX / ONNX Runtime ops that compute the same thing (`NativeOp`).
    natives: tuple[NativeOp, ...] = ()
    #: The shape of each input beside X for an X of the given shape (a valid call: tests, checks, benchmarks).
    input_shapes: Callable[[tuple[int, ...], NormAttributes], dict[str, tuple[int, ...]]] = _trailing_shapes
    #: Attributes of an example call (tests run every record with them, on X of shape (2, 4, 3, 5)).
    example: NormAttributes = dataclasses.field(default_factory=NormAttributes)

    @property
    def attribute_names(self) -> tuple[str, ...]:
        """The attributes a node of this op may carry, in the order the C++ table lists them."""
        return tuple(self.attributes().as_dict())

    def native(self, target: str, opset: int) -> NativeOp | None:
        """The native op `target` emits for this op in a model of default-domain `opset` (0: unknown): the newest
        version the opset allows, else the oldest (whose planner then names the opset it needs); None if none."""
        ops = sorted((n for n in self.natives if target in n.targets), key=lambda n: n.version)
        if not ops:
            return None
        allowed = [n for n in ops if n.version <= opset or n.domain not in ONNX_DOMAINS]
        return allowed[-1] if allowed else ops[0]
