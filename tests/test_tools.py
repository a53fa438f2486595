"""The tools/ scripts still run against the package (a smoke run each, tiny sizes; their numbers are not checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_bench_models_runs_on_a_tiny_configuration(tmp_path: Path) -> None:
    done = _run(
        "tools/bench_models.py",
        *("--hidden", "64", "--layers", "1", "--heads", "2", "--sequence", "16"),
        *("--dtype", "fp32", "--exporter", "dynamo", "--warmup", "0", "--repeat", "2", "--keep", str(tmp_path)),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "speedup" in done.stdout
    assert list(tmp_path.glob("*.onnx")), "the exported model was not kept"
