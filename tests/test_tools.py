"""The tools/ scripts still run against the package (a smoke run each, tiny sizes; their numbers are not checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnxruntime

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
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers() or not _has_gpu():
        # The kept model again, on a provider this machine cannot run: one line and exit 2, not a traceback.
        done = _run(
            "tools/bench_models.py",
            *("--hidden", "64", "--layers", "1", "--heads", "2", "--sequence", "16", "--dtype", "fp32"),
            *("--exporter", "dynamo", "--repeat", "1", "--keep", str(tmp_path), "--provider", "cuda"),
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr and "bench_models: asked for CUDAExecutionProvider" in done.stderr


def _has_gpu() -> bool:
    return Path("/dev/nvidia0").exists()


def test_bench_models_with_a_vocabulary_smaller_than_the_zoo_default(tmp_path: Path) -> None:
    """The trace's token ids come from the configured vocabulary (they once came from the zoo's and overflowed)."""
    done = _run(
        "tools/bench_models.py",
        *("--hidden", "32", "--layers", "1", "--heads", "2", "--sequence", "8", "--vocab", "40"),
        *("--dtype", "fp32", "--warmup", "0", "--repeat", "1", "--keep", str(tmp_path)),
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_bench_models_rejects_bad_sizes_with_a_message() -> None:
    done = _run("tools/bench_models.py", "--vocab", "2")
    assert done.returncode == 2
    assert "--vocab must be at least 3" in done.stderr
    done = _run("tools/bench_models.py", "--hidden", "100", "--heads", "16")
    assert done.returncode == 2
    assert "multiple of --heads" in done.stderr
    done = _run("tools/bench_models.py", "--cuda-graph")
    assert done.returncode == 2
    assert "--cuda-graph needs --provider cuda" in done.stderr


def test_ort_fusion_cases_counts_every_positive_case() -> None:
    done = _run("tools/ort_fusion_cases.py")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith(f"{len(lines) - 1} positive cases; onnx-norm fuses all"), lines[-1]
    assert all("extended=" in line and "all=" in line for line in lines[:-1])
