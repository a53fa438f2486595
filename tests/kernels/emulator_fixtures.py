"""The CPU emulator of the CUDA kernels (tools/gpu_harness/emulator.cc with the real launcher and harness entry),
built once per test run and shared by the modules that run cases on it (tests/kernels/test_cuda_build.py,
tests/kernels/test_adaln_cuda.py and tests/kernels/test_group_norm_cuda.py load this plugin): each build is ~11 CPU-s
of g++, and
the modules built the same library. The folder is the run's, shared by its pytest-xdist workers under a file lock,
so a second worker that asks while the build is under way waits for it; nothing outlives the run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import gpu_build
import pytest
from filelock import FileLock

#: The mark of the tests that run cases on the emulator: it needs the CUDA headers (cuda_fp16.h) and g++.
needs_emulator = pytest.mark.skipif(
    gpu_build.find_cuda_include(gpu_build.find_nvcc(None)) is None or shutil.which("g++") is None,
    reason="the CPU emulator of the kernels needs the CUDA headers (cuda_fp16.h) and g++",
)


def _run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this test run: with pytest-xdist, the parent of the workers' own base folders."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def emulator_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """libonnx_norm_emulator.so built from the repository's kernels (the tests that use it skip without the CUDA
    headers or g++)."""
    include = gpu_build.find_cuda_include(gpu_build.find_nvcc(None))
    assert include is not None
    folder = _run_folder(tmp_path_factory) / "cuda-emulator"
    with FileLock(f"{folder}.lock"):
        library = folder / "libonnx_norm_emulator.so"
        if not library.is_file():  # built by this run's other worker otherwise
            gpu_build.build_emulator(include, folder)
    return library
