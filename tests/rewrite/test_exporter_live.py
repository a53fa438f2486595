"""The exporter fixtures re-exported live, with whatever exporter versions are installed (ONNX_NORM_FULL_ZOO=1).

tests/rewrite/test_exporter_fixtures.py checks the committed fixtures; this module runs tools/make_exporter_fixtures.py
for each family into a temporary folder and checks its output the same way, so a new exporter release is tried as
soon as it is installed. TensorFlow, JAX, Paddle, the genai builder and optimum usually live in their own virtual
environments: ONNX_NORM_EXPORTER_PYTHON_<FAMILY> (e.g. ONNX_NORM_EXPORTER_PYTHON_TF2ONNX=/venvs/tf/bin/python)
names the Python to run a family with; by default it is this one, and a family whose exporter that Python cannot
import is skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from repo_paths import TOOLS
from test_exporter_fixtures import KNOWN_MISSES, check_fused_with_parity, load_manifest
from test_group_norm_timm import timm_env

FULL_ZOO = os.environ.get("ONNX_NORM_FULL_ZOO", "") not in ("", "0")
pytestmark = pytest.mark.skipif(not FULL_ZOO, reason="live exports run with ONNX_NORM_FULL_ZOO=1")

GENERATOR = TOOLS / "make_exporter_fixtures.py"
# The module each family cannot run without.
FAMILIES = {
    "tf2onnx": "tf2onnx",
    "jax2onnx": "jax2onnx",
    "paddle2onnx": "paddle2onnx",
    "onnxscript": "onnxscript",
    "onnx-functions": "onnx",
    "timm": "timm",
    "diffusers": "diffusers",
    "toolchains": "onnxslim",
    "genai": "onnxruntime_genai",
    "optimum": "optimum.exporters.onnx",
}


def _python(family: str) -> str:
    return os.environ.get(f"ONNX_NORM_EXPORTER_PYTHON_{family.upper().replace('-', '_')}", sys.executable)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """`exported(family) -> folder` with that family's fresh exports and manifest, made once per session."""
    folders: dict[str, Path | str] = {}

    def get(family: str) -> Path:
        if family not in folders:
            python = _python(family)
            # timm (and its torchvision) live in build/timm-site where tools/setup.sh installs them, and import beside
            # the CPU torch through onnx_norm.zoo.compat, as the generator imports them
            env = (timm_env() if family == "timm" and python == sys.executable else None) or dict(os.environ)
            code = f"import {FAMILIES[family]}"
            if family == "timm":
                code = f"from onnx_norm.zoo.compat import tolerate_cuda_torchvision as t; t(); {code}"
            probe = subprocess.run([python, "-c", code], capture_output=True, check=False, env=env)
            if probe.returncode != 0:
                folders[family] = f"{python} cannot import {FAMILIES[family]}"
            else:
                out = tmp_path_factory.mktemp(family)
                run = subprocess.run(
                    [python, str(GENERATOR), "--family", family, "--out", str(out)],
                    capture_output=True,
                    text=True,
                    check=False,
                    timeout=1800,
                    env=env,
                )
                assert run.returncode == 0, f"{family} export failed:\n{run.stderr[-3000:]}"
                folders[family] = out
        found = folders[family]
        if isinstance(found, str):
            pytest.skip(found)
        return found

    return get


@pytest.mark.parametrize("family", list(FAMILIES))
def test_live_export_fuses_every_norm(exported, family: str) -> None:
    folder = exported(family)
    failures, fixed = [], []
    for entry in load_manifest(folder):
        try:
            check_fused_with_parity(onnx.load(folder / entry["file"]), entry["norms"], None, entry["shapes"])
        except AssertionError as err:
            if entry["file"] not in KNOWN_MISSES:
                failures.append(f"{entry['file']}: {str(err).splitlines()[0]}")
        else:
            if entry["file"] in KNOWN_MISSES:
                fixed.append(entry["file"])
    assert not failures, "\n".join(failures)
    assert not fixed, f"now caught, remove from KNOWN_MISSES: {fixed}"
