#!/usr/bin/env python3
"""Checks the CUDA kernel of the modulated (adaLN) ops against the numpy reference (docs/ops.md).

    python tools/gpu_harness/modulated_check.py --emulate   # no GPU: the kernel's real source in the CPU emulator
    python tools/gpu_harness/modulated_check.py --gpu       # a GPU, nvcc and torch: the kernel itself

Both run every case (op x X type x row length x Scale/Y types x the norm's affine x per-sample or shared
modulation x rounding attributes x misaligned tensors) through the one launcher of every op (LaunchNorm,
custom_ops/src/cuda/launch.cu, with ModScale/ModShift given) and the one ctypes entry
(tools/gpu_harness/harness.cu, built by gpu_build.py as tools/gpu_check.py builds it), with guard bands around Y
that must stay untouched, and compare Y with `onnx_norm.ops.modulated.modulated_norm`. `--emulate` builds the CPU
emulator of the kernels (tools/gpu_harness/emulator.cc) with g++ and the CUDA headers; it also reports which kernel
variants the cases reached. tools/gpu_check.py runs these cases too, on the GPU and in its --self-test. Exits 1 on
a mismatch, 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for _path in (REPO, REPO / "tools" / "gpu_harness"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gpu_backends import HostHarnessBackend  # noqa: E402
from gpu_build import Harness, build_emulator, build_harness, find_cuda_include, find_nvcc  # noqa: E402
from onnx import TensorProto  # noqa: E402

from onnx_norm.dtypes import type_name  # noqa: E402
from onnx_norm.ops.modulated import modulated_norm  # noqa: E402
from onnx_norm.ops.numerics import np_dtype  # noqa: E402
from onnx_norm.ops.schema import NormAttributes  # noqa: E402

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
TYPE_NAMES = {t: type_name(t) for t in (0, F32, F16, BF16)}  # the spellings of onnx_norm.dtypes
GUARD = 64
# About one unit in the last place of Y's type (float32 statistics vs the float64 reference; two where a rounding
# step can tie the other way).
TOLERANCE = {F32: 3e-5, F16: 4e-3, BF16: 3.2e-2}


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

    # What the runners and run_cases ask of a case (GroupNorm's cases, group_norm_check.py, answer the same).
    def inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray | None]:
        return make_inputs(self, rng)

    def reference(self, inputs: dict[str, np.ndarray | None]) -> np.ndarray:
        return reference(self, inputs)

    def compare(self, got: np.ndarray, want: np.ndarray) -> str | None:
        return compare(self, got, want)

    def offset_of(self, name: str) -> int:
        return _offset(self, name)

    def launch(self, harness: Harness, pointers: dict[str, int | None], stream: int = 0, device: int = -1) -> None:
        launch(harness, self, pointers, stream, device)


def build_cases(quick: bool = False) -> list[Case]:
    """Row lengths reach every kernel variant: vector units in registers (1 to 4 per thread, 8 to 1024 threads per
    row), the re-read kernel beyond 4096 units, and scalar units for odd lengths and misaligned tensors."""
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


def make_inputs(case: Case, rng: np.random.Generator) -> dict[str, np.ndarray | None]:
    def rand(shape: tuple[int, ...], elem: int, scale: float, loc: float = 0.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(np_dtype(elem))

    mod_rows = 1 if case.shared else case.samples
    return {
        "x": rand((case.samples, case.rows_per_sample, case.cols), case.x_type, 2.0, 3.0),
        "scale": rand((case.cols,), case.ptype, 0.5, 1.0) if case.affine else None,
        "bias": rand((case.cols,), case.ptype, 0.5) if case.affine and not case.rms else None,
        "mod_scale": rand((mod_rows, case.cols), case.ptype, 0.5),
        "mod_shift": rand((mod_rows, case.cols), case.ptype, 0.5),
    }


def reference(case: Case, inputs: dict[str, np.ndarray | None]) -> np.ndarray:
    attrs = NormAttributes(normalized_type=case.rounding, multiply_type=case.rounding, output_type=case.output_type)
    return modulated_norm(
        inputs["x"], inputs["scale"], inputs["bias"], inputs["mod_scale"], inputs["mod_shift"], attrs, rms=case.rms
    )


def compare(case: Case, got: np.ndarray, want: np.ndarray) -> str | None:
    tol = TOLERANCE[case.y_type]
    g, w = got.astype(np.float64), want.astype(np.float64)
    bad = ~np.isclose(g, w, rtol=tol, atol=tol, equal_nan=True)
    if not bad.any():
        return None
    i = np.unravel_index(int(np.argmax(bad)), bad.shape)
    return f"{int(bad.sum())} of {bad.size} elements differ; first at {tuple(map(int, i))}: got {g[i]}, want {w[i]}"


def launch(harness: Harness, case: Case, pointers: dict[str, int | None], stream: int = 0, device: int = -1) -> None:
    """One case through LaunchNorm as the modulated row op (custom_ops/src/cuda/modulated_launch.h)."""
    has_parameters = pointers["scale"] is not None or pointers["bias"] is not None
    harness.launch(
        x=pointers["x"], y=pointers["y"], rows=case.samples * case.rows_per_sample, cols=case.cols,
        x_type=case.x_type, y_type=case.y_type, stream=stream, scale=pointers["scale"], bias=pointers["bias"],
        scale_size=case.cols if has_parameters else 0, scale_type=case.ptype, rms=case.rms,
        normalized_type=case.rounding, multiply_type=case.rounding, device=device, row_op="Modulated",
        op_inputs=(pointers["mod_scale"], pointers["mod_shift"]),  # modulated_launch.h: ModScale, ModShift
        op_ints=(1 if case.shared else case.samples, case.rows_per_sample),  # mod_batch, rows_per_sample
    )  # fmt: skip


def _offset(case: Case, name: str) -> int:
    # Misaligned: X on a 16-byte boundary plus one element, the others on two: scalar units, every access checked.
    return case.offset + (1 + (name != "x") if case.misaligned else 0)


class HostRunner:
    """Host memory, for the CPU emulator: every tensor in a buffer with guard bands (NaN) around it."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.kernels: dict[str, int] = {}

    @staticmethod
    def _buffer(count: int, dtype: np.dtype, offset: int) -> tuple[np.ndarray, np.ndarray]:
        buf, view = HostHarnessBackend._aligned(count, dtype, offset)
        buf[...] = np.asarray(np.nan, np.float32).astype(dtype)
        return buf, view

    def run(self, case: Any, inputs: dict[str, np.ndarray | None]) -> np.ndarray:
        keep, pointers = [], {}
        for name, a in inputs.items():
            if a is None:
                pointers[name] = None
                continue
            buf, view = self._buffer(a.size, a.dtype, case.offset_of(name))
            view[...] = a.reshape(-1)
            keep.append(buf)
            pointers[name] = view.ctypes.data
        shape = inputs["x"].shape
        y_buf, y = self._buffer(math.prod(shape), np_dtype(case.y_type), case.offset_of("y"))
        pointers["y"] = y.ctypes.data
        case.launch(self.harness, pointers)
        kernel = self.harness.last_kernel()
        if kernel:
            self.kernels[kernel.rsplit(" group=", 1)[0]] = self.kernels.get(kernel.rsplit(" group=", 1)[0], 0) + 1
        start = (y.ctypes.data - y_buf.ctypes.data) // y_buf.itemsize
        outside = np.concatenate([y_buf[:start], y_buf[start + y.size :]]).astype(np.float32)
        if not np.isnan(outside).all():
            raise RuntimeError("the kernel wrote outside Y")
        return y.reshape(shape).copy()


class TorchRunner:
    """torch CUDA tensors (the GPU check): inputs copied to the device at the case's offsets, Y guarded."""

    def __init__(self, harness: Harness) -> None:
        import torch

        self.torch = torch
        self.harness = harness
        self.kernels: dict[str, int] = {}

    def _device(self, a: np.ndarray, offset: int) -> tuple[Any, Any]:
        torch = self.torch
        flat = a.reshape(-1).view(np.uint16) if a.dtype.itemsize == 2 else a.reshape(-1).view(np.uint32)
        host = torch.from_numpy(flat.astype(flat.dtype).view(np.int16 if a.dtype.itemsize == 2 else np.int32))
        buf = torch.empty(offset + a.size + GUARD, dtype=host.dtype, device="cuda")
        buf[offset : offset + a.size].copy_(host)
        return buf, buf[offset:]

    def run(self, case: Any, inputs: dict[str, np.ndarray | None]) -> np.ndarray:
        torch = self.torch
        keep, pointers = [], {}
        for name, a in inputs.items():
            if a is None:
                pointers[name] = None
                continue
            buf, view = self._device(a, case.offset_of(name))
            keep.append(buf)
            pointers[name] = view.data_ptr()
        shape = inputs["x"].shape
        count = math.prod(shape)
        y_dtype = np_dtype(case.y_type)
        sentinel = np.full(count + 2 * GUARD + 2, np.nan, np.float32).astype(y_dtype)
        y_buf, _ = self._device(sentinel, 0)
        offset = GUARD + case.offset_of("y")
        pointers["y"] = y_buf[offset:].data_ptr()
        case.launch(self.harness, pointers, stream=torch.cuda.current_stream().cuda_stream, device=0)
        torch.cuda.synchronize()
        raw = y_buf.cpu().numpy()
        values = raw.view(np.uint16 if y_dtype.itemsize == 2 else np.uint32).view(y_dtype)
        outside = np.concatenate([values[:offset], values[offset + count :]]).astype(np.float32)
        if not np.isnan(outside).all():
            raise RuntimeError("the kernel wrote outside Y")
        return values[offset : offset + count].reshape(shape).copy()


def cuda_include() -> Path | None:
    return find_cuda_include(find_nvcc(None))


def run_cases(runner: Any, cases: list[Any]) -> list[str]:
    """Each case (any op's: inputs, reference, compare, launch, offset_of) through `runner`; the failures."""
    failures = []
    for i, case in enumerate(cases):
        inputs = case.inputs(np.random.default_rng(i))
        try:
            got = runner.run(case, inputs)
        except RuntimeError as exc:
            failures.append(f"{case.name()}: {exc}")
            continue
        problem = case.compare(got, case.reference(inputs))
        if problem:
            failures.append(f"{case.name()}: {problem}")
    return failures


class _CannotRun(Exception):
    """What this machine lacks for the chosen mode (exit 2, one line)."""


def _emulator_runner() -> Any:
    include = cuda_include()
    if include is None or shutil.which("g++") is None:
        raise _CannotRun("--emulate needs the CUDA headers (cuda_fp16.h) and g++")
    return HostRunner(Harness(build_emulator(include, Path(tempfile.mkdtemp(prefix="onnx_norm_modulated_")))))


def _gpu_runner(arch: str) -> Any:
    try:
        import torch
    except ImportError:
        raise _CannotRun("--gpu needs torch") from None
    if not torch.cuda.is_available():
        raise _CannotRun("--gpu needs a CUDA GPU (torch.cuda.is_available() is False)")
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).is_file():
        raise _CannotRun("--gpu needs nvcc")
    # Every kernel, as gpu_check builds them (spills are the build's check: tools/check_spills.sh).
    library = build_harness(nvcc, arch, Path(tempfile.mkdtemp(prefix="onnx_norm_modulated_")))
    return TorchRunner(Harness(library))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--emulate", action="store_true", help="run the kernel's source in the CPU emulator")
    mode.add_argument("--gpu", action="store_true", help="build with nvcc and run on the GPU (needs torch)")
    parser.add_argument("--quick", action="store_true", help="fewer row lengths")
    parser.add_argument("--arch", default="90", help="--gpu: the architecture to build for (default 90)")
    args = parser.parse_args(argv)
    cases = build_cases(args.quick)
    try:
        runner = _emulator_runner() if args.emulate else _gpu_runner(args.arch)
    except (_CannotRun, RuntimeError) as exc:  # RuntimeError: a failed build, with the compiler's output
        print(f"modulated_check: cannot run: {exc}", file=sys.stderr)
        return 2
    failures = run_cases(runner, cases)
    for failure in failures:
        print(f"FAIL {failure}")
    kernels = ", ".join(f"{k} x{n}" for k, n in sorted(runner.kernels.items()))
    print(f"{len(cases)} cases, {len(failures)} failures" + (f"; kernels: {kernels}" if kernels else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
