"""A write that fails after every check passed (the disk filled up; here the file-size limit of the process, which
fails a write with EFBIG as a full disk fails it with ENOSPC): one line naming the path the user gave (`-o`,
`--report`), not the staged file that was being written, exit 2, and nothing left beside it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from cli_support import onnx_norm_command
from model_builders import layer_norm_model

# Files of at most argv[1] bytes, then exec the command: a longer write fails (EFBIG) instead of killing the process
# (SIGXFSZ, ignored: an ignored signal stays ignored across exec, and so does the limit). A wrapper, not a
# preexec_fn, which is unsafe in a test process that runs threads.
_LIMITED = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
os.execv(sys.argv[2], sys.argv[2:])
"""


def _run_limited(argv: list[str], max_bytes: int) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", _LIMITED, str(max_bytes), *onnx_norm_command(), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(layer_norm_model(), str(path))
    assert path.stat().st_size > 300  # the limit below stops its optimized copy
    return path


@pytest.mark.parametrize("external", ["never", "always"])
def test_a_failed_model_write_names_the_output(tmp_path: Path, model: Path, external: str) -> None:
    out = tmp_path / "out" / "m.opt.onnx"
    out.parent.mkdir()
    done = _run_limited(["optimize", str(model), "-o", str(out), "--external-data", external], 300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"onnx-norm optimize: error: {out}: cannot write: File too large"]
    assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_failed_report_write_names_the_report(tmp_path: Path, model: Path, command: str) -> None:
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    models = [str(model)] if command == "inspect" else [str(model), str(model)]
    done = _run_limited([command, *models, "--report", str(report)], 1000)  # a report is longer than 1000 bytes
    assert done.returncode == 2, done.stderr
    line = done.stderr.splitlines()[-1]
    assert line.startswith(f"onnx-norm {command}: error: ") and line.endswith(f"{report}: File too large"), line
    assert ".report.json." not in line  # the staged file's name
    assert "Traceback" not in done.stderr
    assert list(report.parent.iterdir()) == []
