"""A matched norm ready to be proven and rewritten: what a family's matcher (match.py) gives, the proof (prove.py)
checks and the builder (builder.py) replaces. Its own module, beside the spec it carries, so that the family
registry (family.py) can name it without importing the matcher, which imports the registry."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from onnx_norm.rewrite.spec import NormSpec


@dataclasses.dataclass
class Candidate:
    """A matched norm, ready to be proven and rewritten."""

    spec: NormSpec
    nodes: list[ir.Node]  # nodes the fused op replaces
    axes: tuple[int, ...]  # reduced axes of the input (non-negative)
    perm: tuple[int, ...] | None  # channels-first: the Transpose that moves the normalised axes last
    new_constants: dict[str, np.ndarray]  # "scale"/"bias" that need a new constant in the graph
    variant: str
    cast_placement: str
    x_value: ir.Value  # the input of the norm before any residual Add was folded in
    proof_shape: list[int] | None = None  # input shape for the proof when the input's own cannot serve
    kept: list[ir.Node] = dataclasses.field(default_factory=list)  # Casts of the input that others read too
    recast: list[ir.Node] = dataclasses.field(default_factory=list)  # kept Casts re-made from the fused Sum
    aliases: list[ir.Value] = dataclasses.field(default_factory=list)  # identical Casts of the input's source
    #: Replaced values whose shape is known to be that of a value the fused op reads: a `Shape` outside the match
    #: that reads one reads that value instead (TorchScript computes a view's target from `Shape` of the data).
    same_shape: dict[ir.Value, ir.Value] = dataclasses.field(default_factory=dict)
