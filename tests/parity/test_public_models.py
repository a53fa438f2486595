"""The parity gate on model files other people made and ship in public packages (tools/setup.sh fetches them into
build/public-models: Silero VAD's and RapidOCR's PaddleOCR models), run as a user types the commands.

- Silero VAD compares its scalar sample rate `sr` with 16000 inside an If: verify feeds it the value the graph
  tests (a random one took a branch the model never takes in use), and says so; its state's batch dim is unnamed,
  so the line for a failed run names the dims that were guessed.
- PaddleOCR's direction classifier stores its batch dim as -1, which ONNX Runtime reads as free: verify, bench and
  `optimize --verify` run it, and `--shape` may fix the dim.
- PP-OCRv4's recogniser has Paddle's LayerNorms in front of residual Adds: fused and verified.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import cli
from repo_paths import REPO

MODELS = REPO / "build" / "public-models"
SILERO = MODELS / "silero_vad.onnx"
CLASSIFIER = MODELS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
RECOGNISER = MODELS / "ch_PP-OCRv4_rec_infer.onnx"

pytestmark = pytest.mark.skipif(
    not (MODELS / ".complete").is_file(), reason="tools/setup.sh did not fetch the public model files"
)
SILERO_SHAPES = ["--shape", "input:1,512", "--shape", "state:2,1,128"]


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_silero_vad_gets_the_sample_rate_its_graph_tests(tmp_path: Path):
    report = tmp_path / "report.json"
    run = cli("verify", SILERO, SILERO, *SILERO_SHAPES, "--report", report)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "inputs: sr=16000 (compared with 16000 in the graph)" in run.stdout
    assert json.loads(report.read_text())["input_values"]["sr"]["value"] == 16000


def test_silero_vad_optimized_passes_the_gate_and_a_set_rate_is_used(tmp_path: Path):
    out = tmp_path / "vad.opt.onnx"
    run = cli("optimize", SILERO, "-o", out, "--verify", *SILERO_SHAPES)
    assert run.returncode == 0, run.stdout + run.stderr
    chosen = cli("verify", SILERO, out, "--shape", "state:2,1,128", "--shape", "input:1,256", "--input", "sr=8000")
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    assert "sr=8000" in chosen.stdout


def test_silero_vad_on_guessed_dims_names_what_to_set():
    run = cli("verify", SILERO, SILERO)
    assert run.returncode == 2
    line = _one_line(run.stderr)
    assert "ONNX Runtime failed to run the original model" in line
    assert "state[1]=128" in line and "--shape" in line and "--input sr=VALUE" in line


@pytest.mark.parametrize("command", ["verify", "bench", "optimize"])
def test_a_batch_dim_stored_as_minus_one_is_free(command: str, tmp_path: Path):
    out = tmp_path / "cls.opt.onnx"
    argv = {
        "verify": ["verify", CLASSIFIER, CLASSIFIER],
        "bench": ["bench", CLASSIFIER, CLASSIFIER, "--warmup", "1", "--repeat", "3"],
        "optimize": ["optimize", CLASSIFIER, "-o", out, "--verify"],
    }[command]
    run = cli(*argv)
    assert run.returncode == 0, run.stdout + run.stderr
    fixed = cli("verify", CLASSIFIER, CLASSIFIER, "--shape", "x:2,3,48,192")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_pp_ocr_v4_recogniser_is_fused_and_verified(tmp_path: Path):
    out, report = tmp_path / "rec.opt.onnx", tmp_path / "rewrite.json"
    run = cli("optimize", RECOGNISER, "-o", out, "--verify", "--shape", "x:1,3,48,320", "--report", report)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(report.read_text())["fused"] > 0
