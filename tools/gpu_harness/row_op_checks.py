#!/usr/bin/env python3
"""Checks the CUDA kernels of the row ops (the ops launched through `LaunchRowOp`, each with a check module listed in
`CHECKS`) against their op records' float64 references.

    python tools/gpu_harness/row_op_checks.py --emulate      # no GPU: the kernels' real source in the CPU emulator
    python tools/gpu_harness/row_op_checks.py --gpu --op OP  # a GPU, nvcc and torch: the kernels themselves (OP: a
                                                             # check module's name without `_check`; default: all)

The machinery every op's cases share: the host and torch runners (each tensor at the case's offset, guard bands
around Y that must stay untouched), the case loop, the tolerance, the reference call through the op record
(`onnx_norm.ops.schema.OPS`), and this command line. Each op brings a module `<op>_check.py` beside this one with
its cases only (`Case`, `build_cases`); a case answers what the loop asks (`RowOpCase`). `CHECKS` lists the modules,
one line per op: `tools/gpu_check.py` runs each one on the GPU and in its --self-test, and so does this command
(`--emulate` also reports which kernel variants the cases reached). Exits 1 on a mismatch, 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for _path in (REPO, REPO / "tools" / "gpu_harness"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gpu_backends import HostHarnessBackend  # noqa: E402
from gpu_build import Harness, build_emulator, build_harness, find_cuda_include, find_nvcc  # noqa: E402
from gpu_cases import BF16, F16, F32, GUARD, TYPE_NAMES  # noqa: E402

from onnx_norm.ops.numerics import np_dtype  # noqa: E402
from onnx_norm.ops.schema import OPS  # noqa: E402

__all__ = [
    "BF16", "CHECKS", "F16", "F32", "TOLERANCE", "TYPE_NAMES", "Harness", "HostRunner", "ModuleResult", "RowOpCase",
    "TorchRunner",
    "check_module", "cuda_include", "load", "main", "record_reference", "run_cases", "within_tolerance",
]  # fmt: skip

#: The row ops' check modules (tools/gpu_harness/<name>.py), one line per op; a new op adds its line here.
CHECKS: tuple[str, ...] = (
    "modulated_check",
    "group_norm_check",
    "l2_norm_check",
    "gated_norm_check",
)

# About one unit in the last place of Y's type (float32 statistics vs the float64 reference; two where a rounding
# step can tie the other way).
TOLERANCE = {F32: 3e-5, F16: 4e-3, BF16: 3.2e-2}


class RowOpCase(Protocol):
    """What the runners and `run_cases` ask of a case. Inputs are keyed by the op record's input names in snake
    case (`Scale` -> `scale`, `InputName` -> `input_name`), which are also the names of the pointers that `launch`
    reads (None: not given)."""

    @property
    def y_type(self) -> int: ...

    def name(self) -> str: ...

    def inputs(self, rng: np.random.Generator) -> dict[str, np.ndarray | None]: ...

    def reference(self, inputs: dict[str, np.ndarray | None]) -> np.ndarray: ...

    def compare(self, got: np.ndarray, want: np.ndarray) -> str | None: ...

    def offset_of(self, name: str) -> int: ...

    def launch(self, harness: Harness, pointers: dict[str, int | None], stream: int = 0, device: int = -1) -> None: ...


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def record_reference(op: str, inputs: dict[str, np.ndarray | None], **attributes: int | float) -> np.ndarray:
    """Y of the op record's float64 reference (`OPS[op].reference`) for `inputs` keyed as `RowOpCase` keys them."""
    record = OPS[op]
    names = {_snake(name): name for name in record.inputs}
    stray = sorted(key for key, value in inputs.items() if value is not None and key not in names)
    if stray:
        raise ValueError(f"{op} has no input {', '.join(stray)} (its inputs: {', '.join(record.inputs)})")
    return record.reference(*(inputs.get(key) for key in names), **attributes)[0]


def within_tolerance(y_type: int, got: np.ndarray, want: np.ndarray) -> str | None:
    """None if `got` equals `want` within `TOLERANCE[y_type]` (NaN where NaN), else what differs and where first."""
    tol = TOLERANCE[y_type]
    g, w = got.astype(np.float64), want.astype(np.float64)
    bad = ~np.isclose(g, w, rtol=tol, atol=tol, equal_nan=True)
    if not bad.any():
        return None
    i = np.unravel_index(int(np.argmax(bad)), bad.shape)
    return f"{int(bad.sum())} of {bad.size} elements differ; first at {tuple(map(int, i))}: got {g[i]}, want {w[i]}"


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

    def run(self, case: RowOpCase, inputs: dict[str, np.ndarray | None]) -> np.ndarray:
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
            # The variant without its group size: one count per kernel variant.
            variant = kernel.rsplit(" group=", 1)[0]
            self.kernels[variant] = self.kernels.get(variant, 0) + 1
        start = (y.ctypes.data - y_buf.ctypes.data) // y_buf.itemsize
        outside = np.concatenate([y_buf[:start], y_buf[start + y.size :]]).astype(np.float32)
        if not np.isnan(outside).all():
            raise RuntimeError("the kernel wrote outside Y")
        return y.reshape(shape).copy()


class TorchRunner:
    """torch tensors on `device` (the GPU check: "cuda"): inputs copied at the case's offsets, Y guarded. With
    `captured_over`, the launch is captured in a CUDA graph (torch's strictest capture mode) over buffers holding
    those inputs, then the case's inputs are written into the same buffers and the graph replayed."""

    def __init__(self, harness: Harness, device: str = "cuda") -> None:
        import torch

        self.torch = torch
        self.harness = harness
        self.device = device
        self.kernels: dict[str, int] = {}

    def _host(self, a: np.ndarray) -> Any:
        """`a`'s bits as a torch integer tensor of the same element size (torch lacks some of numpy's types)."""
        flat = a.reshape(-1).view(np.uint16) if a.dtype.itemsize == 2 else a.reshape(-1).view(np.uint32)
        return self.torch.from_numpy(flat.astype(flat.dtype).view(np.int16 if a.dtype.itemsize == 2 else np.int32))

    def _device(self, a: np.ndarray, offset: int, guard: int = GUARD) -> tuple[Any, Any]:
        """`a` at `offset` in a new buffer with `guard` elements after it (neither written: not for Y, whose
        buffer is its sentinel whole, guards included, written with guard=0)."""
        host = self._host(a)
        buf = self.torch.empty(offset + a.size + guard, dtype=host.dtype, device=self.device)
        buf[offset : offset + a.size].copy_(host)
        return buf, buf[offset:]

    def run(
        self,
        case: RowOpCase,
        inputs: dict[str, np.ndarray | None],
        captured_over: dict[str, np.ndarray | None] | None = None,
    ) -> np.ndarray:
        torch = self.torch
        keep, pointers, views = [], {}, {}
        for name, a in (captured_over or inputs).items():
            if a is None:
                pointers[name] = None
                continue
            buf, views[name] = self._device(a, case.offset_of(name))
            keep.append(buf)
            pointers[name] = views[name].data_ptr()
        shape = inputs["x"].shape
        count = math.prod(shape)
        y_dtype = np_dtype(case.y_type)
        sentinel = np.full(count + 2 * GUARD + 2, np.nan, np.float32).astype(y_dtype)
        y_buf, _ = self._device(sentinel, 0, guard=0)  # every element outside Y a NaN, none left unwritten
        offset = GUARD + case.offset_of("y")
        pointers["y"] = y_buf[offset:].data_ptr()
        if captured_over is None:
            case.launch(self.harness, pointers, stream=torch.cuda.current_stream().cuda_stream, device=0)
        else:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # nothing runs here: Y stays the sentinel until the replay
                case.launch(self.harness, pointers, stream=torch.cuda.current_stream().cuda_stream, device=0)
            for name, a in inputs.items():
                if a is not None:
                    views[name][: a.size].copy_(self._host(a))
            graph.replay()
        torch.cuda.synchronize()
        raw = y_buf.cpu().numpy()
        values = raw.view(np.uint16 if y_dtype.itemsize == 2 else np.uint32).view(y_dtype)
        outside = np.concatenate([values[:offset], values[offset + count :]]).astype(np.float32)
        if not np.isnan(outside).all():
            raise RuntimeError("the kernel wrote outside Y")
        return values[offset : offset + count].reshape(shape).copy()


def cuda_include() -> Path | None:
    return find_cuda_include(find_nvcc(None))


def run_cases(runner: HostRunner | TorchRunner, cases: list[Any], captured: bool = False) -> list[str]:
    """Each case (a `RowOpCase`) through `runner`; the failures, one line each. `captured` (TorchRunner only, after
    the eager runs, which set the kernels' attributes): each launch captured in a CUDA graph over another draw of
    the case's inputs and replayed on these, so a launch that a capture refuses, or a replay that does not compute
    the new inputs' result, is a failure."""
    failures = []
    prefix = "capture " if captured else ""
    for i, case in enumerate(cases):
        inputs = case.inputs(np.random.default_rng(i))
        over = case.inputs(np.random.default_rng(10_000 + i)) if captured else None
        try:
            got = runner.run(case, inputs, captured_over=over) if captured else runner.run(case, inputs)
        except Exception as exc:  # the launch, the guard bands or torch's capture: reported, the loop goes on
            failures.append(f"{prefix}{case.name()}: {type(exc).__name__}: {exc}")
            continue
        problem = case.compare(got, case.reference(inputs))
        if problem:
            failures.append(f"{prefix}{case.name()}: {problem}")
    return failures


def load(name: str) -> ModuleType:
    """The check module `name` of `CHECKS` (imported when used: it imports this module)."""
    return importlib.import_module(name)


@dataclasses.dataclass(frozen=True)
class ModuleResult:
    """What `check_module` found: the number of cases, the failures (`[<label>] <case>: <problem>`) and the summary
    line, `<label> cases: N, F failures (S s), <kernel variant> xK, ...` (what gpu_check prints and writes)."""

    cases: int
    failures: list[str]
    summary: str


def check_module(name: str, harness: Harness, on_gpu: bool, quick: bool = False) -> ModuleResult:
    """The cases of check module `name` through `harness`: torch tensors on the GPU, or host memory in the CPU
    emulator."""
    runner = TorchRunner(harness) if on_gpu else HostRunner(harness)
    cases = load(name).build_cases(quick)
    started = time.perf_counter()
    label = name.removesuffix("_check")
    failures = [f"[{label}] {failure}" for failure in run_cases(runner, cases)]
    captured = ""
    if on_gpu:
        failures += [f"[{label}] {failure}" for failure in run_cases(runner, cases, captured=True)]
        captured = ", each also captured in a CUDA graph and replayed on new inputs"
    seconds = time.perf_counter() - started
    kernels = "".join(f", {k} x{n}" for k, n in sorted(runner.kernels.items()))
    summary = f"{label} cases: {len(cases)}{captured}, {len(failures)} failures ({seconds:.0f} s){kernels}"
    return ModuleResult(len(cases), failures, summary)


class _CannotRun(Exception):
    """What this machine lacks for the chosen mode (exit 2, one line)."""


def _emulator(build_dir: Path) -> Harness:
    include = cuda_include()
    if include is None or shutil.which("g++") is None:
        raise _CannotRun("--emulate needs the CUDA headers (cuda_fp16.h) and g++")
    return Harness(build_emulator(include, build_dir))


def _gpu(arch: str, build_dir: Path) -> Harness:
    try:
        import torch
    except ImportError:
        raise _CannotRun("--gpu needs torch") from None
    if not torch.cuda.is_available():
        raise _CannotRun("--gpu needs a CUDA GPU (torch.cuda.is_available() is False)")
    nvcc = find_nvcc(None)
    if nvcc is None:
        raise _CannotRun("--gpu needs nvcc")
    # Every kernel, as gpu_check builds them (spills are the build's check: tools/check_spills.sh).
    return Harness(build_harness(nvcc, arch, build_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--emulate", action="store_true", help="run the kernels' source in the CPU emulator")
    mode.add_argument("--gpu", action="store_true", help="build with nvcc and run on the GPU (needs torch)")
    labels = [name.removesuffix("_check") for name in CHECKS]
    parser.add_argument("--op", action="append", choices=labels, help="only this op's cases (repeatable; default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer cases")
    parser.add_argument("--arch", default="90", help="--gpu: the architecture to build for (default 90)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="onnx_norm_row_ops_") as build_dir:
        try:
            harness = _emulator(Path(build_dir)) if args.emulate else _gpu(args.arch, Path(build_dir))
        except (_CannotRun, RuntimeError) as exc:  # RuntimeError: a failed build, with the compiler's output
            print(f"row_op_checks: cannot run: {exc}", file=sys.stderr)
            return 2
        failed = False
        for name in CHECKS:
            if args.op and name.removesuffix("_check") not in args.op:
                continue
            result = check_module(name, harness, on_gpu=args.gpu, quick=args.quick)
            for failure in result.failures:
                print(f"FAIL {failure}")
            print(result.summary)
            failed = failed or bool(result.failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
