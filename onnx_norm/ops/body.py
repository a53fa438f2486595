"""The tape an op's model-local function body is written on (ops/functions.py builds the function around it; each
op record's `body` writes the computation), with the idioms every body uses: constants, casts, float32
computation, rounding to a narrower type, reductions and the statistics of a row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import onnx_ir as ir

from onnx_norm.ops.signature import NormAttributes, NormOpAttributes, OpSignature

__all__ = ["FLOAT", "INT64_MAX", "Body", "BodySignature", "InputStage"]

FLOAT = int(ir.DataType.FLOAT)
INT64_MAX = np.iinfo(np.int64).max


class BodySignature(Protocol):
    """What a body reads of the node signature it is written for (functions.FunctionSignature)."""

    @property
    def x_type(self) -> int: ...

    @property
    def attrs(self) -> NormAttributes: ...

    @property
    def opset(self) -> int: ...

    @property
    def rank(self) -> int | None: ...


#: An op's input stage (`OpSignature.input_stage`): `stage(body, formal inputs, results, X in float32)` returns the
#: float32 values that the statistic and the epilogue read instead of X, computed at each element from X and the
#: op's other inputs there (the Skip ops' residual sum, the gate before a gated norm); a stage may also give an
#: output (the Skip ops' Sum). The CPU row loop (NormProblem::input) and the CUDA row kernels (NormRows' Stage)
#: have the same step.
InputStage = Callable[["Body", dict[str, ir.Value], dict[str, ir.Value], ir.Value], ir.Value]


class Body:
    """One function body being written: the op's record, the node signature and the tape."""

    def __init__(self, record: OpSignature, sig: BodySignature) -> None:
        self.record = record
        self.sig = sig
        self.tape = ir.tape.Tape()
        self._shared: dict[str, ir.Value] = {}

    def input(self, formal: dict[str, ir.Value], results: dict[str, ir.Value]) -> ir.Value:
        """The row the op normalises, in float32: X through the op's input stage when its record has one."""
        xf = self.to_float(formal["X"], self.sig.x_type)
        stage = self.record.input_stage
        return xf if stage is None else stage(self, formal, results, xf)

    def shared(self, name: str, make: Callable[[], ir.Value]) -> ir.Value:
        """The value `name`, written by `make` the first time: one value that an input stage and an epilogue both
        read (a gate) is computed once."""
        if name not in self._shared:
            self._shared[name] = make()
        return self._shared[name]

    def op(self, op_type: str, inputs: list[ir.Value], attributes: dict | None = None) -> ir.Value:
        return self.tape.op(op_type, inputs, attributes or {})

    def const(self, array: np.ndarray) -> ir.Value:
        return self.op("Constant", [], {"value": ir.tensor(array)})

    def i64(self, *values: int) -> ir.Value:
        return self.const(np.array(values, np.int64))

    def slice(self, data: ir.Value, starts: list[int], ends: list[int], axes: list[int] | None = None) -> ir.Value:
        """Slice with constant bounds: inputs from opset 10, attributes before."""
        if self.sig.opset < 10:
            attributes = {"starts": starts, "ends": ends} | ({"axes": axes} if axes is not None else {})
            return self.op("Slice", [data], attributes)
        bounds = [self.i64(*starts), self.i64(*ends)] + ([self.i64(*axes)] if axes is not None else [])
        return self.op("Slice", [data, *bounds])

    def cast(self, v: ir.Value, to: int) -> ir.Value:
        return self.op("Cast", [v], {"to": ir.DataType(to)})

    def to_float(self, v: ir.Value, elem_type: int | None) -> ir.Value:
        return v if elem_type == FLOAT else self.cast(v, FLOAT)

    def round_to(self, v: ir.Value, elem_type: int) -> ir.Value:
        # Rounding to float32 of a float32 value is the identity.
        if elem_type in (0, FLOAT):
            return v
        return self.cast(self.cast(v, elem_type), FLOAT)

    def affine(self, formal: dict[str, ir.Value], y: ir.Value) -> ir.Value:
        """The normalised float32 `y` rounded where the attributes say, times Scale, plus Bias (each when the node
        has it): every norm op's affine (docs/ops.md)."""
        a = self.sig.attrs
        y = self.round_to(y, a.normalized_type)
        if "Scale" in formal:
            y = self.round_to(self.op("Mul", [y, self.cast(formal["Scale"], FLOAT)]), a.multiply_type)
        if "Bias" in formal:
            y = self.round_to(self.op("Add", [y, self.cast(formal["Bias"], FLOAT)]), a.multiply_type)
        return y

    def output(self, y: ir.Value) -> ir.Value:
        """Y in the op's output type (output_type, else X's), from float32."""
        out_type = self.sig.attrs.output_type or self.sig.x_type
        return y if out_type == FLOAT else self.cast(y, out_type)

    def reduce_mean(self, v: ir.Value, axes: list[int]) -> ir.Value:
        if self.sig.opset >= 18:
            return self.op("ReduceMean", [v, self.const(np.array(axes, np.int64))], {"keepdims": 1})
        return self.op("ReduceMean", [v], {"axes": axes, "keepdims": 1})

    def statistics(self, x: ir.Value, axes: list[int], *, rms: bool) -> tuple[ir.Value, ir.Value | None, ir.Value]:
        """(centred x, mean or None, 1 / sqrt(variance + eps)) over `axes`."""
        if rms:
            mean, centred = None, x
        else:
            mean = self.reduce_mean(x, axes)
            centred = self.op("Sub", [x, mean])
        variance = self.reduce_mean(self.op("Mul", [centred, centred]), axes)
        eps = self.const(np.array(self.sig.attrs.epsilon, np.float32))
        a = self.sig.attrs
        if isinstance(a, NormOpAttributes) and a.epsilon_outside:  # 1 / (sqrt(var) + eps)
            return centred, mean, self.op("Reciprocal", [self.op("Add", [self.op("Sqrt", [variance]), eps])])
        inv = self.op("Reciprocal", [self.op("Sqrt", [self.op("Add", [variance, eps])])])
        return centred, mean, inv
