"""Fixtures for the zoo tests (a plugin of tests/rewrite/test_zoo.py; kept out of conftest.py, which other test modules
own). Exports are cached on disk (ONNX_NORM_ZOO_CACHE, default ~/.cache/onnx-norm/zoo) and in memory for the session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from onnx_norm import zoo


@pytest.fixture(scope="session")
def zoo_cache_dir() -> Path:
    return zoo.default_cache_dir()


@pytest.fixture(scope="session")
def zoo_export(zoo_cache_dir: Path):
    """`zoo_export(model, exporter, dtype) -> ZooExport`, skipping the test where the exporter cannot export
    the model (the reason is the exporter's own error)."""
    exports: dict[tuple[str, str, str], zoo.ZooExport | str] = {}

    def get(model: str, exporter: str, dtype: str) -> zoo.ZooExport:
        key = (model, exporter, dtype)
        if key not in exports:
            try:
                exports[key] = zoo.export(model, exporter, dtype, zoo_cache_dir)  # type: ignore[arg-type]
            except zoo.ZooExportError as err:
                exports[key] = str(err)
        found = exports[key]
        if isinstance(found, str):
            pytest.skip(f"exporter failure: {found}")
        return found

    return get
