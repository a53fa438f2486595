"""What the kernel tests share: tools/gpu_harness (the ctypes harness, the GPU cases, the emulator build) on
sys.path for every module of this folder, put there once before any of them is imported."""

from __future__ import annotations

import sys

from repo_paths import GPU_HARNESS

if str(GPU_HARNESS) not in sys.path:
    sys.path.insert(0, str(GPU_HARNESS))
