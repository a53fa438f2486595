"""`-q` is "errors only" (issue 31: optimize still printed its three tables). What stays is what a command is run
for: inspect's list of the norms, verify's one PASSED/FAILED line (CI looks for it; its tables go), bench's
measurements; optimize prints nothing at all unless its parity gate fails, and then one line. Run as a user types
it, output piped."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from cli_support import cli
from model_builders import layer_norm_model


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(layer_norm_model(), str(path))
    return path


@pytest.mark.parametrize("verify", [False, True], ids=["optimize", "optimize-verify"])
def test_quiet_optimize_prints_nothing(tmp_path: Path, model: Path, verify: bool) -> None:
    out = tmp_path / "m.opt.onnx"
    loud = cli("optimize", model, "-o", out, *(["--verify"] if verify else []))
    assert loud.returncode == 0 and "fused per rule" in loud.stdout and "ops before and after" in loud.stdout
    out.unlink()
    done = cli("-q", "optimize", model, "-o", out, *(["--verify"] if verify else []))
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")
    assert any(node.domain == "onnx_norm" for node in onnx.load(str(out)).graph.node)


def test_quiet_optimize_says_when_its_gate_fails(tmp_path: Path, model: Path) -> None:
    """No tolerance at all: the fused kernel's rounding differs from the decomposed graph's, so the gate fails."""
    out = tmp_path / "m.opt.onnx"
    done = cli("optimize", model, "-o", out, "--verify", "--atol", "0", "--rtol", "0", "-q")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [f"FAILED parity gate: {out} not written"]
    assert done.stderr == ""
    assert not out.exists()


def test_quiet_verify_keeps_its_verdict_line(tmp_path: Path, model: Path) -> None:
    out = tmp_path / "m.opt.onnx"
    assert cli("optimize", model, "-o", out).returncode == 0
    loud = cli("verify", model, out)
    assert loud.returncode == 0 and len(loud.stdout.splitlines()) > 1
    done = cli("verify", model, out, "-q")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("PASSED | Runtime: "), done.stdout
    assert done.stderr == ""


def test_quiet_inspect_and_bench_keep_their_results(model: Path) -> None:
    done = cli("-q", "inspect", model)
    assert done.returncode == 0 and "1 norm(s) found" in done.stdout and done.stderr == ""
    done = cli("-q", "bench", model, "--repeat", "2", "--warmup", "0")
    assert done.returncode == 0, done.stderr
    assert "speedup (original ORT_ENABLE_ALL / optimized" in done.stdout and done.stderr == ""


def test_quiet_hides_progress_on_a_terminal(tmp_path: Path, model: Path, monkeypatch) -> None:
    """Progress goes to stderr when it is a terminal (FORCE_COLOR makes rich take the pipe for one): -q hides it."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert "verify: loading the models" in cli("verify", model, model).stderr
    done = cli("-q", "verify", model, model)
    assert done.returncode == 0 and done.stderr == ""
