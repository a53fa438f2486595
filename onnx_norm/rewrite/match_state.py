"""What the matcher (match.py) carries from step to step: the tail it walked and how it was asked to match
(`MatchState`), one reading of `statistic + eps` under the junction (`StatReading`), and where the normalised axes
are (`Layout`), and what an affine strategy reads and gives (`AffineInputs`, `Affine`, `AffineStrategy`: declared here,
beside the state that holds a strategy, so that the strategies in match_affine.py import this module and not the
reverse); read by the tail walk (match_tail.py), the outside-readers check (match_outside.py) and the affine
strategies."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import onnx_ir as ir

from onnx_norm.rewrite import constants
from onnx_norm.rewrite.spec import Statistic
from onnx_norm.rewrite.structure import NearMiss


@dataclasses.dataclass
class TailOp:
    """One op of the tail, from the anchor down: a Cast, a scale (Mul, or Div with `exponent` -1) or the bias Add,
    with its constant (or run-time) operand."""

    node: ir.Node
    role: str  # "cast", "scale", "bias"
    constant: ir.Value | None
    exponent: int = 1


@dataclasses.dataclass(frozen=True)
class MatchState:
    """The norm being matched at one anchor: its output `y`, the `junction` the tail walk ended at (the normalised
    value), the `tail` above it (from `y` down), and what the caller asked for: the families whose statistics to
    look for (`kinds`), whether a channels-first norm may be matched, the affine strategy (None: the default)."""

    anchor: ir.Node
    y: ir.Value
    junction: ir.Value
    tail: list[TailOp]
    kinds: frozenset[str]
    channels_first: bool = True
    affine: AffineStrategy | None = None


@dataclasses.dataclass(frozen=True)
class StatReading:
    """One reading of a `stat + eps` leaf of the junction's product: the leaf, the statistic and the epsilon it
    splits into (None: no epsilon), and what a family recognised the statistic as."""

    eps_sum: ir.Value
    stat: ir.Value
    eps_value: ir.Value | None
    statistic: Statistic
    #: The leaf is `sqrt(stat) + eps` (epsilon added to the standard deviation), its exponent -1.
    epsilon_outside: bool = False


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the normalised axes are: non-negative `axes` when the rank is known (counted from the end when not),
    the Transpose that moves them last for a channels-first norm, and the input's shape (None when unknown)."""

    axes: tuple[int, ...]
    from_end: tuple[int, ...]
    rank: int | None
    x_shape: list | None
    perm: tuple[int, ...] | None


@dataclasses.dataclass
class Affine:
    """Scale and bias as the fused op reads them: graph values, or constants to make (`new_constants`)."""

    scale: ir.Value | None
    bias: ir.Value | None
    new_constants: dict[str, np.ndarray]
    proof_shape: list[int] | None  # the input shape to prove with when the input's rank is unknown


@dataclasses.dataclass(frozen=True)
class AffineInputs:
    """What an affine strategy reads: the tail's scale factors and bias, the constants of the normalised
    product, the statistic's correction, the layout and a name for new constants."""

    scale_terms: list[tuple[ir.Value, Fraction]]
    bias: ir.Value | None
    correction: float
    layout: Layout
    name: str


#: Reads scale and bias from the tail; raises NearMiss when the fused op cannot take them.
AffineStrategy = Callable[[AffineInputs], Affine]


def fold_product(factors: list[tuple[ir.Value, Fraction]]) -> np.ndarray | None:
    """The product of constant powers in float64, None when there is none."""
    try:
        return constants.fold_product(factors)
    except ValueError as err:
        raise NearMiss(str(err)) from err
