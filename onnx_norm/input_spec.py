"""One graph input as the input generation and the checks read it (inputs.py, input_values.py): its own module so
that both can name it without importing each other."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from onnx_norm.ops.reference import np_dtype


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One graph input: name, element type and shape (ints for fixed dims, str for symbolic, None for unknown)."""

    name: str
    elem_type: int
    shape: tuple[int | str | None, ...] | None

    @property
    def dtype(self) -> np.dtype:
        return np_dtype(self.elem_type)

    def describe(self) -> str:
        dims = "?" if self.shape is None else ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {onnx.helper.tensor_dtype_to_string(self.elem_type)}[{dims}]"
