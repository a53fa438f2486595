"""The root conftest's distribution of the tests over pytest-xdist workers (conftest.py): the tests of one
`xdist_group` mark, and the unmarked tests of one module, run on one worker (a module fixture is built once), the
units start longest first (HEAVY_FIRST), and nothing is left behind. Run on a tiny suite of its own, in a
subprocess, with the repository's conftest.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("xdist")

ROOT = Path(__file__).resolve().parents[1]

SUITE = """
import json, os, time
from pathlib import Path

import pytest

LOG = Path(os.environ["SCHEDULING_LOG"])


def record(name):
    with LOG.open("a") as log:
        log.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"], time.monotonic()]) + "\\n")


@pytest.mark.parametrize("i", range(3))
def test_light(i):
    record(f"light{i}")


@pytest.mark.xdist_group("heavy-a")
@pytest.mark.parametrize("i", range(3))
def test_a(i):
    record(f"a{i}")
    time.sleep(0.2)


@pytest.mark.parametrize("i", [pytest.param(i, marks=pytest.mark.xdist_group("heavy-b")) for i in range(3)])
def test_b(i):
    record(f"b{i}")
    time.sleep(0.2)
"""


def test_groups_stay_on_one_worker_and_the_heaviest_start_first(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    (suite / "tests").mkdir(parents=True)
    conftest = (ROOT / "conftest.py").read_text()
    assert conftest.count("HEAVY_FIRST = (") == 1
    # The same conftest with this suite's units in HEAVY_FIRST.
    conftest = conftest.replace("HEAVY_FIRST = (", 'HEAVY_FIRST = (\n    "heavy-b",\n    "heavy-a",', 1)
    (suite / "conftest.py").write_text(conftest)
    (suite / "tests" / "test_suite.py").write_text(SUITE)
    log = tmp_path / "log.jsonl"
    # The README's command (no -n, no --dist: the conftest's defaults), on two workers whatever the machine.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env.update(SCHEDULING_LOG=str(log), PYTEST_XDIST_AUTO_NUM_WORKERS="2")
    before = set(Path(tempfile.gettempdir()).glob("onnx-norm-xdist-*"))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "9 passed" in done.stdout
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    worker = {name: gw for name, gw, _ in runs}
    assert len({worker["a0"], worker["a1"], worker["a2"]}) == 1
    assert len({worker["b0"], worker["b1"], worker["b2"]}) == 1
    assert len({worker["light0"], worker["light1"], worker["light2"]}) == 1  # the module's unmarked tests
    assert worker["a0"] != worker["b0"]
    # Each worker's first test: the two heavy units start at once, before the module's light tests.
    first = {}
    for name, gw, _ in sorted(runs, key=lambda run: run[2]):
        first.setdefault(gw, name)
    assert sorted(first.values()) == ["a0", "b0"]
    assert set(Path(tempfile.gettempdir()).glob("onnx-norm-xdist-*")) <= before  # its folder removed
    shutil.rmtree(suite)
