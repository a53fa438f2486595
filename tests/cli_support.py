"""Running the onnx-norm CLI from the tests: as a user types it, or in this process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def onnx_norm_command() -> list[str]:
    """The `onnx-norm` script beside this Python (where the install put it), else `python -m onnx_norm`."""
    script = Path(sys.executable).with_name("onnx-norm")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "onnx_norm"]


def cli(*argv: str | Path, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `onnx-norm ARGV` with stdout and stderr piped (not a terminal), as CI and `| tee` run it."""
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    command = [*onnx_norm_command(), *map(str, argv)]
    return subprocess.run(command, check=False, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def in_process(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """`main(ARGV)` in this process: (exit code, stdout, stderr), both captured (not a terminal, as when piped)."""
    from onnx_norm.cli import main

    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("COLUMNS", raising=False)  # as `cli` runs it
        code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err
