"""The CUDA kernels without a GPU: they compile with nvcc without register spills, the launcher rejects bad
parameters, and the kernel code itself matches the reference when run by the CPU emulator
(tools/gpu_harness/emulator.cc). Running them on a GPU is tools/gpu_check.py's job."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from repo_paths import REPO

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


def _load_sass_report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sass_report", REPO / "tools" / "sass_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sass_report = _load_sass_report()
NVDISASM = sass_report.find_nvdisasm(NVCC)
CUOBJDUMP = sass_report.find_cuda_tool("cuobjdump", NVCC)
# 3 X types x 3 vectors-per-thread x 8 flag combinations (skip, rms, native), and 2 shared-row variants per type.
REGISTER_ROW_KERNELS = 3 * 3 * 8
SHARED_ROW_KERNELS = 3 * 2
CLUSTER_ROW_KERNELS = 3  # one per X type: the cluster size is a launch attribute

# `emulator_library`: the emulator, built once per run for this module and tests/kernels/test_adaln_cuda.py.
pytest_plugins = ("emulator_fixtures",)

# pytest-xdist units (conftest.py): the tests of each fixture run on one worker, and the builds (sm_80 cubins, with
# sm_90's where no current library build has them; the emulator; the altered emulator) on different workers at once.
on_sm90_cubins = pytest.mark.xdist_group("cuda-sm90-cubins")
on_emulator = pytest.mark.xdist_group("cuda-emulator")


@pytest.fixture(scope="module")
def sm90_cubins(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], dict]:
    """The sm_90 cubins and each kernel's report: those of the library's own build where it is current
    (tools/setup.sh compiled them; their registers and stack frames as cuobjdump reads them), else compiled here
    (with ptxas's report)."""
    assert NVCC is not None
    out = tmp_path_factory.mktemp("sm90")
    cubins = sass_report.built_cubins("90", CUOBJDUMP, out) if CUOBJDUMP else None
    if cubins is not None:
        assert CUOBJDUMP is not None
        return cubins, {k: v for c in cubins for k, v in sass_report.resource_usage(CUOBJDUMP, c).items()}
    cubins, log = sass_report.compile_cubins(NVCC, "90", out)
    return cubins, sass_report.parse_ptxas(log)


def _check_no_spills(reports: dict, arch: str) -> None:
    """No spill bytes and no stack frame (a spill needs one; cuobjdump's reading of a built cubin has only the
    frame) in any kernel, and every kernel there."""
    spilling = {
        r.name: (r.spill_stores, r.spill_loads, r.stack_frame)
        for r in reports.values()
        if (r.spill_stores, r.spill_loads, r.stack_frame) != (0, 0, 0)
    }
    assert not spilling, f"{arch} kernels with register spills (stores, loads, stack frame bytes): {spilling}"
    names = [r.name for r in reports.values()]
    assert sum(n.startswith("RegisterRowKernel") for n in names) == REGISTER_ROW_KERNELS, names
    assert sum(n.startswith("SharedRowKernel") for n in names) == SHARED_ROW_KERNELS, names
    assert sum(n.startswith("ClusterRowKernel") for n in names) == CLUSTER_ROW_KERNELS, names


@needs_nvcc
@on_sm90_cubins
def test_cuda_kernels_compile_for_sm80_and_sm90_without_spills(
    sm90_cubins: tuple[list[Path], dict], tmp_path: Path
) -> None:
    _check_no_spills(sm90_cubins[1], "sm_90")
    _, sm80_log = sass_report.compile_cubins(NVCC, "80", tmp_path)
    _check_no_spills(sass_report.parse_ptxas(sm80_log), "sm_80")


@needs_nvcc
def test_launcher_compiles(tmp_path: Path) -> None:
    """The host-side launcher and op wrapper compile with nvcc (the library build compiles them too)."""
    cmd = [str(NVCC), "-std=c++17", "-O2", "-c", str(CUDA_SOURCES / "launch.cu"), "-o", str(tmp_path / "launch.o")]
    result = subprocess.run(["nice", *cmd], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@needs_nvcc
@on_sm90_cubins
@pytest.mark.skipif(NVDISASM is None, reason="nvdisasm not found (pip install nvidia-cuda-nvdisasm; setup.sh does)")
def test_register_row_kernels_keep_all_of_a_rows_loads_in_flight(sm90_cubins: tuple[list[Path], dict]) -> None:
    """In the sm_90 SASS, each register-row kernel issues all its X (and Skip) 16-byte loads before the first
    instruction that reads any of them: a thread that used each load before issuing the next (one LDG.E.128
    in flight) would leave an H200 far from its memory bandwidth."""
    cubins, _ = sm90_cubins
    functions: dict[str, list[tuple[str, str]]] = {}
    for cubin in cubins:
        text = subprocess.run([NVDISASM, "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
        functions.update(sass_report.parse_sass(text))
    checked = 0
    too_few = []
    for symbol, instructions in functions.items():
        parameters = sass_report.register_row_parameters(symbol)
        if parameters is None:
            continue
        vpt, flags = parameters
        # Every X and Skip load of the row, whatever the types (at 4 vectors per thread with Skip, 8 loads: the
        # non-native kernels had 6 while the loads were branches in the PTX; see LoadWordsIf).
        expected = vpt * (2 if flags & 1 else 1)
        _, in_flight = sass_report.loads_in_flight(instructions)
        checked += 1
        if in_flight < expected:
            too_few.append(f"{sass_report.describe(symbol)}: {in_flight} < {expected}")
    # The cluster kernel: a batch of 4 X and 4 Skip vectors per thread.
    cluster = {
        sass_report.describe(symbol): sass_report.loads_in_flight(instructions)[1]
        for symbol, instructions in functions.items()
        if "ClusterRowKernel" in symbol
    }
    assert len(cluster) == CLUSTER_ROW_KERNELS, sorted(cluster)
    too_few += [f"{name}: {n} < 8" for name, n in cluster.items() if n < 8]
    assert checked == REGISTER_ROW_KERNELS
    assert not too_few, "16-byte loads in flight below the expected count:\n" + "\n".join(too_few)


@pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja not found")
def test_built_cubins_are_taken_only_from_a_current_build_of_this_checkout(tmp_path: Path) -> None:
    """The sm_90 checks read the library build's cubins only where its objects are newer than the sources and
    headers Ninja recorded for them: a changed header or another checkout's build sends them back to compiling."""
    sources, build = tmp_path / "src", tmp_path / "build" / "py3-none-linux_x86_64"
    sources.mkdir()
    build.mkdir(parents=True)
    header = sources / "common.cuh"
    header.write_text("")
    # The compiler's dependency file names the header, as nvcc's does: Ninja keeps it in its deps log.
    rules = ["rule cc\n  command = cp $in $out && echo '$out: $in " + str(header) + "' > $out.d\n"]
    rules.append("  depfile = $out.d\n  deps = gcc\n")
    for name in sass_report.KERNEL_SOURCES:
        (sources / name).write_text(name)
        rules.append(f"build CMakeFiles/onnx_norm_ops.dir/src/cuda/{name}.o: cc {sources / name}\n")
    (build / "build.ninja").write_text("".join(rules))
    ninja = shutil.which("ninja")
    cache = f"CMAKE_HOME_DIRECTORY:INTERNAL={REPO / 'custom_ops'}\nCMAKE_MAKE_PROGRAM:FILEPATH={ninja}\n"
    (build / "CMakeCache.txt").write_text(cache)
    subprocess.run([str(ninja), "-C", str(build)], check=True, capture_output=True)
    # A cuobjdump that "extracts" an sm_90 cubin holding the object's text.
    cuobjdump = tmp_path / "cuobjdump"
    cuobjdump.write_text('#!/bin/sh\ncp "$3" "$(basename "$3" .cu.o).sm_90.cubin"\n')
    cuobjdump.chmod(0o755)

    cubins = sass_report.built_cubins("90", str(cuobjdump), tmp_path / "out1", tmp_path / "build")
    assert cubins is not None
    assert [c.read_text() for c in cubins] == list(sass_report.KERNEL_SOURCES)
    assert sass_report.built_cubins("80", str(cuobjdump), tmp_path / "out2", tmp_path / "build") is None  # no sm_80
    header.write_text("// edited")
    later = time.time() + 10  # newer than the objects, whatever the file system's time resolution
    os.utime(header, (later, later))
    assert sass_report.built_cubins("90", str(cuobjdump), tmp_path / "out3", tmp_path / "build") is None
    os.utime(header, (later - 20, later - 20))  # as if the edit was undone
    assert sass_report.built_cubins("90", str(cuobjdump), tmp_path / "out4", tmp_path / "build") is not None
    (build / "CMakeCache.txt").write_text(cache.replace(str(REPO / "custom_ops"), str(tmp_path)))  # not ours
    assert sass_report.built_cubins("90", str(cuobjdump), tmp_path / "out5", tmp_path / "build") is None


def test_loads_in_flight_counts_loads_until_their_first_use() -> None:
    """The SASS reading itself: two loads then a use is 2 in flight; load, use, load, use is 1."""
    batched = [
        ("LDG.E.128.CONSTANT", "R4, desc[UR4][R2.64]"),
        ("LDG.E.128.CONSTANT", "R8, desc[UR4][R2.64+0x10]"),
        ("HADD2.F32", "R12, -RZ, R4.H0_H0"),
        ("FADD", "R13, R9, R12"),
    ]
    serial = [batched[0], batched[2], batched[1], batched[3]]
    assert sass_report.loads_in_flight(batched) == (2, 2)
    assert sass_report.loads_in_flight(serial) == (2, 1)
    # A store of the loaded vector reads all four registers; an address use of another register does not.
    stored = [batched[0], ("IADD3", "R2, P0, R2, 0x20, RZ"), ("STG.E.128", "desc[UR4][R20.64], R4"), batched[1]]
    assert sass_report.loads_in_flight(stored) == (2, 1)
    assert sass_report.describe("_ZN9onnx_norm4cuda17RegisterRowKernelI6__halfLi2ELi5EEEvNS0_8NormArgsE") == (
        "RegisterRowKernel<float16, vpt=2, skip+native>"
    )


@pytest.fixture(scope="module")
def emulator(emulator_library: Path) -> ModuleType:
    return gpu_check.Harness(emulator_library)


@needs_emulator
@on_emulator
def test_launch_plan_for_an_h200_keeps_sms_busy_and_rows_read_once_where_they_fit(emulator_library: Path) -> None:
    """The real launcher's choices for a 132-SM GPU (the table of docs/cuda_kernels.md)."""
    plan = {(r[0], r[1], r[2]): r for r in gpu_check.launch_plan(emulator_library)}
    assert len(plan) == len(gpu_check.OPS) * 3 * len(gpu_check.PLAN_SHAPES)
    kernel, vpt, blocks, group, block, grid = 4, 5, 6, 7, 8, 9
    row = plan[("SkipLayerNorm", "fp16", "8192x4096")]
    assert (row[kernel], row[vpt], row[group], row[block]) == ("register", "2", "256", "256")
    assert int(row[grid]) == 132 * (2048 // 256) * 4  # capped at 4 waves: blocks loop over rows
    row = plan[("RMSNorm", "fp16", "8192x768")]  # 96 vectors: 2 per thread, 2 rows per 128-thread block
    assert (row[kernel], row[vpt], row[group], row[block], row[grid]) == ("register", "2", "64", "128", "4096")
    assert plan[("RMSNorm", "bf16", "4096x16384")][vpt] == "4"
    assert plan[("LayerNorm", "fp32", "2048x32768")][kernel] == "shared"  # 128 KiB: one block per SM
    assert plan[("LayerNorm", "fp32", "2048x32768")][grid] == "132"
    # Over one block's 227 KiB: the row over a cluster of 2 (fp32 65536) or 4 (fp16 262144) blocks, X read once.
    row = plan[("LayerNorm", "fp32", "1024x65536")]
    assert (row[kernel], row[blocks], row[block], row[grid]) == ("cluster", "2", "512", "132")
    row = plan[("SkipRMSNorm", "fp16", "256x262144")]
    assert (row[kernel], row[blocks], row[grid]) == ("cluster", "4", "132")
    # Too few rows for 132 SMs: a decode row over 4 blocks of 128 vectors, 64 rows over 2 blocks each.
    row = plan[("RMSNorm", "fp16", "1x4096")]
    assert (row[kernel], row[blocks], row[group], row[grid]) == ("cluster", "4", "128", "4")
    assert (plan[("RMSNorm", "fp32", "1x4096")][blocks], plan[("LayerNorm", "fp16", "64x4096")][blocks]) == ("8", "2")
    assert plan[("LayerNorm", "fp16", "8192x4096")][kernel] == "register"  # many rows: one block per row


def _call(harness: object, **overrides: object) -> tuple[int, str]:
    """Calls the ctypes entry directly (bypassing Harness.launch's raise) with a valid float32 problem."""
    buffers = {name: (ctypes.c_float * 64)() for name in ("x", "y", "scale")}
    args = {
        "x": ctypes.addressof(buffers["x"]), "skip": None, "scale": ctypes.addressof(buffers["scale"]), "bias": None,
        "y": ctypes.addressof(buffers["y"]), "sum": None, "mean": None, "inv_std": None, "rows": 4, "cols": 16,
        "scale_size": 16, "scale_groups": 1, "epsilon": 1e-5, "rms": 0, "x_type": F32, "scale_type": F32, "y_type": F32,
        "normalized_type": 0, "multiply_type": 0, "device": -1, "clusters": 1, "row_op": None, "op_input0": None,
        "op_input1": None, "op_int0": 0, "op_int1": 0, "op_int2": 0, "op_int3": 0, "stream": None,
    }  # fmt: skip
    args.update(overrides)
    error = ctypes.c_char_p()
    rc = harness._fn(*args.values(), ctypes.byref(error))
    return rc, (error.value or b"").decode()


@needs_emulator
@on_emulator
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
    # One Scale row per row group (a per-head Scale): each covering the row, their count dividing the rows.
    assert _call(emulator, scale_groups=2, cols=8, scale_size=8) == (0, "")
    for bad in ({"scale_groups": 3, "cols": 8, "scale_size": 8}, {"scale_groups": 2, "scale_size": 8}):
        rc, message = _call(emulator, **bad)
        assert rc != 0 and "scale_groups rows of Scale/Bias" in message, bad
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
    # The same entry and launcher serve the row ops: row_op names the launcher (modulated_launch.h: ModScale and
    # ModShift as op inputs, mod_batch and rows_per_sample as op ints), which makes its own checks.
    modulation_buffer = (ctypes.c_float * 16)()  # kept alive: the accepted call reads it
    modulation = ctypes.addressof(modulation_buffer)
    modulated = {"row_op": b"Modulated", "op_input0": modulation, "op_input1": modulation}
    assert _call(emulator, **modulated, op_int0=1, op_int1=4) == (0, "")
    rc, message = _call(emulator, **dict(modulated, op_input1=None), op_int0=1, op_int1=4)
    assert rc != 0 and "ModScale and ModShift are required" in message
    rc, message = _call(emulator, **modulated, op_int0=3, op_int1=2)
    assert rc != 0 and "one row per sample" in message
    rc, message = _call(emulator, row_op=b"NoSuchOp")
    assert rc != 0 and "names no registered launcher" in message


@needs_emulator
@on_emulator
def test_kernel_code_matches_the_reference_in_the_cpu_emulator(emulator: object) -> None:
    cases = gpu_check.build_cases(quick=True)
    # Rows past the register path: shared-memory cache (float32 and float16), and past shared memory (re-read).
    cases += [
        gpu_check._default_case(op, x_type, shape)
        for op in gpu_check.OPS
        for x_type, shape in ((F32, (2, 20000)), (F16, (2, 40004)), (BF16, (2, 120001)), (F16, (300, 8)))
    ]
    backend = gpu_check.HostHarnessBackend(emulator)
    outcome = gpu_check.Outcome(quiet=True)
    gpu_check.run_cases(backend, cases, "emulated", outcome)
    assert not outcome.failures, "\n".join(outcome.failures[:20])
    assert outcome.checked == len(cases)
    used = set(backend.kernels)
    for expected in ("register vpt=1", "register vpt=2", "register vpt=4", "shared", "cluster blocks=2"):
        assert any(kernel.startswith(expected) for kernel in used), (expected, sorted(used))
    flags = {int(m.group(1)) for k in used if (m := re.search(r"flags=(\d+)", k))}
    assert flags == set(range(8)), sorted(flags)  # skip x rms x native types
    assert any(kernel.endswith(("group=8", "group=16")) for kernel in used)  # several rows per warp
    assert any(kernel.endswith(("group=128", "group=256", "group=512")) for kernel in used)  # a block per row


@needs_emulator
@on_emulator
def test_shared_row_cache_is_safe_when_a_block_loops_over_rows(emulator: object) -> None:
    """The emulated GPU has 3 SMs, so the launcher's grid cap gives each block of the shared-memory kernel
    several rows; with X shifted by 3 elements the scalar ends of consecutive rows land in different cache
    slots. Without the barrier between one row's output pass and the next row's caching pass, a fast thread
    overwrites cache slots a slow one has still to read (the emulator runs threads in turn between
    barriers, so this fails deterministically)."""
    cases = [gpu_check._default_case(op, F32, (40, 8201), layout="shifted") for op in gpu_check.OPS]
    backend = gpu_check.HostHarnessBackend(emulator)
    outcome = gpu_check.Outcome(quiet=True)
    gpu_check.run_cases(backend, cases, "emulated", outcome)
    assert not outcome.failures, "\n".join(outcome.failures[:8])
    assert set(backend.kernels) == {"shared"}


@needs_emulator
@on_emulator
def test_skip_ops_are_safe_in_place_with_sum_bound_onto_x_or_skip(emulator: object) -> None:
    """Sum written over X or Skip (every kernel path, including the one that reads the row twice), and the
    launcher refusing outputs that partly overlap an input."""
    cases = [
        gpu_check._default_case(op, x_type, shape, layout=layout)
        for op in ("SkipLayerNorm", "SkipRMSNorm")
        for layout in gpu_check.IN_PLACE
        for x_type, shape in ((F16, (3, 7)), (BF16, (3, 4097)), (F32, (3, 8000)), (F16, (3, 20000)), (F32, (1, 60000)))
    ]
    backend = gpu_check.HostHarnessBackend(emulator)
    outcome = gpu_check.Outcome(quiet=True)
    gpu_check.run_cases(backend, cases, "emulated", outcome)
    # Without clusters (emulated device 1) the widest row is re-read, from Sum.
    no_clusters = gpu_check.HostHarnessBackend(emulator, device=1)
    gpu_check.run_cases(no_clusters, [c for c in cases if c.cols == 60000], "emulated, no clusters", outcome)
    assert not outcome.failures, "\n".join(outcome.failures[:8])
    assert {k.split()[0] for k in backend.kernels} == {"register", "shared", "cluster"}, sorted(backend.kernels)
    assert {k.split()[0] for k in no_clusters.kernels} == {"reread"}, sorted(no_clusters.kernels)
    buffer = (ctypes.c_float * 200)()
    base = ctypes.addressof(buffer)
    rc, message = _call(emulator, skip=base + 256, sum=base + 4, y=base + 512)  # Sum one element into X
    assert rc != 0
    assert "may not overlap" in message
    rc, message = _call(emulator, x=base, y=base + 8, scale=base + 512)  # Y two elements into X
    assert rc != 0
    assert "may not overlap" in message


@needs_emulator
@on_emulator
@pytest.mark.parametrize("device", [1, 2])
def test_rows_split_over_a_cluster_or_fall_back_without_clusters(emulator: object, device: int) -> None:
    """Emulated device 2 (clusters, 64 SMs, 48 KiB of shared memory) splits few or wide rows over clusters of
    4 and 8 blocks (partial sums through distributed shared memory; the emulator runs a cluster's blocks
    together and checks its barrier and every peer access); device 1 (no clusters) runs the same shapes one
    block per row, re-reading the rows over its shared memory."""
    cases = gpu_check.device_cases(device, quick=True)
    backend = gpu_check.HostHarnessBackend(emulator, device=device)
    outcome = gpu_check.Outcome(quiet=True)
    gpu_check.run_cases(backend, cases, f"emulated device {device}", outcome)
    assert not outcome.failures, "\n".join(outcome.failures[:8])
    assert outcome.checked == len(cases)
    used = {k.split(" group")[0] for k in backend.kernels}
    if device == 2:
        assert {"cluster blocks=4", "cluster blocks=8"} <= used, sorted(used)
    else:
        assert not any(k.startswith("cluster") for k in used) and "reread" in used, sorted(used)


@needs_emulator
@pytest.mark.xdist_group("cuda-emulator-mutant")
def test_emulator_refuses_a_cluster_kernel_whose_blocks_exit_before_their_peers_have_read(tmp_path: Path) -> None:
    """The emulator's own strictness: the cluster kernel without its last barrier (a block may then exit while a
    peer still reads its partial sums, undefined on the GPU) must fail in the emulator, though its results
    would be right there."""
    sources = tmp_path / "cuda"
    shutil.copytree(CUDA_SOURCES, sources)
    kernel = sources / "cluster_row_kernel.cuh"
    text = kernel.read_text()
    final_barrier = "  ClusterSync();\n#endif\n}"
    assert text.count(final_barrier) == 1
    kernel.write_text(text.replace(final_barrier, "#endif\n}"))
    assert CUDA_INCLUDE is not None
    # At -O0 (4 CPU-s of g++ against 11 at -O1) for its one case: the barrier bookkeeping that must refuse the
    # kernel is emulator.cc's own code, the same at any optimisation level.
    library = gpu_check.build_emulator(CUDA_INCLUDE, tmp_path / "build", sources=sources, optimization="-O0")
    backend = gpu_check.HostHarnessBackend(gpu_check.Harness(library), device=2)
    outcome = gpu_check.Outcome(quiet=True)
    gpu_check.run_cases(backend, [gpu_check._default_case("RMSNorm", F32, (1, 4096))], "mutant", outcome)
    assert len(outcome.failures) == 1
    assert "exits without a cluster barrier" in outcome.failures[0]


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


class _CpuTorch:
    """torch on the CPU with the few torch.cuda calls the bandwidth rows make answered for an H200-like device."""

    def __init__(self, torch: ModuleType) -> None:
        self._torch = torch
        properties = types.SimpleNamespace(multi_processor_count=132, shared_memory_per_block_optin=227 * 1024)
        self.cuda = types.SimpleNamespace(
            current_stream=lambda: types.SimpleNamespace(cuda_stream=7),
            get_device_properties=lambda device: properties,
            empty_cache=lambda: None,
            synchronize=lambda: None,
        )

    def __getattr__(self, name: str) -> object:
        return getattr(self._torch, name)


@pytest.mark.parametrize(
    ("op", "dtype", "shape"),
    [("LayerNorm", F16, (8, 64)), ("SkipRMSNorm", BF16, (1, 96)), ("SkipLayerNorm", F32, (300, 32))],
)
def test_bandwidth_row_times_each_contender_on_rotated_inputs(
    monkeypatch: pytest.MonkeyPatch, op: str, dtype: int, shape: tuple[int, int]
) -> None:
    """The bandwidth row code (GPU-only) run on CPU tensors: our launch gets the right pointers and flags, the
    torch stand-in and the copy run on the same rotation of input sets, and a decode-sized shape also times
    the launch without clusters."""
    torch = pytest.importorskip("torch")
    launches: list[dict[str, object]] = []
    timed: list[int] = []

    def time_calls(_torch: object, calls: list, use_graph: bool) -> float:
        for call in calls:
            call()
        timed.append(len(calls))
        return float(len(timed))

    bandwidth = sys.modules["gpu_bandwidth"]  # tools/gpu_harness/gpu_bandwidth.py, imported by gpu_check
    monkeypatch.setattr(bandwidth, "time_calls", time_calls)
    monkeypatch.setattr(bandwidth, "_load_triton", lambda: None)
    types_by_onnx = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}
    backend = types.SimpleNamespace(
        torch=_CpuTorch(torch), device=torch.device("cpu"), _torch_types=types_by_onnx,
        harness=types.SimpleNamespace(launch=lambda **kwargs: launches.append(kwargs)),
    )  # fmt: skip
    rows, cols = shape
    row = bandwidth._bench_one(backend, op, dtype, rows, cols, l2_bytes=1 << 20, use_graph=True)

    size = torch.tensor([], dtype=types_by_onnx[dtype]).element_size()
    assert row.bytes_moved == gpu_check.bytes_moved(op, size, rows, cols) and row.timing == "graph"
    decode = rows * 2 <= 132
    assert row.single_us is not None if decode else row.single_us is None
    assert row.triton_us is None
    # ours (and ours without clusters for a decode shape), copy, torch: each over the same rotation of sets.
    assert len(timed) == 4 if decode else len(timed) == 3
    assert len(set(timed)) == 1 and timed[0] % 2 == 0
    skip, rms = gpu_check.SIGNATURES[op].skip, gpu_check.SIGNATURES[op].rms
    for launch in launches:
        assert (launch["rows"], launch["cols"], launch["x_type"], launch["rms"]) == (rows, cols, dtype, rms)
        assert (launch["skip"] is not None, launch["sum_out"] is not None) == (skip, skip)
        assert (launch["bias"] is None) == rms and launch["stream"] == 7
    assert {launch["clusters"] for launch in launches} == ({True, False} if decode else {True})
    # The rotation walks every input set twice.
    assert len({launch["x"] for launch in launches}) == timed[0] // 2


def test_bandwidth_table_cut_by_its_deadline_keeps_the_goal_rows_of_every_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU run's minutes are few: when --budget runs out, the rows measured are the goal shapes in 16-bit
    types for every op (never one op's whole table and another's nothing), and the table still reads op by op."""
    bandwidth = sys.modules["gpu_bandwidth"]
    measured: list[tuple[str, int, tuple[int, int]]] = []

    def bench_one(_backend: object, op: str, dtype: int, rows: int, cols: int, *_: object) -> object:
        measured.append((op, dtype, (rows, cols)))
        return types.SimpleNamespace(op=op, dtype=dtype, shape=(rows, cols))

    monkeypatch.setattr(bandwidth, "_bench_one", bench_one)
    # Each row takes one "second"; the deadline falls after the first two goal shapes in fp16 and bf16.
    clock = types.SimpleNamespace(perf_counter=lambda: float(len(measured)))
    monkeypatch.setattr(sys.modules["gpu_cases"], "time", clock)  # the deadline's clock (measure_by_priority)
    cuda = types.SimpleNamespace(get_device_properties=lambda _: types.SimpleNamespace(), synchronize=lambda: None,
                                 empty_cache=lambda: None)  # fmt: skip
    backend = types.SimpleNamespace(torch=types.SimpleNamespace(cuda=cuda), device=0)
    ops, types_ = gpu_check.OPS, (F32, F16, BF16)
    deadline = 2 * 2 * len(ops) - 0.5
    rows, left_out = bandwidth.bench(backend, gpu_check.BENCH_SHAPES, types_, True, deadline)

    plan = [(op, dtype, shape) for op in ops for dtype in types_ for shape in gpu_check.BENCH_SHAPES]
    goals = {(op, dtype, shape) for op in ops for dtype in (F16, BF16) for shape in ((8192, 4096), (32768, 1024))}
    assert set(measured) == goals and left_out == len(plan) - len(goals)
    assert measured[: len(ops)] == [(op, F16, (8192, 4096)) for op in ops]  # the first goal, every op at once
    assert [(r.op, r.dtype, r.shape) for r in rows] == [item for item in plan if item in goals]
    by_priority = sys.modules["gpu_cases"].by_priority
    assert by_priority(plan)[-1][1] == F32 and sorted(by_priority(plan)) == sorted(plan)


def test_harness_build_is_reused_only_while_its_sources_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A harness built ahead (tools/device/prepare.sh) spares the GPU machine's minutes, but only while the kernels
    and the harness entry are the ones it was built from, for the same arch; else it is built again."""
    build = sys.modules["gpu_build"]
    calls = tmp_path / "calls"
    nvcc = tmp_path / "nvcc"  # writes the -o target, says its release, counts its calls
    nvcc.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {calls}\n'
        '[[ $1 == --version ]] && { echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; }\n'
        'while (($#)); do [[ $1 == -o ]] && : > "$2"; shift; done\n'
    )
    nvcc.chmod(0o755)
    harness = tmp_path / "harness.cu"
    harness.write_text((REPO / "tools" / "gpu_harness" / "harness.cu").read_text())
    monkeypatch.setattr(build, "HARNESS", harness)
    out = tmp_path / "out"

    def nvcc_calls() -> int:
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    library = build.build_harness(str(nvcc), "90", out)
    first = nvcc_calls()
    assert first == len(list(CUDA_SOURCES.glob("*.cu"))) + 3  # each .cu, the harness, the link, --version
    assert build.harness_origin(library) == "sm_90 Cuda compilation tools, release 13.0, V13.0.88"
    assert build.build_harness(None, "90", out) == library and nvcc_calls() == first  # reused, no nvcc needed
    harness.write_text(harness.read_text() + "\n// changed\n")
    with pytest.raises(RuntimeError, match="nvcc not found"):
        build.build_harness(None, "90", out)
    build.build_harness(str(nvcc), "90", out)
    assert nvcc_calls() == 2 * first
    build.build_harness(str(nvcc), "100", out)  # another arch: another build
    assert nvcc_calls() == 3 * first


def test_cluster_sweep_times_each_point_with_clusters_allowed_and_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep across the cluster thresholds (GPU-only code run on CPU tensors): each point launches ours with
    clusters allowed, then the same with clusters off, and its row holds both times, their ratio and the time
    per row; the points stop at the deadline."""
    torch = pytest.importorskip("torch")
    bandwidth = sys.modules["gpu_bandwidth"]
    launches: list[dict[str, object]] = []
    times = iter([10.0, 15.0, 4.0, 4.0])  # (clusters, no clusters) for each point

    def time_calls(_torch: object, calls: list, use_graph: bool) -> float:
        for call in calls:
            call()
        return next(times)

    monkeypatch.setattr(bandwidth, "time_calls", time_calls)
    backend = types.SimpleNamespace(
        torch=_CpuTorch(torch), device=torch.device("cpu"), _torch_types={F16: torch.float16},
        harness=types.SimpleNamespace(launch=lambda **kwargs: launches.append(kwargs)),
    )  # fmt: skip
    points = [("RMSNorm", 2, 64), ("SkipRMSNorm", 4, 32), ("LayerNorm", 1, 16)]
    # The clock passes the deadline after the second point.
    clock = iter([0.0, 1.0, 5.0])
    monkeypatch.setattr(bandwidth, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    table = bandwidth.cluster_sweep(backend, True, 2.0, points)
    assert table == [
        ["RMSNorm", "fp16", "2x64", "10.0", "15.0", "1.50x", "5.000"],
        ["SkipRMSNorm", "fp16", "4x32", "4.0", "4.0", "1.00x", "1.000"],
    ]
    assert len(table[0]) == len(bandwidth.SWEEP_HEADER)
    per_point = [[(k["rows"], k["cols"], k["clusters"]) for k in launches if k["cols"] == c] for c in (64, 32)]
    for (rows, cols), seen in zip(((2, 64), (4, 32)), per_point, strict=True):
        half = len(seen) // 2
        assert seen and seen[:half] == [(rows, cols, True)] * half and seen[half:] == [(rows, cols, False)] * half
    assert {k["x_type"] for k in launches} == {F16}


class _CaptureStandIn:
    """torch.cuda for CPU tensors, with the emulator in place of the GPU: streams that run at once, and a graph
    capture that records the harness's launches (as a capture records kernel nodes) for the replay to run."""

    def __init__(self, harness: object) -> None:
        self.harness, self.capturing, self.recorded, self.replays = harness, False, [], 0
        stand_in = self

        class Stream:
            cuda_stream = 0

            def __init__(self, device: object = None) -> None:
                pass

            def wait_stream(self, other: object) -> None:
                pass

            def synchronize(self) -> None:
                pass

        class Graph:
            def replay(self) -> None:
                stand_in.replays += 1
                for fields in stand_in.recorded:
                    stand_in.harness.launch(**fields)

        @contextlib.contextmanager
        def graph(_graph: Graph) -> Iterator[None]:
            stand_in.recorded.clear()
            stand_in.capturing = True
            try:
                yield
            finally:
                stand_in.capturing = False

        self.cuda = types.SimpleNamespace(
            Stream=Stream, CUDAGraph=Graph, graph=graph, stream=lambda _s: contextlib.nullcontext(),
            current_stream=lambda device=None: Stream(), synchronize=lambda device=None: None,
        )  # fmt: skip

    def launch(self, **fields: object) -> None:
        if self.capturing:
            self.recorded.append(fields)
        else:
            self.harness.launch(**fields)


def _cpu_backend(emulator: object) -> tuple[object, _CaptureStandIn]:
    """gpu_check's GPU backend (TorchHarnessBackend) on CPU tensors, launching into the emulator's device 0."""
    torch = pytest.importorskip("torch")
    stand_in = _CaptureStandIn(emulator)
    backend = gpu_check.TorchHarnessBackend(stand_in)  # type: ignore[arg-type]
    backend.device = torch.device("cpu", 0)  # index 0: the emulated device the launches name
    backend.torch = types.SimpleNamespace(**{n: getattr(torch, n) for n in dir(torch) if not n.startswith("_")})
    backend.torch.cuda = stand_in.cuda
    return backend, stand_in


@needs_emulator
@on_emulator
def test_gpu_backend_runs_the_cases_on_cpu_tensors_through_the_emulator(emulator: object) -> None:
    """The Python of the GPU path (tensors at their offsets, guard bands, in-place Sum, the side stream, reading
    back) that only a GPU runs: here on CPU tensors, the kernels' real source in the emulator, the same cases and
    comparison as on a GPU."""
    backend, _ = _cpu_backend(emulator)
    cases = [c for c in gpu_check.build_cases(quick=True) if c.rows * c.cols <= 1 << 16][::3]
    assert {c.layout for c in cases} >= {"contiguous", "misaligned", "sum-on-x", "sum-on-skip"}
    outcome = gpu_check.Outcome(quiet=True)
    gpu_check.run_cases(backend, cases, "cpu-torch", outcome)
    assert not outcome.failures, outcome.failures[:5]
    assert outcome.checked == len(cases)


@needs_emulator
@on_emulator
def test_graph_capture_check_replays_each_kernel_path_on_new_inputs(emulator: object) -> None:
    """gpu_check's capture check with a stand-in capture: each path's launch is made inside the capture, the
    replay runs it after new inputs were written, and the results are the new inputs'. A replay that ran on the
    old inputs would fail the comparison."""
    backend, stand_in = _cpu_backend(emulator)
    outcome = gpu_check.Outcome(quiet=True)
    captured, line = gpu_check.check_graph_capture(backend, outcome)
    assert captured and not outcome.failures, (line, outcome.failures[:5])
    assert stand_in.replays == len(gpu_check.CAPTURE_CASES) and outcome.checked == len(gpu_check.CAPTURE_CASES)
