"""Data files reached through links (issue 20): ONNX Runtime reads a hard-linked data file and refuses one that a
symbolic link leads out of the model's folder; onnx and onnx-ir refuse both. Each command works where ORT does and
says why in one line, exit 2, where ORT refuses too; never a traceback."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import onnx
import pytest
from memory_tools import memory_check

from onnx_norm.cli import main


@pytest.fixture
def real(tmp_path: Path) -> Path:
    path = tmp_path / "real" / "m.onnx"
    args = {"shape": "blocks", "layers": 2, "hidden": 64, "intermediate": 128, "dtype": "float32"}
    memory_check.build(path, argparse.Namespace(**args, layout="onnx", data_dir=None))
    return path


def test_a_hard_linked_data_file_works_as_in_onnx_runtime(real: Path, tmp_path: Path) -> None:
    folder = tmp_path / "linked"
    folder.mkdir()
    shutil.copy(real, folder / "m.onnx")
    os.link(real.parent / "m.onnx.data", folder / "m.onnx.data")
    source, out = str(folder / "m.onnx"), tmp_path / "out" / "o.onnx"
    out.parent.mkdir()
    assert main(["optimize", source, "-o", str(out), "--verify", "--external-data", "always"]) == 0
    assert sum(node.domain == "onnx_norm" for node in onnx.load(str(out), load_external_data=False).graph.node) == 2
    assert main(["verify", source, str(out)]) == 0
    assert main(["bench", source, "--repeat", "2", "--warmup", "0"]) == 0
    assert os.stat(folder / "m.onnx.data").st_nlink == 2  # the input is left as it was


def test_a_data_file_linked_from_another_folder_is_one_line(real: Path, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "symlinked"
    folder.mkdir()
    shutil.copy(real, folder / "m.onnx")
    (folder / "m.onnx.data").symlink_to(real.parent / "m.onnx.data")
    source = str(folder / "m.onnx")
    for argv in (["optimize", source, "-o", str(tmp_path / "o.onnx")], ["bench", source], ["verify", source, source]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "m.onnx.data" in err, err
        assert "Traceback" not in err


def test_a_symlinked_model_file_looks_for_its_data_beside_the_link(real: Path, tmp_path: Path, capsys) -> None:
    """ONNX Runtime and onnx look for the data beside the link, and do not find it: one line saying so."""
    folder = tmp_path / "link"
    folder.mkdir()
    (folder / "m.onnx").symlink_to(real)
    assert main(["optimize", str(folder / "m.onnx"), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is missing" in err and "symbolic link to" in err, err
