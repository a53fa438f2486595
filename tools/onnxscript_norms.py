"""Norms written as onnxscript functions, the way a model author writes them: Python literals for epsilon, which
onnxscript turns into `CastLike(Constant, other operand)`. Used by make_exporter_fixtures.py.

No `from __future__ import annotations` here: onnxscript evaluates the type annotations of a scripted function.
"""

from onnxscript import FLOAT, script
from onnxscript import opset18 as op


@script()
def rms_norm(x: FLOAT["B", "S", 16], weight: FLOAT[16]) -> FLOAT["B", "S", 16]:  # noqa: F821
    ms = op.ReduceMean(x * x, [-1])
    return x / op.Sqrt(ms + 1e-6) * weight


@script()
def layer_norm(x: FLOAT["B", "S", 16], weight: FLOAT[16], bias: FLOAT[16]) -> FLOAT["B", "S", 16]:  # noqa: F821
    mean = op.ReduceMean(x, [-1])
    d = x - mean
    var = op.ReduceMean(d * d, [-1])
    return d * op.Reciprocal(op.Sqrt(var + 1e-5)) * weight + bias


FUNCTIONS = {"rmsnorm": rms_norm, "layernorm": layer_norm}
