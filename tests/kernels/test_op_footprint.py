"""Each op's C++/CUDA code and kernel checks live in their own files: an identifier that belongs to one op (its name,
its attributes, its argument block, its inputs) appears in no file of custom_ops/src or tools/gpu_harness, nor in
tools/gpu_check.py, but that op's own. The shared machinery (registration, attribute parsing, the launch and dispatch
layers, the row kernels' loop; the harness entry, the runners and the case loop of the checks) is generic over the
op, so that adding or removing an op adds or removes files and edits no shared one (issue 23). The one exception is
the list of the row ops' check modules (`row_op_checks.CHECKS`), where an op's module takes one line."""

from __future__ import annotations

import re

import pytest
from repo_paths import REPO

SRC, TOOLS = "custom_ops/src/", "tools/gpu_harness/"
# The list of the row ops' check modules (`CHECKS`): a line `"<module>",` there is the module's op's own.
REGISTRY = TOOLS + "row_op_checks.py"

# op: (its own files, relative to the repository; identifiers (case-sensitive regexes) that only they may contain).
OPS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "GroupNorm": (
        frozenset({
            SRC + "common/group_norm.h", SRC + "common/group_norm.cc", SRC + "cpu/group_norm_cpu.h",
            SRC + "cpu/group_norm_cpu.cc", SRC + "cuda/group_norm_kernels.cuh", SRC + "cuda/group_norm_launch.h",
            SRC + "cuda/group_norm.cu", SRC + "cuda/group_norm_cuda.cc", TOOLS + "group_norm_check.py",
        }),
        (r"GroupNorm", r"group_norm", r"num_groups", r"group_channels", r"activation", r"\bSiLU\b", r"kNumGroups"),
    ),
    "GatedRMSNorm": (
        frozenset({
            SRC + "common/gated_norm.h", SRC + "common/gated_norm.cc", SRC + "cpu/gated_norm_cpu.h",
            SRC + "cpu/gated_norm_cpu.cc", SRC + "cuda/gated_norm_kernels.cuh", SRC + "cuda/gated_norm_launch.h",
            SRC + "cuda/gated_norm.cu", SRC + "cuda/gated_norm_cuda.cc", TOOLS + "gated_norm_check.py",
        }),
        (r"GatedRMSNorm", r"GatedNorm", r"gated_norm", r"norm_before_gate", r"kNormBeforeGate", r"gate_after",
         r"GateRow", r"MulGate", r"GateBeforeNorm", r"kGateInput", r"kGateAfterInt"),
    ),
    "ModulatedLayerNorm, ModulatedRMSNorm": (
        frozenset({
            SRC + "common/modulation.h", SRC + "common/modulation.cc", SRC + "cpu/modulated_cpu.h",
            SRC + "cpu/modulated_cpu.cc", SRC + "cuda/modulated_kernels.cuh", SRC + "cuda/modulated_launch.h",
            SRC + "cuda/modulated.cu", SRC + "cuda/modulated_cuda.cc", TOOLS + "modulated_check.py",
        }),
        (r"[Mm]odulat", r"mod_scale", r"mod_shift", r"ModScale", r"ModShift", r"mod_batch", r"rows_per_sample",
         r"adaLN"),
    ),
    "L2Norm": (
        frozenset({
            SRC + "common/l2_norm.h", SRC + "common/l2_norm.cc", SRC + "cpu/l2_norm_cpu.h", SRC + "cpu/l2_norm_cpu.cc",
            SRC + "cuda/l2_norm_kernels.cuh", SRC + "cuda/l2_norm_launch.h", SRC + "cuda/l2_norm.cu",
            SRC + "cuda/l2_norm_cuda.cc", TOOLS + "l2_norm_check.py",
        }),
        (r"L2Norm", r"l2_norm", r"L2_NORM", r"\bL2Job\b", r"l2_epsilon", r"sqrt_cols"),
    ),
}  # fmt: skip

# What is scanned: the library's sources, the kernel checks' modules and the GPU check that runs them.
SOURCES = sorted(
    path.relative_to(REPO).as_posix()
    for path in [*(REPO / SRC).rglob("*"), *(REPO / TOOLS).rglob("*"), REPO / "tools" / "gpu_check.py"]
    if path.is_file() and "__pycache__" not in path.parts
)


def _registered(line: str, own: frozenset[str]) -> bool:
    """A line of the registry's list that names one of `own`'s check modules."""
    entry = re.fullmatch(r'\s*"(\w+)",\s*', line)
    return entry is not None and f"{TOOLS}{entry.group(1)}.py" in own


def offenders(own: frozenset[str], identifiers: tuple[str, ...], sources: list[str] = SOURCES) -> list[str]:
    """`file:line: text` of every line outside `own` that contains one of `identifiers`."""
    pattern = re.compile("|".join(identifiers))
    found = []
    for name in sources:
        if name in own:
            continue
        for number, line in enumerate((REPO / name).read_text().splitlines(), 1):
            if pattern.search(line) and not (name == REGISTRY and _registered(line, own)):
                found.append(f"{name}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize("op", list(OPS))
def test_an_ops_identifiers_appear_only_in_its_own_files(op: str) -> None:
    own, identifiers = OPS[op]
    assert own <= set(SOURCES), "the table lists a file that is gone"
    found = offenders(own, identifiers)
    assert not found, f"{op}'s identifiers outside its own files:\n" + "\n".join(found)


def test_the_check_finds_an_identifier_in_a_shared_file() -> None:
    """The scan itself: a shared file that names the op is an offender, the op's own file is not; the registry's
    line for the op's check module is the op's, any other line of it that names the op is not."""
    own, identifiers = OPS["GroupNorm"]
    assert offenders(frozenset(SOURCES), identifiers) == []
    for mine in (SRC + "cuda/group_norm_kernels.cuh", TOOLS + "group_norm_check.py"):
        assert any(line.startswith(f"{mine}:") for line in offenders(own - {mine}, identifiers)), mine
    registry = (REPO / REGISTRY).read_text().splitlines()
    assert sum(_registered(line, own) for line in registry) == 1
    assert not _registered('    "group_norm_check",', own - {TOOLS + "group_norm_check.py"})
    assert not _registered('    "group_norm_check",  # GroupNorm', own)
