#!/usr/bin/env python3
"""What the CUDA kernels compile to, without a GPU: registers and spills per kernel (ptxas) and how many
16-byte global loads each kernel has in flight at once (its sm_90 SASS, read with nvdisasm).

A thread that uses each load before issuing the next keeps one 16-byte load in flight, which leaves an
H100/H200 far from its memory bandwidth; the register-row kernel issues all of a row's loads (X, Skip,
then Scale/Bias) before it uses any. `loads in flight` is the largest number of LDG.E.128 issued and not
yet read by any instruction, walking the SASS in program order (branches ignored: the loads sit in
straight-line code).

    python tools/sass_report.py [--arch 90] [--markdown]

nvdisasm comes with a CUDA toolkit or from PyPI (`pip install nvidia-cuda-nvdisasm`; tools/setup.sh installs
it into the venv when nvcc is there without it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = REPO / "custom_ops" / "src" / "cuda"
# The translation units that hold kernels: the norms' one per X type and each row op's cuda/<op>.cu; launch.cu is
# the host-side launcher only.
KERNEL_SOURCES = tuple(sorted(path.name for path in SOURCES.glob("*.cu") if path.name != "launch.cu"))

_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+)'")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
_SASS_FUNCTION = re.compile(r"^\.text\.(\w+):")
_SASS_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_REGISTER = re.compile(r"\bR(\d+)(\.64)?\b")
_TYPE_NAMES = {"f": "float32", "6__half": "float16", "13__nv_bfloat16": "bfloat16"}
_FLAG_NAMES = ((1, "skip"), (2, "rms"), (4, "native"))


@dataclasses.dataclass
class KernelReport:
    symbol: str
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_frame: int = 0  # bytes of local memory per thread; a spill needs one, so 0 means no spills
    loads_128: int = 0
    loads_in_flight: int = 0

    @property
    def name(self) -> str:
        return describe(self.symbol)


def describe(symbol: str) -> str:
    """A readable name for a mangled kernel symbol: RegisterRowKernel<float16, 2, skip|native>."""
    if m := re.search(r"ClusterRowKernelI(f|6__half|13__nv_bfloat16)E", symbol):
        return f"ClusterRowKernel<{_TYPE_NAMES[m.group(1)]}>"
    m = re.search(r"(RegisterRowKernel|SharedRowKernel)I(f|6__half|13__nv_bfloat16)L(i|b)(\d+)E(?:Li(\d+)E)?", symbol)
    if not m:
        return symbol
    kernel, tx, _, first, flags = m.groups()
    if kernel == "SharedRowKernel":
        return f"SharedRowKernel<{_TYPE_NAMES[tx]}, {'cached' if first == '1' else 'uncached'}>"
    names = [n for bit, n in _FLAG_NAMES if int(flags) & bit] or ["-"]
    return f"RegisterRowKernel<{_TYPE_NAMES[tx]}, vpt={first}, {'+'.join(names)}>"


def register_row_parameters(symbol: str) -> tuple[int, int] | None:
    """(vectors per thread, flags) of a RegisterRowKernel symbol, else None."""
    m = re.search(r"RegisterRowKernelI\w+?L[ib](\d+)ELi(\d+)E", symbol)
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_nvdisasm(nvcc: str | None) -> str | None:
    """nvdisasm next to nvcc, on PATH, under CUDA_HOME, or from the nvidia-cuda-nvdisasm wheel."""
    return find_cuda_tool("nvdisasm", nvcc)


def find_cuda_tool(name: str, nvcc: str | None) -> str | None:
    """A CUDA binary tool (nvdisasm, cuobjdump) next to nvcc, on PATH, under CUDA_HOME, or from its nvidia-cuda-*
    wheel."""
    candidates = []
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent / name)
    if found := shutil.which(name):
        candidates.append(Path(found))
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            candidates.append(Path(root) / "bin" / name)
    try:
        import nvidia  # the namespace package of the nvidia-* wheels

        for base in map(Path, nvidia.__path__):
            candidates += sorted(base.glob(f"*/bin/{name}"))
    except ImportError:
        pass
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def compile_cubins(nvcc: str, arch: str, out_dir: Path) -> tuple[list[Path], str]:
    """One cubin per X type for sm_<arch>, with ptxas's verbose report (its stderr, concatenated)."""

    def one(name: str) -> tuple[Path, str]:
        cubin = out_dir / f"{Path(name).stem}.sm_{arch}.cubin"
        cmd = [
            nvcc, "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xptxas=-v", f"-I{SOURCES}", "-cubin",
            f"-gencode=arch=compute_{arch},code=sm_{arch}", str(SOURCES / name), "-o", str(cubin),
        ]  # fmt: skip
        result = subprocess.run(["nice", *cmd], check=False, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}\n{result.stdout}{result.stderr}")
        return cubin, result.stderr

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, KERNEL_SOURCES))
    return [c for c, _ in results], "\n".join(log for _, log in results)


def built_cubins(arch: str, cuobjdump: str, out_dir: Path, build_root: Path = REPO / "build") -> list[Path] | None:
    """The sm_<arch> cubins of the three X-type sources taken from the library's build (the objects tools/setup.sh
    compiled, extracted with cuobjdump), or None where no build can vouch for them: no Ninja build of this
    checkout's sources under `build_root`, an object missing or older than one of its sources and headers, or no
    sm_<arch> code in it. Compiling them again costs ~20 CPU-s per source and arch."""
    objects = [f"CMakeFiles/onnx_norm_ops.dir/src/cuda/{name}.o" for name in KERNEL_SOURCES]
    for build, ninja in _ninja_builds(build_root):
        if not all(_is_current(build, ninja, obj) for obj in objects):
            continue
        cubins = []
        for name, obj in zip(KERNEL_SOURCES, objects, strict=True):
            target = out_dir / name
            target.mkdir(parents=True, exist_ok=True)
            command = [cuobjdump, "-xelf", "all", str(build / obj)]
            subprocess.run(command, check=True, cwd=target, capture_output=True)
            cubins += sorted(target.glob(f"*.sm_{arch}.cubin"))
        if len(cubins) == len(KERNEL_SOURCES):
            return cubins
    return None


def _is_current(build: Path, ninja: str, target: str) -> bool:
    """Whether `target` of a Ninja build is newer than every file it was compiled from, its headers (toolkit ones
    included) as the compiler listed them in Ninja's deps log. (`ninja -n` cannot say: a CMake build with
    CONFIGURE_DEPENDS globs always has its manifest check to run first, and a dry run stops there.)"""
    listed = subprocess.run(
        [ninja, "-C", str(build), "-t", "deps", target], check=False, capture_output=True, text=True
    )
    lines = listed.stdout.splitlines()
    output = build / target
    if listed.returncode != 0 or not lines or not lines[0].endswith("(VALID)") or not output.is_file():
        return False  # no deps recorded, or recorded for an older output
    built = output.stat().st_mtime_ns
    inputs = [build / line.strip() for line in lines[1:] if line.strip()]
    return bool(inputs) and all(path.is_file() and path.stat().st_mtime_ns <= built for path in inputs)


def _ninja_builds(build_root: Path) -> list[tuple[Path, str]]:
    """(build directory, ninja) of each CMake build of this checkout's custom_ops under `build_root`."""
    found = []
    for cache in sorted(build_root.glob("*/CMakeCache.txt")):
        pattern = r"^(CMAKE_HOME_DIRECTORY|CMAKE_MAKE_PROGRAM):\w+=(.*)$"
        entries = dict(re.findall(pattern, cache.read_text(errors="replace"), re.MULTILINE))
        home, ninja = entries.get("CMAKE_HOME_DIRECTORY"), entries.get("CMAKE_MAKE_PROGRAM", "")
        if home and Path(home).resolve() == SOURCES.parents[1] and Path(ninja).name == "ninja" and shutil.which(ninja):
            found.append((cache.parent, ninja))
    return found


def resource_usage(cuobjdump: str, cubin: Path) -> dict[str, KernelReport]:
    """Registers and stack frame of each kernel in a cubin (`cuobjdump -res-usage`, the values ptxas reported
    when it compiled them; the spill byte counts themselves are not kept in the cubin)."""
    text = subprocess.run([cuobjdump, "-res-usage", str(cubin)], check=True, capture_output=True, text=True).stdout
    reports: dict[str, KernelReport] = {}
    for symbol, registers, stack in re.findall(r"Function (\w+):\s+REG:(\d+) STACK:(\d+)", text):
        reports[symbol] = KernelReport(symbol, registers=int(registers), stack_frame=int(stack))
    return reports


def parse_ptxas(log: str) -> dict[str, KernelReport]:
    reports: dict[str, KernelReport] = {}
    current: KernelReport | None = None
    for line in log.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            current = reports.setdefault(m.group(1), KernelReport(m.group(1)))
        elif current is not None and (m := _PTXAS_SPILLS.search(line)):
            current.stack_frame, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif current is not None and (m := _PTXAS_REGISTERS.search(line)):
            current.registers = int(m.group(1))
    return reports


def _registers(operand: str, width: int = 1) -> set[int]:
    regs: set[int] = set()
    for m in _REGISTER.finditer(operand):
        n = int(m.group(1))
        regs.update(range(n, n + (2 if m.group(2) else width)))
    return regs


def loads_in_flight(instructions: list[tuple[str, str]]) -> tuple[int, int]:
    """(number of LDG.E.128, largest number of them outstanding at once) in one function's
    (opcode, operands) list: a load is outstanding from its issue until an instruction reads (or
    overwrites) one of its four destination registers."""
    outstanding: list[set[int]] = []
    count = best = 0
    for opcode, operands in instructions:
        parts = [p.strip() for p in operands.split(",")] if operands.strip() else []
        is_store = opcode.startswith(("ST", "RED", "ATOM", "BAR", "BRA", "EXIT", "RET", "CALL"))
        width = 4 if ".128" in opcode else 2 if ".64" in opcode else 1
        sources: set[int] = set()
        written: set[int] = set()
        for i, part in enumerate(parts):
            if i == 0 and not is_store:
                written |= _registers(part, width if opcode.startswith("LD") else 1)
            else:
                sources |= _registers(part, width if is_store and "[" not in part else 1)
        outstanding = [regs for regs in outstanding if not (regs & (sources | written))]
        if opcode.startswith("LDG.") and ".128" in opcode:
            count += 1
            outstanding.append(written)
            best = max(best, len(outstanding))
    return count, best


def parse_sass(text: str) -> dict[str, list[tuple[str, str]]]:
    functions: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for line in text.splitlines():
        if m := _SASS_FUNCTION.match(line):
            current = functions.setdefault(m.group(1), [])
        elif current is not None and (m := _SASS_INSTRUCTION.search(line)):
            current.append((m.group(2), m.group(3)))
    return functions


def report(nvcc: str, nvdisasm: str, arch: str = "90", out_dir: Path | None = None) -> list[KernelReport]:
    """Every kernel of the three X-type sources for sm_<arch>: registers, spills, 128-bit loads in flight. The
    cubins go to `out_dir`, or to a temporary folder removed after."""
    if out_dir is None:
        with tempfile.TemporaryDirectory(prefix="onnx_norm_sass_") as scratch:
            return report(nvcc, nvdisasm, arch, Path(scratch))
    cubins, log = compile_cubins(nvcc, arch, out_dir)
    reports = parse_ptxas(log)
    for cubin in cubins:
        result = subprocess.run([nvdisasm, "-c", str(cubin)], check=True, capture_output=True, text=True)
        for symbol, instructions in parse_sass(result.stdout).items():
            entry = reports.setdefault(symbol, KernelReport(symbol))
            entry.loads_128, entry.loads_in_flight = loads_in_flight(instructions)
    return sorted(reports.values(), key=lambda r: r.name)


def markdown(reports: list[KernelReport], arch: str) -> str:
    lines = [
        f"| kernel (sm_{arch}) | registers | spill bytes (st/ld) | LDG.E.128 | 16-byte loads in flight |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in reports:
        lines.append(
            f"| `{r.name}` | {r.registers} | {r.spill_stores}/{r.spill_loads} | {r.loads_128} | {r.loads_in_flight} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="90")
    parser.add_argument("--nvcc", default=shutil.which("nvcc"))
    parser.add_argument("--markdown", action="store_true", help="print a markdown table (docs/cuda_kernels.md)")
    args = parser.parse_args(argv)
    nvdisasm = find_nvdisasm(args.nvcc)
    if not args.nvcc or not nvdisasm:
        print("needs nvcc and nvdisasm (pip install nvidia-cuda-nvdisasm)", file=sys.stderr)
        return 2
    reports = report(args.nvcc, nvdisasm, args.arch)
    if args.markdown:
        print(markdown(reports, args.arch))
    else:
        for r in reports:
            print(
                f"{r.name:55s} regs {r.registers:3d}  spills {r.spill_stores}/{r.spill_loads}  "
                f"LDG.128 {r.loads_128:3d}  in flight {r.loads_in_flight}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
