"""Paths of the repository the tests read (one source: the tests live in folders of different depths)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
EXAMPLES = REPO / "examples"
TOOLS = REPO / "tools"
GPU_HARNESS = TOOLS / "gpu_harness"
