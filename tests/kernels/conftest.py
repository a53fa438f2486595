"""What the kernel tests share: tools/gpu_harness (the ctypes harness, the GPU cases, the emulator build) on
sys.path for every module of this folder, put there once before any of them is imported, and the harness fixture
of the row ops' emulator tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from repo_paths import GPU_HARNESS

if str(GPU_HARNESS) not in sys.path:
    sys.path.insert(0, str(GPU_HARNESS))


@pytest.fixture(scope="module")
def harness(emulator_library: Path) -> Any:
    """The ctypes entry of the emulator build (`emulator_library`, emulator_fixtures.py) for a row op's cases."""
    import row_op_checks

    return row_op_checks.Harness(emulator_library)
