"""tools/check_spills.sh, the spill gate of tools/setup.sh and tools/build_wheel.sh: a ptxas log without spills
passes, a spill fails, and a spill listed in custom_ops/known_spills.txt passes only with its exact byte counts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from repo_paths import REPO

ROOT = REPO
KERNEL = "_ZN9onnx_norm4cuda17RegisterRowKernelIfLi2ELi5EEEvNS0_8NormArgsE"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _known() -> list[tuple[str, str, int, int]]:
    rows = []
    for line in (ROOT / "custom_ops" / "known_spills.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            arch, kernel, stores, loads = line.split()
            rows.append((arch, kernel, int(stores), int(loads)))
    return rows


def _log(tmp_path: Path, entries: list[tuple[str, str, int, int]]) -> Path:
    lines = []
    for arch, kernel, stores, loads in entries:
        lines.append(f"  ptxas info    : Compiling entry function '{kernel}' for '{arch}'")
        lines.append(f"      0 bytes stack frame, {stores} bytes spill stores, {loads} bytes spill loads")
    path = tmp_path / "build.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def _check(log: Path) -> subprocess.CompletedProcess[str]:
    script = ROOT / "tools" / "check_spills.sh"
    return subprocess.run(["bash", str(script), str(log)], capture_output=True, text=True, check=False)


def test_no_spills_pass_and_name_the_architectures(tmp_path: Path) -> None:
    done = _check(_log(tmp_path, [("sm_90", KERNEL, 0, 0), ("sm_80", KERNEL, 0, 0)]))
    assert done.returncode == 0, done.stderr
    assert "in 2 kernel compilations (sm_80 sm_90)" in done.stdout


def test_an_unlisted_spill_fails_and_its_objects_are_rebuilt_next_time(tmp_path: Path) -> None:
    """The build directory is incremental, so the failing check removes the CUDA objects the log's build made:
    otherwise a second build would compile nothing, report nothing and pass."""
    build = tmp_path / "build"
    cuda_object = build / "CMakeFiles" / "onnx_norm_ops.dir" / "src" / "cuda" / "norm_float32.cu.o"
    cxx_object = build / "CMakeFiles" / "onnx_norm_ops.dir" / "src" / "register.cc.o"
    for path in (cuda_object, cxx_object):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    log = _log(tmp_path, [("sm_90", KERNEL, 0, 0), ("sm_90", KERNEL, 8, 8)])
    log.write_text(f"  -- Build files have been written to: {build}\n" + log.read_text())
    done = _check(log)
    assert done.returncode == 1
    assert f"SPILL: sm_90 {KERNEL}: 8 bytes stored, 8 loaded" in done.stderr
    assert not cuda_object.exists() and cxx_object.exists()


def test_a_known_spill_passes_only_with_its_exact_counts(tmp_path: Path) -> None:
    known = _known()
    assert known, "custom_ops/known_spills.txt lists no spill: the test needs one"
    done = _check(_log(tmp_path, known))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("known spill") == len(known)
    arch, kernel, stores, loads = known[0]
    grown = _check(_log(tmp_path, [(arch, kernel, stores, loads + 4)]))
    assert grown.returncode == 1
    assert f"SPILL: {arch} {kernel}" in grown.stderr
