"""Each op's C++/CUDA code lives in its own files: an identifier that belongs to one op (its name, its attributes, its
argument block, its inputs) appears in no custom_ops/src file but that op's own. The shared machinery (registration,
attribute parsing, the launch and dispatch layers, the row kernels' loop) is generic over the op, so that adding or
removing an op adds or removes files and edits no shared one (issue 23)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "custom_ops" / "src"

# op: (its own files, relative to custom_ops/src; identifiers (case-sensitive regexes) that only they may contain).
OPS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "GroupNorm": (
        frozenset({
            "common/group_norm.h", "common/group_norm.cc", "cpu/group_norm_cpu.h", "cpu/group_norm_cpu.cc",
            "cuda/group_norm_kernels.cuh", "cuda/group_norm_launch.h", "cuda/group_norm.cu",
            "cuda/group_norm_cuda.cc",
        }),
        (r"GroupNorm", r"group_norm", r"num_groups", r"group_channels", r"activation", r"\bSiLU\b", r"kNumGroups"),
    ),
    "ModulatedLayerNorm, ModulatedRMSNorm": (
        frozenset({
            "common/modulation.h", "common/modulation.cc", "cpu/modulated_cpu.h", "cpu/modulated_cpu.cc",
            "cuda/modulated_kernels.cuh", "cuda/modulated_launch.h", "cuda/modulated.cu", "cuda/modulated_cuda.cc",
        }),
        (r"[Mm]odulat", r"mod_scale", r"mod_shift", r"ModScale", r"ModShift", r"mod_batch", r"rows_per_sample",
         r"adaLN"),
    ),
}  # fmt: skip

SOURCES = sorted(path for path in SRC.rglob("*") if path.is_file())


def offenders(own: frozenset[str], identifiers: tuple[str, ...]) -> list[str]:
    """`file:line: text` of every line outside `own` that contains one of `identifiers`."""
    pattern = re.compile("|".join(identifiers))
    found = []
    for path in SOURCES:
        name = path.relative_to(SRC).as_posix()
        if name in own:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize("op", list(OPS))
def test_an_ops_identifiers_appear_only_in_its_own_files(op: str) -> None:
    own, identifiers = OPS[op]
    assert own <= {path.relative_to(SRC).as_posix() for path in SOURCES}, "the table lists a file that is gone"
    found = offenders(own, identifiers)
    assert not found, f"{op}'s identifiers outside its own files:\n" + "\n".join(found)


def test_the_check_finds_an_identifier_in_a_shared_file() -> None:
    """The scan itself: a shared file that names the op is an offender, the op's own file is not."""
    own, identifiers = OPS["GroupNorm"]
    assert offenders(frozenset({p.relative_to(SRC).as_posix() for p in SOURCES}), identifiers) == []
    shared = frozenset(own - {"cuda/group_norm_kernels.cuh"})
    assert any(line.startswith("cuda/group_norm_kernels.cuh:") for line in offenders(shared, identifiers))
