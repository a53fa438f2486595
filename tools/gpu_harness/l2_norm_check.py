"""L2Norm's CUDA kernel cases (l2_norm_kernels.cuh) through the one ctypes entry, against the op record's reference
(L2Norm; docs/ops.md): in the CPU emulator (tests/kernels/test_l2_norm_cuda.py, `gpu_check.py --self-test`) and on a GPU
(`gpu_check.py`, `row_op_checks.py --gpu --op l2_norm`). The runners and the loop are row_op_checks.py's; a case
here answers what they ask (`RowOpCase`)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from row_op_checks import BF16, F16, F32, TYPE_NAMES, Harness, record_reference, within_tolerance

from onnx_norm.ops.numerics import np_dtype


@dataclasses.dataclass(frozen=True)
class Case:
    x_type: int
    rows: int
    cols: int
    scale_size: int | None = None  # elements of Scale (a divisor of cols), None: no Scale
    epsilon: float = 1e-12
    rounding: int = 0  # normalized_type = multiply_type
    misaligned: bool = False  # X and Y one element past a 16-byte boundary: scalar units
    magnitude: float = 2.0  # |x|: 1000 in float16 overflows a float16 sum of squares
    zero_row: bool = False  # the first row all zeros: eps (or NaN with eps 0)

    @property
    def y_type(self) -> int:
        return self.x_type

    def name(self) -> str:
        parts = ["l2", TYPE_NAMES[self.x_type], f"{self.rows}x{self.cols}", f"eps{self.epsilon:g}"]
        parts += [f"scale{self.scale_size}"] * (self.scale_size is not None) + ["misaligned"] * self.misaligned
        parts += [f"mag{self.magnitude:g}"] * (self.magnitude != 2.0) + ["zero"] * self.zero_row
        return "-".join(parts + ([f"round{TYPE_NAMES[self.rounding]}"] if self.rounding else []))

    def inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray | None]:
        x = rng.standard_normal((self.rows, self.cols)) * self.magnitude + 0.1 * self.magnitude
        if self.zero_row:
            x[0] = 0.0
        scale = None if self.scale_size is None else rng.standard_normal(self.scale_size) * 0.5 + 1.0
        cast = lambda a: a.astype(np.float32).astype(np_dtype(self.x_type))  # noqa: E731
        return {"x": cast(x), "scale": None if scale is None else cast(scale)}

    def reference(self, inputs: dict[str, np.ndarray | None]) -> np.ndarray:
        attrs = {"normalized_type": self.rounding, "multiply_type": self.rounding, "epsilon": self.epsilon}
        scale = inputs["scale"]
        # A Scale shorter than the row covers its trailing dims: the row as [cols / size, size].
        x = inputs["x"] if scale is None else inputs["x"].reshape(self.rows, -1, scale.size)
        y = record_reference("L2Norm", {"x": x, "scale": scale}, axis=1 - x.ndim, **attrs)
        return y.reshape(self.rows, self.cols)

    def compare(self, got: np.ndarray, want: np.ndarray) -> str | None:
        return within_tolerance(self.y_type, got, want)

    def offset_of(self, name: str) -> int:
        return 1 if self.misaligned and name in ("x", "y") else 0

    def launch(self, harness: Harness, pointers: dict[str, int | None], stream: int = 0, device: int = -1) -> None:
        harness.launch(
            x=pointers["x"], y=pointers["y"], rows=self.rows, cols=self.cols, x_type=self.x_type,
            y_type=self.y_type, stream=stream, scale=pointers["scale"], scale_size=self.scale_size or 0,
            scale_type=self.x_type if self.scale_size else 0, epsilon=self.epsilon, normalized_type=self.rounding,
            multiply_type=self.rounding, device=device, row_op="L2Norm",  # l2_norm_launch.h: no op inputs or ints
        )  # fmt: skip


def build_cases(quick: bool = False) -> list[Case]:
    """Every kernel variant: vector units in registers, scalar units (odd rows, misaligned X/Y), rows read again
    (longer than 1024 threads x 4 units); no Scale, a Scale over a suffix of the row, fp16 rows whose squares
    overflow float16, zero rows (clamped by epsilon), fp16/bf16 rounding points."""
    cases = [
        Case(F32, 6, 64, scale_size=64),
        Case(F16, 5, 37, misaligned=True, zero_row=True),
        Case(F16, 4, 64, magnitude=1000.0, scale_size=16),
        Case(F32, 2, 40000, epsilon=0.0),
        Case(BF16, 3, 48, scale_size=48, rounding=BF16, zero_row=True, epsilon=1e-6),
    ]
    if not quick:
        cases += [Case(t, 64, 768, scale_size=768) for t in (F32, F16, BF16)]
        cases += [Case(F16, 33, 4096, rounding=F16, scale_size=4096), Case(F32, 7, 13, misaligned=True, scale_size=13)]
    return cases
