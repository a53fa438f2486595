#!/usr/bin/env python3
"""Checks the CUDA norm kernels on a machine with an NVIDIA GPU and measures their bandwidth.

One prepared command (no network; as long as --budget allows; `tools/device/run_gpu.sh kernels` runs it):

1. builds `tools/gpu_harness/harness.cu` with `custom_ops/src/cuda/*.cu` into a small shared library with the
   machine's nvcc, for the GPU's own architecture (or reuses the one in --build-dir built from the same sources,
   as tools/device/prepare.sh makes it ahead), and loads it with ctypes;
2. captures one launch of every kernel path in a CUDA graph (torch's strictest capture mode) and replays it on
   new inputs; a failed capture is reported and the timings fall back to CUDA events around eager launches;
3. runs every op x X type x hidden size (1 to 262144, odd sizes), the rounding attributes, Scale/Y types,
   broadcast Scale, Skip and statistics outputs, special values, unaligned tensors, Sum written over X or Skip
   (in place) and 1 to 70000 rows through `LaunchNorm` on torch tensors (on a side stream, inside guard bands
   that must stay untouched), and compares each output with `onnx_norm/ops/reference.py`;
4. measures each kernel's effective bandwidth (bytes read + written / median time, CUDA-graph replays, inputs
   rotated to defeat L2) against a device-to-device copy of the same bytes, torch's kernels and a
   one-row-per-program Triton kernel, until --budget seconds have passed (goal shapes first), then for 30 s
   the launch with clusters allowed and off across the launcher's cluster thresholds;
5. where onnxruntime-gpu and the built `onnx_norm` library are installed, runs a subset through ONNX Runtime's
   CUDA provider (confirming from the profile that our node ran on CUDA) and times our ops against ONNX
   Runtime's own LayerNorm/SkipLayerNorm/SimplifiedLayerNorm kernels, CUDA graphs off and on.

Tables go to stdout and, with --out (default $OUT), to gpu_check.md and gpu_check.json there.
Exits 1 on any mismatch or failed check, 2 when it cannot run (no GPU, no nvcc, build failure).
`--self-test` runs the parts that need no GPU (case list, reference comparisons against a fake backend, every
case through the CPU emulator of the kernels, the ORT comparison on the CPU provider, the harness build);
`--plan` prints the launch configuration per op x dtype x shape for an H200 (docs/cuda_kernels.md).

This file runs the checks, the capture, the launch plan and the results; its parts are modules of
tools/gpu_harness: gpu_cases.py (cases, inputs, reference, comparison), gpu_build.py (nvcc and emulator builds, the
ctypes binding of harness.cu), gpu_backends.py (torch, emulator and fake backends), gpu_ort.py (ONNX Runtime) and
gpu_bandwidth.py (the bandwidth table); each row op's cases are its own check module's, which row_op_checks.py lists
(`CHECKS`, one line per op) and runs (`check_row_ops` here runs each one).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Runs from a checkout without `pip install`: the reference and schema are plain Python; the check's own modules
# are in tools/gpu_harness.
for _path in (REPO, REPO / "tools" / "gpu_harness"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import row_op_checks  # noqa: E402
from gpu_backends import FakeBackend, HostHarnessBackend, TorchHarnessBackend  # noqa: E402
from gpu_bandwidth import (  # noqa: E402
    BENCH_HEADER,
    BENCH_NOTE,
    CLUSTER_SWEEP,
    SWEEP_HEADER,
    SWEEP_NOTE,
    bench,
    bytes_moved,
    cluster_sweep,
    format_table,
)
from gpu_build import (  # noqa: E402
    Harness,
    build_emulator,
    build_harness,
    find_cuda_include,
    find_nvcc,
    harness_origin,
)
from gpu_cases import (  # noqa: E402
    BENCH_SHAPES,
    BF16,
    EMULATED_DEVICES,
    F16,
    F32,
    FLOAT_TYPES,
    IN_PLACE,
    OPS,
    SIGNATURES,
    TYPE_NAMES,
    Case,
    Inputs,
    _default_case,
    build_cases,
    check_case,
    device_cases,
    make_inputs,
    requested_outputs,
)
from gpu_ort import (  # noqa: E402
    ORT_HEADER,
    ORT_NOTE,
    ORT_SHAPES,
    OrtBackend,
    compare_with_ort_kernels,
    ort_cases,
)

# What tests/kernels/test_cuda_build.py takes from this module (defined in the gpu_* modules of tools/gpu_harness, or
# below).
__all__ = [
    "BF16", "F16", "F32", "IN_PLACE", "OPS", "PLAN_SHAPES", "FakeBackend", "Harness", "HostHarnessBackend", "Outcome",
    "_default_case", "build_cases", "build_emulator", "build_harness", "bytes_moved", "device_cases",
    "find_cuda_include", "find_nvcc", "launch_plan", "main", "requested_outputs", "run_cases",
]  # fmt: skip

# --------------------------------------------------------------------------------------------- running checks


@dataclasses.dataclass
class Outcome:
    checked: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    quiet: bool = False

    def fail(self, what: str) -> None:
        self.failures.append(what)
        if not self.quiet:
            print(f"FAIL {what}", flush=True)


def check_row_ops(harness: Harness, on_gpu: bool, quick: bool, outcome: Outcome) -> list[str]:
    """The cases of every row op's check module (`row_op_checks.CHECKS`) through `harness`: torch tensors on the
    GPU, or host memory in the CPU emulator. Failures go to `outcome`; returns one summary line per module."""
    lines = []
    for name in row_op_checks.CHECKS:
        result = row_op_checks.check_module(name, harness, on_gpu, quick)
        outcome.checked += result.cases - len(result.failures)
        for failure in result.failures:
            outcome.fail(failure)
        lines.append(result.summary)
    return lines


def run_cases(backend: Any, cases: list[Case], label: str, outcome: Outcome) -> None:
    for index, case in enumerate(cases):
        inputs = make_inputs(case, seed=index)
        try:
            got = backend.run(case, inputs)
        except Exception as exc:  # every failure is reported, then the run goes on
            outcome.fail(f"[{label}] {case.name()}: {type(exc).__name__}: {exc}")
            continue
        # A backend running the CPU kernels (ONNX Runtime's CPU provider in --self-test) normalises the float32 Sum.
        problems = check_case(case, inputs, got, rounded_sum=getattr(backend, "rounded_sum", True))
        outcome.checked += 1
        for problem in problems:
            outcome.fail(f"[{label}] {case.name()}: {problem}")


# One capture per kernel path: register rows, shared-memory cache, a wide row over a cluster (with clusters off:
# re-read), a decode row over a cluster (off: register rows). The last field: clusters allowed.
CAPTURE_CASES = (
    ("SkipLayerNorm", F16, (64, 4096), True),
    ("LayerNorm", F32, (3, 20000), True),
    ("SkipRMSNorm", F32, (2, 70001), True),
    ("SkipRMSNorm", F32, (2, 70001), False),
    ("RMSNorm", BF16, (1, 4096), True),
    ("RMSNorm", BF16, (1, 4096), False),
)


def _capture_one(
    backend: TorchHarnessBackend, op: str, x_type: int, shape: tuple[int, int], clusters: bool = True
) -> list[str]:
    """One launch captured in a CUDA graph, replayed after new inputs were written: the mismatches."""
    torch = backend.torch
    case = _default_case(op, x_type, shape)
    inputs = make_inputs(case, seed=1234)
    x = backend.to_device(inputs.x)
    skip = backend.to_device(inputs.skip) if inputs.skip is not None else None
    scale = backend.to_device(inputs.scale)
    bias = backend.to_device(inputs.bias) if inputs.bias is not None else None
    y = torch.empty(case.shape, dtype=backend._torch_types[x_type], device=backend.device)
    s = torch.empty_like(y) if skip is not None else None

    def launch() -> None:
        backend.harness.launch(
            x=x.data_ptr(), y=y.data_ptr(), rows=case.rows, cols=case.cols, x_type=x_type, y_type=x_type,
            stream=torch.cuda.current_stream(backend.device).cuda_stream,
            skip=skip.data_ptr() if skip is not None else None, scale=scale.data_ptr(),
            bias=bias.data_ptr() if bias is not None else None, sum_out=s.data_ptr() if s is not None else None,
            scale_size=case.cols, scale_type=x_type, rms=case.rms, device=backend.device.index, clusters=clusters,
        )  # fmt: skip

    graph = torch.cuda.CUDAGraph()
    warm = torch.cuda.Stream(device=backend.device)
    warm.wait_stream(torch.cuda.current_stream(backend.device))
    with torch.cuda.stream(warm):
        launch()
    torch.cuda.current_stream(backend.device).wait_stream(warm)
    with torch.cuda.graph(graph):
        launch()
    fresh = make_inputs(case, seed=4321)
    x.copy_(backend.to_device(fresh.x))
    if skip is not None:
        skip.copy_(backend.to_device(fresh.skip))
    graph.replay()
    torch.cuda.synchronize(backend.device)
    got = {"Y": backend.to_host(y)}
    if s is not None:
        got["Sum"] = backend.to_host(s)
    checked = dataclasses.replace(case, outputs=s is not None)
    return check_case(checked, Inputs(fresh.x, fresh.skip, inputs.scale, inputs.bias), got)


def check_graph_capture(backend: TorchHarnessBackend, outcome: Outcome) -> tuple[bool, str]:
    """LaunchNorm inside torch.cuda.graph capture (torch's default "global" mode, the strictest): a launch
    that queried the stream, allocated or synchronised would invalidate the capture. Each replay must follow
    new input values. Returns (all captured, one line saying what happened) and records failures."""
    failed = []
    for op, x_type, shape, clusters in CAPTURE_CASES:
        name = _default_case(op, x_type, shape).name() + ("" if clusters else " no-cluster")
        try:
            problems = _capture_one(backend, op, x_type, shape, clusters)
            outcome.checked += 1
        except Exception as exc:  # reported, then the run goes on without graphs
            problems = [f"capture/replay failed: {type(exc).__name__}: {exc}"]
            backend.torch.cuda.synchronize(backend.device)
        for problem in problems:
            outcome.fail(f"[graph] {name}: {problem}")
        if problems:
            failed.append(name)
    if failed:
        return False, f"CUDA graph capture FAILED for {', '.join(failed)}; timings fall back to CUDA events"
    return True, f"CUDA graph capture: {len(CAPTURE_CASES)} kernel paths captured and replayed with new inputs"


def check_other_device(harness: Harness, outcome: Outcome) -> None:
    """With two GPUs: a stream on device 1 while device 0 is current (two CUDA runtimes share a process)."""
    import torch

    if torch.cuda.device_count() < 2:
        print("(one GPU: the check of a launch on device 1 while device 0 is current needs two and was skipped)")
        return
    torch.cuda.set_device(0)
    backend = TorchHarnessBackend(harness, device=1)
    case = _default_case("RMSNorm", BF16, (33, 4096))
    run_cases(backend, [case], "device1", outcome)


# --------------------------------------------------------------------------------------------- launch plan

PLAN_SHAPES = (
    (1, 4096), (64, 4096), (8192, 768), (8192, 4096), (32768, 1024), (4096, 16384), (2048, 32768),
    (1024, 65536), (256, 262144), (65536, 128),
)  # fmt: skip
H200_SMS = 132


def launch_plan(library: Path, shapes: Iterable[tuple[int, int]] = PLAN_SHAPES, sms: int = H200_SMS) -> list[list[str]]:
    """Rows of (op, dtype, shape, MB moved, kernel, vectors per thread, blocks per row (a cluster), threads per
    row in each block, block, grid, dynamic shared memory per block) as LaunchNorm chooses them for a GPU of `sms`
    SMs: the real launcher, run by the CPU emulator in plan-only mode (it reads no tensor). Loads a private copy
    of the emulator library, whose per-device attribute cache then holds `sms`."""
    with tempfile.TemporaryDirectory(prefix="onnx_norm_plan_") as scratch:
        private = Path(scratch) / "libonnx_norm_plan.so"
        shutil.copyfile(library, private)
        harness = Harness(private)  # loaded: the mapping outlives the file, which goes with the folder
    harness._lib.onnx_norm_emulator_plan_only(ctypes.c_int(sms))
    harness._lib.onnx_norm_emulator_last_launch.restype = ctypes.c_char_p
    base = 1 << 32  # 256-byte aligned fake addresses, never read
    rows = []
    for op in OPS:
        for dtype in FLOAT_TYPES:
            size = 4 if dtype == F32 else 2
            for n_rows, cols in shapes:
                span = n_rows * cols * size + 4096
                skip_op, rms = SIGNATURES[op].skip, SIGNATURES[op].rms
                harness.launch(
                    x=base, y=base + 2 * span, rows=n_rows, cols=cols, x_type=dtype, y_type=dtype, stream=0,
                    skip=base + span if skip_op else None, sum_out=base + 3 * span if skip_op else None,
                    scale=base + 4 * span, bias=None if rms else base + 5 * span, scale_size=cols,
                    scale_type=dtype, rms=rms, device=0,
                )  # fmt: skip
                kernel = harness.last_kernel() or "?"
                launch = dict(
                    item.split("=") for item in harness._lib.onnx_norm_emulator_last_launch().decode().split()
                )
                fields = dict(item.split("=") for item in kernel.split()[1:])
                smem = f"{int(launch['shared']) / 1024:.0f} KiB" if int(launch["shared"]) else "-"
                rows.append([
                    op, TYPE_NAMES[dtype], f"{n_rows}x{cols}", f"{bytes_moved(op, size, n_rows, cols) / 1e6:.2f}",
                    kernel.split()[0], fields.get("vpt", "-"), launch["cluster"], fields.get("group", launch["block"]),
                    launch["block"], launch["grid"], smem,
                ])  # fmt: skip
    return rows


PLAN_HEADER = [
    "op", "dtype", "shape", "MB moved", "kernel", "vectors/thread", "blocks/row", "threads/block/row", "block", "grid",
    "smem/block",
]  # fmt: skip


# --------------------------------------------------------------------------------------------- results


class Results:
    """What the run found, printed as it goes and, with --out, written as markdown and JSON files there."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.sections: list[tuple[str, str]] = []
        self.data: dict[str, Any] = {}
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.sections.append(("", line))
        self.write()  # as it goes: a run killed at its timeout still leaves what it found

    def table(self, title: str, header: list[str], rows: list[list[str]], note: str = "") -> None:
        print(f"\n{title}\n{format_table(header, rows)}\n{note}", flush=True)
        self.sections.append((title, format_table(header, rows, markdown=True) + (f"\n\n{note}" if note else "")))
        self.data[title] = [dict(zip(header, row, strict=True)) for row in rows]
        self.write()

    def write(self) -> None:
        if self.out is None:
            return
        text = []
        for title, body in self.sections:
            text.append(f"\n## {title}\n\n{body}\n" if title else body)
        (self.out / "gpu_check.md").write_text("\n".join(text) + "\n")
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=1))


# --------------------------------------------------------------------------------------------- main


def _check_reference(cases: list[Case]) -> bool:
    """The checker itself: a fake backend that is the reference passes, and one nudged output element per case
    is caught."""
    names = [c.name() for c in cases]
    if len(set(names)) != len(names):
        print("FAIL duplicate case names")
        return False
    exact = Outcome()
    run_cases(FakeBackend(), cases, "fake", exact)
    if exact.failures:
        print(f"FAIL the reference does not match itself in {len(exact.failures)} cases")
        return False
    missed = 0
    for output in ("Y", "Sum", "Mean", "InvStdDev", "InvRMS"):
        subset = [c for c in cases if output in requested_outputs(c) and c.rows > 0]
        caught = Outcome(quiet=True)
        run_cases(FakeBackend(perturb=output), subset, f"nudged {output}", caught)
        caught_names = {f.split("] ", 1)[1].split(": ", 1)[0] for f in caught.failures}
        for case in subset:
            if case.name() not in caught_names:
                missed += 1
                print(f"FAIL a nudged {output} passed the check: {case.name()}")
    print(f"self-test: {len(cases)} cases; the exact fake passes; nudged outputs missed: {missed}")
    return not missed


def _check_through_ort(cases: list[Case]) -> bool:
    """A subset through ONNX Runtime's CPU provider with our library, and ours against ONNX Runtime's own CPU
    kernels; skipped (True) when the library is not built."""
    try:
        import onnx_norm

        library = Path(onnx_norm.get_library_path())
    except Exception as exc:  # not built or not installed
        print(f"self-test: the onnx_norm library is not available ({exc}); ONNX Runtime path not checked")
        return True
    if not library.is_file():
        return True
    subset = ort_cases(cases, limit=16)
    through_ort = Outcome()
    cpu = OrtBackend("CPUExecutionProvider")
    run_cases(cpu, subset, "ort-cpu", through_ort)
    print(
        f"self-test: {len(subset)} cases through ONNX Runtime (CPU provider, {library.name}): "
        f"{len(through_ort.failures)} failures, {cpu.profiles_checked} profiles read"
    )
    if through_ort.failures:
        return False
    compared = compare_with_ort_kernels("CPUExecutionProvider", ((8, 64),), (F32,), 3, math.inf)
    broken = [row for row in compared if any(cell.startswith("failed") for cell in row)]
    print(f"self-test: ours vs ONNX Runtime's kernels on the CPU provider: {len(compared)} rows, {len(broken)} failed")
    if broken or len(compared) != len(OPS):
        print(format_table(ORT_HEADER, compared))
        return False
    return True


def _run_emulated(backend: HostHarnessBackend, cases: list[Case], label: str) -> bool:
    started = time.perf_counter()
    outcome = Outcome()
    run_cases(backend, cases, label, outcome)
    print(
        f"self-test: {outcome.checked} cases {label}, {len(outcome.failures)} failures "
        f"({time.perf_counter() - started:.0f} s); kernels used: "
        + ", ".join(f"{k} x{n}" for k, n in sorted(backend.kernels.items()))
    )
    return not outcome.failures


def _check_emulated(cases: list[Case], cuda_include: Path, build_dir: Path) -> bool:
    """Every case through the CPU emulator of the kernels (device 0: clusters), then the cases of the other
    emulated devices (no clusters; a small device), then the launch plan."""
    emulator = build_emulator(cuda_include, build_dir)
    backend = HostHarnessBackend(Harness(emulator))
    if not _run_emulated(backend, cases, "through the CPU emulator of the kernels"):
        return False
    for device in (1, 2):
        other = HostHarnessBackend(backend.harness, device=device)
        if not _run_emulated(other, device_cases(device), f"on emulated device {device} ({EMULATED_DEVICES[device]})"):
            return False
    outcome = Outcome()
    for line in check_row_ops(backend.harness, on_gpu=False, quick=True, outcome=outcome):
        print(f"self-test: {line}")
    if outcome.failures:
        return False
    plan = launch_plan(emulator)
    print(f"self-test: launch plan for an H200, {len(plan)} rows (python tools/gpu_check.py --plan)")
    return True


def self_test(nvcc: str | None, build_dir: Path, emulate: bool = True) -> int:
    """The parts that need no GPU: the case list, the reference comparisons (a fake backend that is the
    reference must pass; one nudged output element per case must be caught), every case through the CPU
    emulator of the kernels (tools/gpu_harness/emulator.cc), and the harness build with nvcc."""
    cases = build_cases(quick=False)
    if not _check_reference(cases) or not _check_through_ort(cases):
        return 1
    cuda_include = find_cuda_include(nvcc)
    if emulate and cuda_include is not None and shutil.which("g++"):
        if not _check_emulated(cases, cuda_include, build_dir):
            return 1
    elif emulate:
        print("self-test: no CUDA headers or g++, the kernels were not emulated")
    if nvcc is None:
        print("self-test: nvcc not found, harness build not checked")
    else:
        started = time.perf_counter()
        library = build_harness(nvcc, "90", build_dir)
        print(f"self-test: built {library} in {time.perf_counter() - started:.0f} s")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer hidden sizes and layouts (about a minute)")
    parser.add_argument("--no-bench", action="store_true", help="skip the bandwidth table")
    parser.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime even where onnxruntime-gpu is there")
    parser.add_argument("--ort-only", action="store_true", help="only the ONNX Runtime parts (after installing it)")
    parser.add_argument("--nvcc", help="nvcc to build the harness with (default: PATH, CUDA_HOME, /usr/local/cuda)")
    parser.add_argument("--build-dir", type=Path, help="where to build the harness (default: a temporary folder)")
    parser.add_argument("--arch", help="compute capability to build for, e.g. 90 (default: the GPU's)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
        help="folder for gpu_check.md / gpu_check.json (default: $OUT when set, else none)",
    )
    parser.add_argument(
        "--budget", type=float, default=420.0, help="seconds after which the timing tables stop growing (default: 420)"
    )
    parser.add_argument("--self-test", action="store_true", help="check this script without a GPU, then exit")
    parser.add_argument("--no-emulate", action="store_true", help="--self-test without the CPU emulator of the kernels")
    parser.add_argument(
        "--plan", action="store_true", help="print the launch configuration per op x dtype x shape for an H200 (no GPU)"
    )
    return parser.parse_args(argv)


def print_plan(nvcc: str | None, build_dir: Path) -> int:
    cuda_include = find_cuda_include(nvcc)
    if cuda_include is None or not shutil.which("g++"):
        print("--plan needs the CUDA headers and g++ (it runs the launcher in the CPU emulator)")
        return 2
    library = build_emulator(cuda_include, build_dir)
    print(format_table(PLAN_HEADER, launch_plan(library), markdown=True))
    return 0


def run_ort_parts(results: Results, outcome: Outcome, cases: list[Case], deadline: float) -> None:
    why_not = OrtBackend.available()
    if why_not:
        results.say(f"ONNX Runtime CUDA provider: not run ({why_not})")
        return
    ort_backend = OrtBackend()
    before = len(outcome.failures)
    subset = ort_cases(cases)
    run_cases(ort_backend, subset, "ort-cuda", outcome)
    results.say(
        f"ONNX Runtime CUDA provider: {len(subset)} cases, {len(outcome.failures) - before} failures, "
        f"{ort_backend.profiles_checked} profiles show the node on CUDAExecutionProvider"
    )
    rows = compare_with_ort_kernels("CUDAExecutionProvider", ORT_SHAPES, (F16, F32), 50, deadline)
    results.table("Ours vs ONNX Runtime's CUDA kernels", ORT_HEADER, rows, ORT_NOTE)


def environment_line(torch: Any) -> str:
    versions = [f"torch {torch.__version__} (CUDA {torch.version.cuda})"]
    for name in ("triton", "onnxruntime"):
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except Exception:  # not installed, or broken: just not listed
            versions.append(f"{name} -")
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    smi = subprocess.run(query, check=False, capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    driver = smi.stdout.strip() if smi is not None else "?"
    props = torch.cuda.get_device_properties(0)
    return (
        f"GPU: {props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs), driver {driver}, "
        + ", ".join(versions)
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Builds go to --build-dir, or to a folder of this run's that goes with it (the libraries stay loaded).
    with tempfile.TemporaryDirectory(prefix="onnx_norm_gpu_check_") as scratch:
        return run(args, args.build_dir or Path(scratch))


def run(args: argparse.Namespace, build_dir: Path) -> int:
    nvcc = find_nvcc(args.nvcc)
    if args.self_test:
        return self_test(nvcc, build_dir, emulate=not args.no_emulate)
    if args.plan:
        return print_plan(nvcc, build_dir)
    started = time.perf_counter()
    deadline = started + args.budget
    results = Results(args.out)
    try:
        import torch
    except ImportError:
        print("gpu_check needs torch with CUDA")
        return 2
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch: nothing checked")
        return 2
    results.say(environment_line(torch))
    outcome = Outcome()
    cases = build_cases(quick=args.quick)
    if args.ort_only:
        run_ort_parts(results, outcome, cases, deadline)
        return finish(results, outcome, started)
    major, minor = torch.cuda.get_device_capability(0)
    arch = args.arch or f"{major}{minor}"
    try:  # reuses a current build in build_dir (one made ahead by tools/device/prepare.sh)
        library = build_harness(nvcc, arch, build_dir)
    except RuntimeError as exc:
        print(f"harness build failed:\n{exc}")
        return 2
    results.say(f"harness {library} ({harness_origin(library)}) ready in {time.perf_counter() - started:.0f} s")
    harness = Harness(library)
    backend = TorchHarnessBackend(harness)

    captured, capture_line = check_graph_capture(backend, outcome)
    results.say(capture_line)
    run_cases(backend, cases, "harness", outcome)
    for line in check_row_ops(harness, on_gpu=True, quick=args.quick, outcome=outcome):
        results.say(line)
    check_other_device(harness, outcome)
    results.say(
        f"kernels: {outcome.checked} checks over {len(cases)} cases (every op x dtype x shape, layouts, in-place), "
        f"{len(outcome.failures)} failures ({time.perf_counter() - started:.0f} s)"
    )
    if not args.no_bench:
        rows, left_out = bench(backend, BENCH_SHAPES, FLOAT_TYPES, captured, deadline)
        note = BENCH_NOTE + (
            f" {left_out} rows left out: the --budget of {args.budget:.0f} s ran out." if left_out else ""
        )
        results.table("Bandwidth", BENCH_HEADER, [r.cells() for r in rows], note)
        # Then the cluster thresholds, in the 30 s the stage's timeout leaves after the budget.
        sweep = cluster_sweep(backend, captured, max(deadline, time.perf_counter()) + 30)
        left = len(CLUSTER_SWEEP) - len(sweep)
        results.table(
            "Cluster thresholds", SWEEP_HEADER, sweep, SWEEP_NOTE + (f" {left} points left out." if left else "")
        )
    if not args.no_ort:
        run_ort_parts(results, outcome, cases, deadline + 120)
    return finish(results, outcome, started)


def finish(results: Results, outcome: Outcome, started: float) -> int:
    if outcome.failures:
        results.table("Failures", ["failure"], [[f] for f in outcome.failures[:200]])
    results.say(
        f"total {time.perf_counter() - started:.0f} s; "
        + (f"{len(outcome.failures)} FAILURES" if outcome.failures else "all checks passed")
    )
    results.write()
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
