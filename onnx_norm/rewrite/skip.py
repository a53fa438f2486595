"""Residual Adds folded into the Skip variants.

`norm(a + b)` where `a` and `b` are both computed tensors of the input's shape and type (no broadcasting: the
Skip ops add elementwise, in the input's type, like the graph's Add). When the sum also feeds something else (the
residual stream of pre-norm transformers) it stays available as the op's `Sum` output and its readers are rewired.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from onnx_norm.dtypes import is_onnx_domain
from onnx_norm.rewrite import constants
from onnx_norm.rewrite.match import Candidate
from onnx_norm.rewrite.spec import NormSpec


def _known_shape(value: ir.Value) -> tuple | None:
    if value.shape is None:
        return None
    dims = []
    for dim in value.shape:
        if isinstance(dim, int):
            dims.append(dim)
        elif getattr(dim, "value", None) is None:
            return None  # an anonymous dim may differ from any other
        else:
            dims.append(dim.value)
    return tuple(dims)


def residual_addends(x: ir.Value) -> tuple[ir.Node, ir.Value, ir.Value] | None:
    """(Add, a, b) when `x` is `Add(a, b)` of two computed tensors of x's type and known shape, else None."""
    add = x.producer()
    if add is None or add.op_type != "Add" or not is_onnx_domain(add.domain) or len(add.inputs) != 2:
        return None
    a, b = add.inputs
    if a is None or b is None or a.dtype != x.dtype or b.dtype != x.dtype:
        return None
    shape = _known_shape(x)
    if shape is None or _known_shape(a) != shape or _known_shape(b) != shape:
        return None
    if constants.is_constant(a) or constants.is_constant(b):  # last: folding is the costly test
        return None
    return add, a, b


def fold_residual(candidate: Candidate) -> Candidate | None:
    """The Skip variant of `candidate` when its input is a residual Add, else None."""
    spec = candidate.spec
    if candidate.perm is not None or spec.mean is not None or spec.inv_std is not None:
        return None
    x = spec.x
    addends = residual_addends(x)
    if addends is None:
        return None
    add, a, b = addends
    # Casts of the sum that something else also reads are made again from the fused op's Sum output, after it.
    recast = list(candidate.kept)
    nodes = [*candidate.nodes, add, *recast]
    new_spec = fold_spec(spec, a, b, set(nodes), force_sum=bool(recast))
    return dataclasses.replace(candidate, spec=new_spec, nodes=nodes, kept=[], recast=recast)


def fold_spec(spec: NormSpec, a: ir.Value, b: ir.Value, removed: set[ir.Node], force_sum: bool = False) -> NormSpec:
    """`spec` reading `a + b` as X and Skip; the sum stays available (Sum output) when anything outside `removed`
    reads it."""
    x = spec.x
    keeps_sum = force_sum or x.is_graph_output() or any(use.node not in removed for use in x.uses())
    return dataclasses.replace(spec, x=a, skip=b, sum=x if keeps_sum else None)
