"""GatedRMSNorm's CUDA kernel cases (gated_norm_kernels.cuh) through the one ctypes entry, against the op record's
reference (GatedRMSNorm; docs/ops.md): in the CPU emulator (tests/kernels/test_gated_norm_cuda.py, `gpu_check.py
--self-test`) and on a GPU (`gpu_check.py`, `row_op_checks.py --gpu --op gated_norm`). The runners and the loop are
row_op_checks.py's; a case here answers what they ask (`RowOpCase`)."""

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
    rows: int  # rows of X
    dim: int  # D, X's last dim
    group_size: int = 0  # 0: the whole row one group
    gate_after: bool = False  # norm_before_gate = 1
    scale: bool = True
    z_type: int | None = None  # None: X's type (Scale has Z's type)
    rounding: int = 0  # normalized_type = multiply_type
    misaligned: bool = False  # X and Y one element past a 16-byte boundary: scalar units
    gate_magnitude: float = 2.0  # |z|: 30 saturates the sigmoid (exp(-z) overflows for z < -88)

    @property
    def y_type(self) -> int:
        return self.x_type

    @property
    def ztype(self) -> int:
        return self.z_type or self.x_type

    @property
    def cols(self) -> int:
        return self.group_size or self.dim

    def name(self) -> str:
        parts = ["gated", TYPE_NAMES[self.x_type], f"{self.rows}x{self.dim}", "after" if self.gate_after else "before"]
        parts += [f"groups{self.dim // self.cols}"] * bool(self.group_size) + ["noscale"] * (not self.scale)
        parts += [f"z{TYPE_NAMES[self.ztype]}"] * (self.ztype != self.x_type) + ["misaligned"] * self.misaligned
        parts += [f"gate{self.gate_magnitude:g}"] * (self.gate_magnitude != 2.0)
        return "-".join(parts + ([f"round{TYPE_NAMES[self.rounding]}"] if self.rounding else []))

    def inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray | None]:
        def rand(shape: tuple[int, ...], elem: int, scale: float, loc: float = 0.0) -> np.ndarray:
            return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(np_dtype(elem))

        return {
            "x": rand((self.rows, self.dim), self.x_type, 2.0, 0.5),
            "z": rand((self.rows, self.dim), self.ztype, self.gate_magnitude),
            "scale": rand((self.dim,), self.ztype, 0.5, 1.0) if self.scale else None,
        }

    def reference(self, inputs: dict[str, np.ndarray | None]) -> np.ndarray:
        attrs = {"normalized_type": self.rounding, "multiply_type": self.rounding, "epsilon": 1e-5}
        attrs |= {"group_size": self.group_size, "norm_before_gate": int(self.gate_after)}
        return record_reference("GatedRMSNorm", inputs, **attrs)

    def compare(self, got: np.ndarray, want: np.ndarray) -> str | None:
        return within_tolerance(self.y_type, got, want)

    def offset_of(self, name: str) -> int:
        return 1 if self.misaligned and name in ("x", "y", "z") else 0

    def launch(self, harness: Harness, pointers: dict[str, int | None], stream: int = 0, device: int = -1) -> None:
        """Through LaunchNorm as GatedRMSNorm's row op (custom_ops/src/cuda/gated_norm_launch.h): the groups as rows."""
        harness.launch(
            x=pointers["x"], y=pointers["y"], rows=self.rows * (self.dim // self.cols), cols=self.cols,
            x_type=self.x_type, y_type=self.y_type, stream=stream, scale=pointers["scale"],
            scale_size=self.dim if self.scale else 0, scale_type=self.ztype, rms=True, epsilon=1e-5,
            normalized_type=self.rounding, multiply_type=self.rounding, device=device, row_op="GatedRMSNorm",
            op_inputs=(pointers["z"],), op_ints=(int(self.gate_after),),  # gated_norm_launch.h: Z; the gate's order
        )  # fmt: skip


def build_cases(quick: bool = False) -> list[Case]:
    """Both gate orders in every kernel variant: vector units in registers (the gate's product held there as
    float32), scalar units (odd groups, misaligned X/Z/Y), rows read again (groups longer than 1024 threads x 4
    units); Mamba2's groups with the per-group part of Scale, no Scale, a float32 Z under float16 X, a saturated
    sigmoid, float16/bfloat16 rounding points."""
    cases = []
    for after in (False, True):
        cases += [
            Case(F32, 6, 128, gate_after=after),
            Case(F16, 4, 256, group_size=64, gate_after=after),
            Case(BF16, 3, 96, group_size=32, gate_after=after, rounding=BF16),
            Case(F16, 5, 74, group_size=37, gate_after=after, misaligned=True),
            Case(F32, 2, 40000, gate_after=after, scale=False),
        ]
    cases += [Case(F16, 4, 128, z_type=F32), Case(F32, 3, 64, gate_magnitude=30.0, group_size=16)]
    if not quick:
        for after in (False, True):
            cases += [Case(t, 32, 2048, group_size=256, gate_after=after) for t in (F32, F16, BF16)]
            cases += [
                Case(F16, 16, 4096, gate_after=after, rounding=F16),
                Case(F32, 7, 26, group_size=13, gate_after=after),
            ]
            cases.append(Case(F32, 2, 40001, gate_after=after, misaligned=True))  # scalar units read again
    return cases
