"""The CUDA kernels without a GPU: they compile with nvcc without register spills, the launcher rejects bad
parameters, and the kernel code itself matches the reference when run by the CPU emulator
(tools/gpu_harness/emulator.cc). Running them on a GPU is tools/gpu_check.py's job."""

from __future__ import annotations

import concurrent.futures
import ctypes
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
CUDA_SOURCES = REPO / "custom_ops" / "src" / "cuda"


def _load_gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "tools" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_check = _load_gpu_check()
NVCC = gpu_check.find_nvcc(None)
CUDA_INCLUDE = gpu_check.find_cuda_include(NVCC)
F32, F16, BF16 = gpu_check.F32, gpu_check.F16, gpu_check.BF16

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")
needs_emulator = pytest.mark.skipif(
    CUDA_INCLUDE is None or shutil.which("g++") is None, reason="CUDA headers or g++ not found"
)

_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+)'")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


@needs_nvcc
def test_cuda_sources_compile_for_sm80_and_sm90_without_spills(tmp_path: Path) -> None:
    sources = sorted(CUDA_SOURCES.glob("*.cu"))
    assert sources, "no CUDA sources"

    def compile_one(source: Path) -> str:
        cmd = [
            str(NVCC), "-std=c++17", "-O3", "-Xptxas=-v", "-Xcompiler=-fPIC,-fvisibility=hidden",
            "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
            "-c", str(source), "-o", str(tmp_path / f"{source.stem}.o"),
        ]  # fmt: skip
        result = subprocess.run(["nice", *cmd], check=False, capture_output=True, text=True)
        assert result.returncode == 0, f"{source.name} failed to compile:\n{result.stderr}"
        return result.stderr

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        logs = "\n".join(pool.map(compile_one, sources))

    kernels: dict[tuple[str, str], tuple[int, int]] = {}
    entry = None
    for line in logs.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            entry = (m.group(1), m.group(2))
        elif (m := _PTXAS_SPILLS.search(line)) and entry is not None:
            kernels[entry] = (int(m.group(1)), int(m.group(2)))
            entry = None
    spilling = {k: v for k, v in kernels.items() if v != (0, 0)}
    assert not spilling, f"kernels with register spills (stores, loads bytes): {spilling}"
    for arch in ("sm_80", "sm_90"):
        names = [name for name, a in kernels if a == arch]
        # 4 register-row variants for float32, 3 each for the 16-bit types, 2 shared-row variants per type.
        assert sum("RegisterRowKernel" in n for n in names) == 10, names
        assert sum("SharedRowKernel" in n for n in names) == 6, names


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    assert CUDA_INCLUDE is not None
    library = gpu_check.build_emulator(CUDA_INCLUDE, tmp_path_factory.mktemp("emulator"))
    return gpu_check.Harness(library)


def _call(harness: object, **overrides: object) -> tuple[int, str]:
    """Calls the ctypes entry directly (bypassing Harness.launch's raise) with a valid float32 problem."""
    buffers = {name: (ctypes.c_float * 64)() for name in ("x", "y", "scale")}
    args = {
        "x": ctypes.addressof(buffers["x"]), "skip": None, "scale": ctypes.addressof(buffers["scale"]), "bias": None,
        "y": ctypes.addressof(buffers["y"]), "sum": None, "mean": None, "inv_std": None, "rows": 4, "cols": 16,
        "scale_size": 16, "epsilon": 1e-5, "rms": 0, "x_type": F32, "scale_type": F32, "y_type": F32,
        "normalized_type": 0, "multiply_type": 0, "stream": None,
    }  # fmt: skip
    args.update(overrides)
    error = ctypes.c_char_p()
    rc = harness._fn(*args.values(), ctypes.byref(error))
    return rc, (error.value or b"").decode()


@needs_emulator
def test_launcher_accepts_a_valid_problem_and_rejects_bad_parameters(emulator: object) -> None:
    assert _call(emulator) == (0, "")
    assert _call(emulator, rows=0, x=None, y=None) == (0, "")  # empty batch: nothing to do, nothing read
    rc, message = _call(emulator, x_type=11)  # float64
    assert rc == -1
    assert "float32, float16 or bfloat16" in message
    rc, message = _call(emulator, scale_type=7)
    assert rc == -1
    rc, message = _call(emulator, normalized_type=6)
    assert rc == -1
    rc, message = _call(emulator, scale_size=5)
    assert rc != 0
    assert "scale_size must divide cols" in message
    rc, message = _call(emulator, cols=0)
    assert rc != 0
    assert "cols" in message
    rc, message = _call(emulator, mean=ctypes.addressof((ctypes.c_float * 4)()), rms=1)
    assert rc != 0
    assert "RMSNorm has no Mean" in message
    rc, message = _call(emulator, sum=ctypes.addressof((ctypes.c_float * 64)()))
    assert rc != 0
    assert "Sum output needs a Skip" in message
    buffer = (ctypes.c_float * 65)()
    rc, message = _call(emulator, x=ctypes.addressof(buffer) + 2)
    assert rc != 0
    assert "not aligned to its element size" in message


@needs_emulator
def test_kernel_code_matches_the_reference_in_the_cpu_emulator(emulator: object) -> None:
    cases = gpu_check.build_cases(quick=True)
    # Rows past the register path: shared-memory cache (float32 and float16), and past shared memory (re-read).
    cases += [
        gpu_check._default_case(op, x_type, shape)
        for op in gpu_check.OPS
        for x_type, shape in ((F32, (2, 20000)), (F16, (2, 40004)), (BF16, (2, 120001)))
    ]
    backend = gpu_check.HostHarnessBackend(emulator)
    outcome = gpu_check.Outcome(quiet=True)
    gpu_check.run_cases(backend, cases, "emulated", outcome)
    assert not outcome.failures, "\n".join(outcome.failures[:20])
    assert outcome.checked == len(cases)
    used = set(backend.kernels)
    for expected in ("register vpt=1", "register vpt=2", "register vpt=4", "register vpt=8", "shared", "reread"):
        assert any(kernel.startswith(expected) for kernel in used), (expected, sorted(used))
    assert any(kernel.endswith(("group=8", "group=16")) for kernel in used)  # several rows per warp
    assert any(kernel.endswith(("group=128", "group=256", "group=512")) for kernel in used)  # a block per row


def test_gpu_check_catches_a_wrong_element_in_any_output() -> None:
    cases = [c for c in gpu_check.build_cases(quick=True) if c.rows > 0][::5]
    exact = gpu_check.Outcome(quiet=True)
    gpu_check.run_cases(gpu_check.FakeBackend(), cases, "exact", exact)
    assert not exact.failures, exact.failures[:5]
    for output in ("Y", "Sum", "Mean", "InvStdDev", "InvRMS"):
        subset = [c for c in cases if output in gpu_check.requested_outputs(c)]
        assert subset, output
        caught = gpu_check.Outcome(quiet=True)
        gpu_check.run_cases(gpu_check.FakeBackend(perturb=output), subset, output, caught)
        assert len(caught.failures) == len(subset), (output, len(caught.failures), len(subset))
