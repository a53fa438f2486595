"""Builds of the kernels for tools/gpu_check.py and the row ops' checks (row_op_checks.py): the harness with nvcc, the
CPU emulator with g++, and the ctypes binding of the one harness entry (tools/gpu_harness/harness.cu)."""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from gpu_cases import HARNESS, SOURCES

# NormLaunchParams' op_inputs and op_ints (custom_ops/src/cuda/launch.h), each passed to the C entry.
OP_INPUTS, OP_INTS = 2, 4

# --------------------------------------------------------------------------------------------- build


def find_nvcc(explicit: str | None) -> str | None:
    if explicit:
        return explicit if Path(explicit).is_file() and os.access(explicit, os.X_OK) else None
    candidates = [os.environ.get("CUDACXX"), shutil.which("nvcc")]
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates.append(str(Path(root) / "bin" / "nvcc"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def harness_key(arch: str, flags: list[str]) -> str:
    """What a harness build depends on: every file under custom_ops/src (the kernels and what they include), the
    harness entry, the flags and the arch; not nvcc's version (a build from this machine's nvcc 13.0, the CI's, is
    as good a test of the kernels on a GPU as one from the GPU machine's)."""
    digest = hashlib.sha256(" ".join([arch, *flags]).encode())
    for path in [*sorted(p for p in SOURCES.parent.rglob("*") if p.is_file()), HARNESS]:
        name = path.relative_to(SOURCES.parent).as_posix() if path.is_relative_to(SOURCES.parent) else path.name
        digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_harness(nvcc: str | None, arch: str, out_dir: Path, jobs: int | None = None) -> Path:
    """Compiles the kernels and the harness entry into out_dir/libonnx_norm_harness.so for one `arch` (e.g.
    "90"); each .cu in parallel. A library already there from the same sources and flags is reused (its stamp
    file says which), so that one built ahead (tools/device/prepare.sh) saves the GPU machine's minutes. Raises
    RuntimeError with nvcc's output on failure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = [*sorted(SOURCES.glob("*.cu")), HARNESS]
    flags = [
        "-std=c++17",
        "-O3",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "-Xcompiler=-fPIC,-fvisibility=hidden",
        f"-I{SOURCES}",
    ]
    library, stamp = out_dir / "libonnx_norm_harness.so", out_dir / "libonnx_norm_harness.stamp"
    key = harness_key(arch, [f for f in flags if not f.startswith("-I")])  # the include path moves with the checkout
    if library.is_file() and stamp.is_file() and stamp.read_text().split()[0] == key:
        return library
    stamp.unlink(missing_ok=True)
    if nvcc is None:
        raise RuntimeError(
            f"nvcc not found (PATH, CUDACXX, CUDA_HOME, /usr/local/cuda) and no current build in {out_dir}"
        )

    def compile_one(source: Path) -> Path:
        obj = out_dir / f"{source.stem}.o"
        cmd = [nvcc, *flags, "-c", str(source), "-o", str(obj)]
        result = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}\n{result.stdout}{result.stderr}")
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or min(len(sources), os.cpu_count() or 1)) as pool:
        objects = list(pool.map(compile_one, sources))
    cmd = [nvcc, "-shared", f"-gencode=arch=compute_{arch},code=sm_{arch}", *map(str, objects), "-o", str(library)]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{result.stdout}{result.stderr}")
    version = subprocess.run([nvcc, "--version"], check=False, capture_output=True, text=True).stdout.split("\n")
    stamp.write_text(f"{key} sm_{arch} {next((v for v in version if 'release' in v), '').strip()}\n")
    return library


def harness_origin(library: Path) -> str:
    """What built `library`: its stamp's arch and nvcc release (build_harness writes it)."""
    stamp = library.with_suffix(".stamp")
    return " ".join(stamp.read_text().split()[1:]) if stamp.is_file() else "no stamp"


def find_cuda_include(nvcc: str | None) -> Path | None:
    """A CUDA include directory (for cuda_fp16.h and friends), or None."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parent.parent))
    roots += ["/usr/local/cuda", *sorted(map(str, Path("/usr/local").glob("cuda-*")), reverse=True)]
    for root in roots:
        if root and (Path(root) / "include" / "cuda_fp16.h").is_file():
            return Path(root) / "include"
    return None


def build_emulator(
    cuda_include: Path, out_dir: Path, cxx: str = "g++", sources: Path = SOURCES, optimization: str = "-O1"
) -> Path:
    """Builds the CPU emulator of the kernels (tools/gpu_harness/emulator.cc) with the real launcher and
    harness entry into out_dir/libonnx_norm_emulator.so; `sources`: the kernels' folder (a test's altered
    copy). At -O1: the build takes a third of -O2's CPU time (11 s against 36 s of g++ on 2 cores) and the cases run
    as fast (their time goes to the numpy references and the launches' bookkeeping); -O0 takes a third of -O1's
    (4 s), for a build that runs a case or two."""
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / "libonnx_norm_emulator.so"
    # One translation unit: the emulator, then every kernel unit (the norms' per X type, each row op's), whose
    # instantiations take the emulator's LaunchKernel; launch.cu (host code) and the entry compile on their own.
    units = [path for path in sorted(sources.glob("*.cu")) if path.name != "launch.cu"]
    unity = out_dir / "emulated_kernels.cc"
    unity.write_text("".join(f'#include "{path}"\n' for path in [HARNESS.parent / "emulator.cc", *units]))
    cmd = [
        cxx, "-std=c++17", optimization, "-shared", "-fPIC", "-fvisibility=hidden", f"-I{cuda_include}", f"-I{sources}",
        str(unity), "-x", "c++", str(sources / "launch.cu"), str(HARNESS), "-o", str(library),
    ]  # fmt: skip
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{result.stdout}{result.stderr}")
    return library


@dataclasses.dataclass(frozen=True)
class LaunchArgs:
    """The arguments of one onnx_norm_harness_launch call (device pointers as ints). device: the tensors' CUDA
    device, -1 to let LaunchNorm read it from X's pointer attributes; clusters: False keeps one block per row (never
    a thread-block cluster); row_op: None for the norms, else a row op's registered name, with op_inputs (pointers)
    and op_ints in the order of its launch header (custom_ops/src/cuda/<op>_launch.h), as its check module gives
    them."""

    x: int
    y: int
    rows: int
    cols: int
    x_type: int
    y_type: int
    stream: int
    skip: int | None = None
    scale: int | None = None
    bias: int | None = None
    sum_out: int | None = None
    mean: int | None = None
    inv_std: int | None = None
    scale_size: int = 0
    scale_groups: int = 1
    scale_type: int = 0
    epsilon: float = 1e-5
    rms: bool = False
    normalized_type: int = 0
    multiply_type: int = 0
    device: int = -1
    clusters: bool = True
    row_op: str | None = None
    op_inputs: tuple[int | None, ...] = ()
    op_ints: tuple[int, ...] = ()

    def c_args(self) -> tuple[Any, ...]:
        """The C entry's arguments in its order, before the error out-parameter (tools/gpu_harness/harness.cu)."""
        if len(self.op_inputs) > OP_INPUTS or len(self.op_ints) > OP_INTS:
            raise ValueError(f"at most {OP_INPUTS} op_inputs and {OP_INTS} op_ints")
        op_inputs = (*self.op_inputs, *(None,) * (OP_INPUTS - len(self.op_inputs)))
        op_ints = (*self.op_ints, *(0,) * (OP_INTS - len(self.op_ints)))
        row_op = self.row_op.encode() if self.row_op is not None else None
        return (
            self.x, self.skip, self.scale, self.bias, self.y, self.sum_out, self.mean, self.inv_std, self.rows,
            self.cols, self.scale_size, self.scale_groups, self.epsilon, int(self.rms), self.x_type,
            self.scale_type, self.y_type, self.normalized_type, self.multiply_type, self.device, int(self.clusters),
            row_op, *op_inputs, *op_ints, self.stream,
        )  # fmt: skip


class Harness:
    """ctypes binding of onnx_norm_harness_launch (tools/gpu_harness/harness.cu)."""

    def __init__(self, library: Path) -> None:
        self._lib = ctypes.CDLL(str(library))
        fn = self._lib.onnx_norm_harness_launch
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        fn.argtypes = [p, p, p, p, p, p, p, p, i64, i64, i64, i64, ctypes.c_float]
        fn.argtypes += [i32] * 8
        fn.argtypes += [ctypes.c_char_p, *[p] * OP_INPUTS, *[i64] * OP_INTS, p, ctypes.POINTER(ctypes.c_char_p)]
        fn.restype = i32
        self._fn = fn
        last_kernel = getattr(self._lib, "onnx_norm_emulator_last_kernel", None)
        if last_kernel is not None:
            last_kernel.restype = ctypes.c_char_p
        self._last_kernel = last_kernel

    def last_kernel(self) -> str | None:
        """The emulator's name for the kernel of the last launch; None on a GPU build."""
        return self._last_kernel().decode() if self._last_kernel is not None else None

    def launch(self, args: LaunchArgs | None = None, /, **fields: Any) -> None:
        """One LaunchNorm call: `args`, or its fields as keyword arguments (`launch(x=..., y=..., rows=...)`)."""
        args = args if args is not None else LaunchArgs(**fields)
        error = ctypes.c_char_p()
        rc = self._fn(*args.c_args(), ctypes.byref(error))
        if rc != 0:
            message = error.value.decode() if error.value else "no message"
            raise RuntimeError(f"LaunchNorm returned {rc}: {message}")
