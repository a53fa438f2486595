"""Runs the test suite on every core when pytest-xdist is installed (the `test` extras install it), so that the
README's `python -m pytest -q tests` uses both of CI's cores without a flag. `-n 0` (or `-p no:xdist`) runs in one
process; `-n N` picks the count. Kept in a conftest rather than in pytest's addopts so that an environment
without pytest-xdist still runs the suite, in one process.

Tests go to the workers module by module (`--dist loadscope`): a module's fixtures (the sm_90 cubins, the
emulator builds) are built once, not once per worker. Heavy artefacts that several modules share belong in
session fixtures backed by a cache on disk that is safe for concurrent writers (tests/zoo_fixtures.py)."""

from __future__ import annotations

import pytest


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
