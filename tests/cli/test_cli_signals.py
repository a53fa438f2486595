"""SIGTERM and SIGHUP stop a command as Ctrl-C does (issue 31): CI runners cancelling a job and `timeout` send
SIGTERM, a closed terminal SIGHUP. One line on stderr naming the signal, exit 128 + N (143, 129; 130 for Ctrl-C),
no traceback, nothing written: no output, no report, no staging folder beside the output.

A signal must come while the command is at a chosen step. Sent at a guessed moment it races the command (the tiny
models here are written in milliseconds), so the step is held instead: the child runs the CLI's `main` with
`onnx_ir.save` wrapped to write the staged model and then wait, and the signal is sent once the child says it is
held there, with the staging folder on disk. A second test runs the installed `onnx-norm` unchanged, in a bench
whose timing loop would last far longer than the test waits, signalled once it says it has started timing.

The child's signals are set to their defaults first, as in a terminal: a test runner may ignore SIGINT or SIGHUP
(`nohup`), and an ignored signal stays ignored across exec (the CLI leaves an ignored signal ignored, as `nohup`
asks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from cli_support import onnx_norm_command
from model_builders import layer_norm_model

_DEFAULT_SIGNALS = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
"""

_HELD_IN_THE_WRITE = (
    _DEFAULT_SIGNALS
    + """
import sys, time
import onnx_ir
from onnx_norm.cli import main

save = onnx_ir.save

def held(*args, **kwargs):
    save(*args, **kwargs)  # the staged model is on disk, beside the output
    print("held in the write", file=sys.stderr, flush=True)
    time.sleep(60)

onnx_ir.save = held
sys.exit(main(sys.argv[1:]))
"""
)

_STOPPED_LINE = {
    signal.SIGINT: "onnx-norm: interrupted; nothing written",
    signal.SIGTERM: "onnx-norm: stopped by SIGTERM; nothing written",
    signal.SIGHUP: "onnx-norm: stopped by SIGHUP; nothing written",
}


def _wait_for(process: subprocess.Popen, text: str) -> list[str]:
    """The child's stderr lines up to the first that contains `text` (all of them if it ends first)."""
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if text in line:
            break
    return seen


def _tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
def test_a_signal_mid_write_is_one_line_and_leaves_nothing(tmp_path: Path, signum: int, external: bool) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(layer_norm_model(), str(source))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    argv = ["optimize", str(source), "-o", str(out_dir / "m.opt.onnx"), "--report", str(out_dir / "r.json")]
    argv += ["--external-data", "always" if external else "never"]
    command = [sys.executable, "-c", _HELD_IN_THE_WRITE, *argv]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        seen = _wait_for(process, "held in the write")
        assert seen and "held in the write" in seen[-1], seen
        staged = _tree(out_dir)  # what the issue found left behind: .onnx-norm-XXXX/.m.opt.onnx.YYYY/m.opt.onnx
        assert any(name.startswith(".onnx-norm-") and name.endswith("/m.opt.onnx") for name in staged), staged
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=50)
    assert process.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert stderr.strip().splitlines() == [_STOPPED_LINE[signum]]
    assert stdout == ""
    assert _tree(out_dir) == []  # no output, no data file, no report, no staging folder


def test_sigterm_stops_the_installed_command_in_its_timing_loop(tmp_path: Path) -> None:
    """`onnx-norm bench` as installed, nothing patched: a million timed rounds would take many minutes, so the
    signal, sent once the weights line says the sessions are being made, always comes before the end."""
    source = tmp_path / "m.onnx"
    onnx.save(layer_norm_model(), str(source))
    report = tmp_path / "out" / "bench.json"
    report.parent.mkdir()
    argv = ["-v", "bench", str(source), "--repeat", "1000000", "--warmup", "0", "--report", str(report)]
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    command = [*onnx_norm_command(), *argv]
    # As started from a terminal (see the module's docstring): default dispositions in the child.
    restore = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGHUP)}
    for number in restore:
        signal.signal(number, signal.SIG_DFL)
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    finally:
        for number, handler in restore.items():
            signal.signal(number, handler)
    with process:
        seen = _wait_for(process, "INFO onnx_norm.bench: weights:")
        assert seen and "weights:" in seen[-1], seen
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == _STOPPED_LINE[signal.SIGTERM]
    assert stdout == ""
    assert _tree(report.parent) == []


def test_the_library_installs_no_handler_and_main_restores_them(tmp_path: Path) -> None:
    """Handlers only while the CLI runs: importing onnx_norm (and running `main` in a program of one's own) leaves
    the program's SIGTERM and SIGHUP as they were; an ignored signal stays ignored during the command."""
    script = (
        "import signal\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "import onnx_norm, onnx_norm.cli\n"
        "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
        "seen = {}\n"
        "import onnx_norm.cli.inspect as inspect_cli\n"
        "run = inspect_cli.run\n"
        "def spy(args):\n"
        "    seen['term'] = signal.getsignal(signal.SIGTERM)\n"
        "    seen['hup'] = signal.getsignal(signal.SIGHUP)\n"
        "    return run(args)\n"
        "inspect_cli.run = spy\n"
        "import sys\n"
        "code = onnx_norm.cli.main(['inspect', sys.argv[1]])\n"
        "assert code == 0, code\n"
        "assert callable(seen['term']) and seen['term'] not in (signal.SIG_DFL, signal.SIG_IGN), seen\n"
        "assert seen['hup'] == signal.SIG_IGN, seen\n"
        "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
        "assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN\n"
        "print('ok')\n"
    )
    source = tmp_path / "m.onnx"
    onnx.save(layer_norm_model(), str(source))
    done = subprocess.run(
        [sys.executable, "-c", _DEFAULT_SIGNALS + script, str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "ok"
