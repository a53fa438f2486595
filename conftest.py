"""Runs the test suite on every core when pytest-xdist is installed (the `test` extras install it), so that the
README's `python -m pytest -q tests` uses both of CI's cores without a flag. `-n 0` (or `-p no:xdist`) runs in one
process; `-n N` picks the count. Kept in a conftest rather than in pytest's addopts so that an environment
without pytest-xdist still runs the suite, in one process.

Tests go to the workers in work units (`--dist loadscope`, with the units below). A unit is a module unless the
module splits itself with `pytest.mark.xdist_group(name)` marks: a module's fixtures (an emulator build, the sm_90
cubins) are built once, not once per worker, while a module whose tests need different fixtures
(tests/kernels/test_cuda_build.py) or different exports (tests/rewrite/test_zoo.py, one unit per model) spreads over
both cores.
Units start longest first (HEAVY_FIRST, then by number of tests): a long unit started last would hold the run open
on one core while the other idles. Heavy artefacts that several modules share belong in session fixtures backed by
a cache on disk that is safe for concurrent writers (tests/rewrite/zoo_fixtures.py).

pytest-xdist's own `--dist loadgroup` reads the marks from the test ids, which pytest 9 no longer lets it change,
so the workers write each test's unit into a file that the controller's scheduler reads (_UnitScheduling)."""

from __future__ import annotations

import collections
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

# Work units that take longest, started in this order; the rest follow by number of tests. The seconds are rough
# costs on a quiet 2-core machine (`--durations` of a warm quiet run; for the zoo, its cold exports in loaded runs
# scaled down): a unit started last holds the run open on one core. A name no test carries any more orders nothing.
HEAVY_FIRST = (
    "tests/cli/test_cli_routes.py",  # ~65 s in many short tests: a process per CLI call
    "cuda-sm90-cubins",  # ~35 s on both cores: the sm_80 cubins with ptxas's report (sm_90's from the build), SASS
    "tests/model_io/test_big_models.py",  # ~50 s: a 2.06 GiB model written and run by the CLI, the API, GenAI's route
    "tests/integrations/test_integrations_olive.py",  # ~45 s: Olive runs
    "zoo-t5",  # ~40 s cold: encoder and decoder, each export of them twice as long as another model's
    "tests/kernels/test_gpu_models.py",  # ~25 s: tools/device/run_gpu.sh's models stage, dry run
    "cuda-emulator",  # ~40 s: the emulator (built once), the cases of test_{cuda_build,adaln_cuda,group_norm_cuda}
    "tests/test_tools.py",  # ~22 s: tools/bench_models.py exports and benchmarks
    "zoo-gemma2",  # ~20 s cold
    "zoo-whisper",  # ~20 s cold
    "cuda-emulator-mutant",  # ~5 s: an emulator built (at -O0) from an altered copy of the kernels
    "tests/kernels/test_ops_kernels.py",  # ~16 s: the kernels again in a process without SIMD
)

_UNITS_FILE = "units.json"
_UNITS_FOLDER = pytest.StashKey[str]()  # on the controller: where its workers write the units


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return  # no pytest-xdist, or this is one of its workers
    if config.getoption("numprocesses", None) is not None:
        return
    if config.getoption("collectonly") or config.getoption("usepdb"):
        return
    config.option.numprocesses = "auto"
    if config.getoption("dist") == "no":
        config.option.dist = "loadscope"
        config.option.loadscopereorder = False  # the order comes from pytest_collection_modifyitems below


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers the mark; without it (-p no:xdist) the mark is inert and must not warn.
    config.addinivalue_line("markers", "xdist_group(name): run the tests of one name on one pytest-xdist worker")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_UNITS_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _unit(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the workers of a loadscope run: the items ordered unit by unit, longest first (the controller hands
    units out in the order it receives the items), and each test's unit written for the controller."""
    folder = getattr(config, "workerinput", {}).get("onnx_norm_units")
    if folder is None:
        return
    units = {item.nodeid: _unit(item) for item in items}
    sizes = collections.Counter(units.values())
    first_seen = {unit: index for index, unit in enumerate(dict.fromkeys(units.values()))}

    def rank(item: pytest.Item) -> tuple[int, int, int]:
        unit = units[item.nodeid]
        heavy = HEAVY_FIRST.index(unit) if unit in HEAVY_FIRST else len(HEAVY_FIRST)
        return heavy, -sizes[unit], first_seen[unit]

    items.sort(key=rank)
    # Every worker collects the same tests and writes the same map; each writes whole files, moved into place.
    fd, staged = tempfile.mkstemp(dir=folder)
    with os.fdopen(fd, "w") as file:
        json.dump(units, file)
    os.replace(staged, Path(folder) / _UNITS_FILE)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # node: pytest-xdist's WorkerController
    config = node.config
    if config.getoption("dist") != "loadscope":
        return
    if _UNITS_FOLDER not in config.stash:
        config.stash[_UNITS_FOLDER] = tempfile.mkdtemp(prefix="onnx-norm-xdist-")
    node.workerinput["onnx_norm_units"] = config.stash[_UNITS_FOLDER]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadscope" or _UNITS_FOLDER not in config.stash:
        return None
    # pytest-xdist's scheduler with its unit of work (`_split_scope`, private: hence the pinned range in
    # pyproject.toml's test extras) taken from the workers' map.
    from xdist.scheduler import LoadScopeScheduling

    units_file = Path(config.stash[_UNITS_FOLDER]) / _UNITS_FILE

    class _UnitScheduling(LoadScopeScheduling):
        units: dict[str, str] | None = None

        def schedule(self) -> None:
            if self.units is None:  # all workers have collected, so written the map, when this first runs
                self.units = json.loads(units_file.read_text()) if units_file.exists() else {}
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return (self.units or {}).get(nodeid) or super()._split_scope(nodeid)

    return _UnitScheduling(config, log)
