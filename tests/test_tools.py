"""The tools/ scripts still run against the package (a smoke run each, tiny sizes; their numbers are not checked)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import onnxruntime
import pytest

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


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--vocab", "2"], "--vocab must be at least 3"),
        (["--hidden", "100", "--heads", "16"], "multiple of --heads"),
        (["--cuda-graph"], "--cuda-graph needs --provider cuda"),
    ],
)
def test_bench_models_rejects_bad_sizes_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The script's main() in this process: a bad flag is refused before anything is built (a process per case
    would pay ~2 CPU-s of imports for an argparse error; the smoke runs above run the script as typed)."""
    with pytest.raises(SystemExit) as exited:
        _script("bench_models").main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_ort_fusion_cases_counts_every_positive_case() -> None:
    done = _run("tools/ort_fusion_cases.py")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith(f"{len(lines) - 1} positive cases; onnx-norm fuses all"), lines[-1]
    assert all("extended=" in line and "all=" in line for line in lines[:-1])
