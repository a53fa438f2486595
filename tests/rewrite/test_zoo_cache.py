"""Where the zoo's export cache lives and what its key holds: shared between clones (as pip's cache is), so an export
made by other code or other versions must be another entry, never a stale graph served to the tests."""

from __future__ import annotations

import importlib
import shutil
import tempfile
from pathlib import Path

import pytest

# The module: `onnx_norm.zoo.export` is also the name of its export function in the package's namespace.
zoo_export = importlib.import_module("onnx_norm.zoo.export")


def test_the_cache_is_the_users_unless_the_variable_names_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(zoo_export.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert zoo_export.default_cache_dir() == tmp_path / "xdg" / "onnx-norm" / "zoo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert zoo_export.default_cache_dir() == tmp_path / "home" / ".cache" / "onnx-norm" / "zoo"
    monkeypatch.setenv(zoo_export.CACHE_ENV, str(tmp_path / "mine"))
    assert zoo_export.default_cache_dir() == tmp_path / "mine"


def test_a_cache_folder_that_cannot_be_made_falls_back_to_the_temp_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(zoo_export.CACHE_ENV, raising=False)
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    assert zoo_export.default_cache_dir() == Path(tempfile.gettempdir()) / "onnx-norm-zoo"


def test_the_key_changes_with_the_zoo_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    package = Path(zoo_export.__file__).parent
    copy = tmp_path / "zoo"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(zoo_export, "__file__", str(copy / "export.py"))
    zoo_export._source_fingerprint.cache_clear()
    try:
        before = zoo_export._source_fingerprint()
        (copy / "models.py").write_text((copy / "models.py").read_text() + "\n# a changed config\n")
        zoo_export._source_fingerprint.cache_clear()
        assert zoo_export._source_fingerprint() != before
    finally:
        monkeypatch.undo()
        zoo_export._source_fingerprint.cache_clear()
    assert zoo_export._source_fingerprint() in zoo_export._versions()
