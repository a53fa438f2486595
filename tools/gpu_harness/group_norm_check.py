"""GroupNorm's CUDA kernel cases (group_norm_kernels.cuh) through the one ctypes entry, against the op record's
reference (GroupNorm; docs/ops.md): in the CPU emulator (tests/kernels/test_group_norm_cuda.py, `gpu_check.py
--self-test`)
and on a GPU (`gpu_check.py`, `row_op_checks.py --gpu --op group_norm`). The runners and the loop are
row_op_checks.py's; a case here answers what they ask (`RowOpCase`)."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from row_op_checks import BF16, F16, F32, TYPE_NAMES, Harness, record_reference, within_tolerance

from onnx_norm.ops.group_norm import ACTIVATIONS
from onnx_norm.ops.numerics import np_dtype


@dataclasses.dataclass(frozen=True)
class Case:
    x_type: int
    shape: tuple[int, ...]  # [N, C, ...]
    groups: int
    affine: bool = True
    silu: bool = True
    rounding: int = 0  # normalized_type = multiply_type
    misaligned: bool = False  # X and Y one element past a 16-byte boundary: scalar units

    @property
    def y_type(self) -> int:
        return self.x_type

    @property
    def activation(self) -> int:
        return ACTIVATIONS["silu" if self.silu else "none"]

    def name(self) -> str:
        parts = ["gn", TYPE_NAMES[self.x_type], "x".join(map(str, self.shape)), f"g{self.groups}"]
        parts += ["affine"] * self.affine + ["silu"] * self.silu + ["misaligned"] * self.misaligned
        return "-".join(parts + ([f"round{TYPE_NAMES[self.rounding]}"] if self.rounding else []))

    def inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray | None]:
        def rand(shape: tuple[int, ...], scale: float, loc: float) -> np.ndarray:
            return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(np_dtype(self.x_type))

        channels = (self.shape[1],)
        return {
            "x": rand(self.shape, 2.0, 0.5),
            "scale": rand(channels, 0.5, 1.0) if self.affine else None,
            "bias": rand(channels, 0.5, 0.0) if self.affine else None,
        }

    def reference(self, inputs: dict[str, np.ndarray | None]) -> np.ndarray:
        attrs = {"normalized_type": self.rounding, "multiply_type": self.rounding}
        return record_reference("GroupNorm", inputs, num_groups=self.groups, activation=self.activation, **attrs)

    def compare(self, got: np.ndarray, want: np.ndarray) -> str | None:
        return within_tolerance(self.y_type, got, want)

    def offset_of(self, name: str) -> int:
        return 1 if self.misaligned and name in ("x", "y") else 0

    def launch(self, harness: Harness, pointers: dict[str, int | None], stream: int = 0, device: int = -1) -> None:
        spatial = math.prod(self.shape[2:])
        harness.launch(
            x=pointers["x"], y=pointers["y"], rows=self.shape[0] * self.groups,
            cols=self.shape[1] // self.groups * spatial, x_type=self.x_type, y_type=self.y_type, stream=stream,
            scale=pointers["scale"], bias=pointers["bias"], scale_type=self.x_type if self.affine else 0,
            normalized_type=self.rounding, multiply_type=self.rounding, device=device, row_op="GroupNorm",
            op_ints=(self.groups, spatial, self.activation),  # group_norm_launch.h: num_groups, spatial, activation
        )  # fmt: skip


def build_cases(quick: bool = False) -> list[Case]:
    """Every kernel variant: vector units in registers, scalar units (odd spatial sizes, misaligned X/Y), rows read
    again (a group longer than 1024 threads x 4 units); GroupNorm(1), no affine, fp16/bf16 rounding points."""
    cases = [
        Case(F32, (2, 8, 4, 4), 4),
        Case(F16, (2, 8, 3, 5), 2, misaligned=True),
        Case(F32, (1, 4, 96, 96), 2, silu=False),
        Case(BF16, (2, 6, 5, 3), 1, affine=False, rounding=BF16),
        Case(F16, (2, 16, 8, 8), 4, rounding=F16),
    ]
    if not quick:
        cases += [Case(t, (2, 64, 16, 16), 32) for t in (F32, F16, BF16)]
        cases += [Case(F32, (1, 32, 7), 8, misaligned=True), Case(BF16, (2, 320, 32, 32), 32, rounding=BF16)]
    return cases
