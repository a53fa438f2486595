"""The modulated (adaLN) ops' CUDA kernel cases (modulated_kernels.cuh) through the one ctypes entry, against the op
records' references (ModulatedLayerNorm, ModulatedRMSNorm; docs/ops.md): in the CPU emulator
(tests/kernels/test_adaln_cuda.py,
`gpu_check.py --self-test`) and on a GPU (`gpu_check.py`, `row_op_checks.py --gpu --op modulated`). The runners and
the loop are row_op_checks.py's; a case here answers what they ask (`RowOpCase`)."""

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
    rms: bool
    x_type: int
    samples: int
    rows_per_sample: int
    cols: int
    param_type: int | None = None  # None: X's type
    affine: bool = False  # the norm's own Scale (and Bias for LayerNorm)
    shared: bool = False  # one modulation row for every sample
    rounding: int = 0  # normalized_type = multiply_type
    output_type: int = 0
    offset: int = 0  # elements between a 256-byte boundary and X (and Y, params: offset + 1 when misaligned)
    misaligned: bool = False

    @property
    def ptype(self) -> int:
        return self.param_type or self.x_type

    @property
    def y_type(self) -> int:
        return self.output_type or self.x_type

    def name(self) -> str:
        parts = [
            "rms" if self.rms else "ln",
            TYPE_NAMES[self.x_type],
            f"{self.samples}x{self.rows_per_sample}x{self.cols}",
            f"p{TYPE_NAMES[self.ptype]}",
        ]
        parts += ["affine"] * self.affine + ["shared"] * self.shared + ["misaligned"] * self.misaligned
        if self.rounding:
            parts.append(f"round{TYPE_NAMES[self.rounding]}")
        if self.output_type:
            parts.append(f"y{TYPE_NAMES[self.output_type]}")
        return "-".join(parts)

    def inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray | None]:
        def rand(shape: tuple[int, ...], elem: int, scale: float, loc: float = 0.0) -> np.ndarray:
            return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(np_dtype(elem))

        mod_rows = 1 if self.shared else self.samples
        return {
            "x": rand((self.samples, self.rows_per_sample, self.cols), self.x_type, 2.0, 3.0),
            "scale": rand((self.cols,), self.ptype, 0.5, 1.0) if self.affine else None,
            "bias": rand((self.cols,), self.ptype, 0.5) if self.affine and not self.rms else None,
            "mod_scale": rand((mod_rows, self.cols), self.ptype, 0.5),
            "mod_shift": rand((mod_rows, self.cols), self.ptype, 0.5),
        }

    def reference(self, inputs: dict[str, np.ndarray | None]) -> np.ndarray:
        op = "ModulatedRMSNorm" if self.rms else "ModulatedLayerNorm"
        attrs = {"normalized_type": self.rounding, "multiply_type": self.rounding, "output_type": self.output_type}
        return record_reference(op, inputs, **attrs)

    def compare(self, got: np.ndarray, want: np.ndarray) -> str | None:
        return within_tolerance(self.y_type, got, want)

    def offset_of(self, name: str) -> int:
        # Misaligned: X on a 16-byte boundary plus one element, the others on two: scalar units, every access checked.
        return self.offset + (1 + (name != "x") if self.misaligned else 0)

    def launch(self, harness: Harness, pointers: dict[str, int | None], stream: int = 0, device: int = -1) -> None:
        """Through LaunchNorm as the modulated row op (custom_ops/src/cuda/modulated_launch.h)."""
        has_parameters = pointers["scale"] is not None or pointers["bias"] is not None
        harness.launch(
            x=pointers["x"], y=pointers["y"], rows=self.samples * self.rows_per_sample, cols=self.cols,
            x_type=self.x_type, y_type=self.y_type, stream=stream, scale=pointers["scale"], bias=pointers["bias"],
            scale_size=self.cols if has_parameters else 0, scale_type=self.ptype, rms=self.rms,
            normalized_type=self.rounding, multiply_type=self.rounding, device=device, row_op="Modulated",
            op_inputs=(pointers["mod_scale"], pointers["mod_shift"]),  # modulated_launch.h: ModScale, ModShift
            op_ints=(1 if self.shared else self.samples, self.rows_per_sample),  # mod_batch, rows_per_sample
        )  # fmt: skip


def build_cases(quick: bool = False) -> list[Case]:
    """Row lengths reach every kernel variant: vector units in registers (1 to 4 per thread, 8 to 1024 threads per
    row), the re-read kernel beyond 4096 units, and scalar units for odd lengths and misaligned tensors. Each op x X
    type also has the norm's affine, a shared modulation, misaligned tensors, rounding points and other Scale/Y
    types."""
    cases = []
    lengths = (8, 96, 1152) if quick else (1, 8, 7, 96, 1000, 1152, 4100, 16392, 40000)
    for rms in (False, True):
        for x_type in (F32, F16, BF16):
            for cols in lengths:
                rows_per_sample = max(1, min(5, 6000 // cols))
                cases.append(Case(rms, x_type, 2, rows_per_sample, cols))
            cases.append(Case(rms, x_type, 3, 4, 64, affine=True))
            cases.append(Case(rms, x_type, 3, 4, 96, shared=True))
            cases.append(Case(rms, x_type, 2, 3, 96, misaligned=True, affine=True))
            if x_type != F32:
                cases.append(Case(rms, x_type, 2, 3, 256, rounding=x_type, affine=True))
                cases.append(Case(rms, x_type, 2, 3, 256, param_type=F32, output_type=F32))
            else:
                cases.append(Case(rms, x_type, 2, 3, 256, rounding=F16))
                cases.append(Case(rms, x_type, 2, 3, 256, param_type=BF16, output_type=F16))
    return cases
