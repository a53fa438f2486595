"""timm's GroupNorm1 models (GroupNorm with one group: a LayerNorm over C, H and W), exported live by both torch
exporters and fused with parity: PoolFormer (GroupNorm1 with bias) and PoolFormerV2 (GroupNorm1NoBias), at toy
sizes in the default run, and the registered `poolformer_s12` / `poolformerv2_s12` with ONNX_NORM_FULL_ZOO=1.

timm needs torchvision, whose PyPI wheel is a CUDA build whose C ops cannot load beside this project's CPU torch, and
transformers imports torchvision whenever it finds it (it then fails). So tools/setup.sh installs the pinned timm and
torchvision into a folder of their own (build/timm-site, or ONNX_NORM_TIMM_SITE) instead of the venv, and the exports
run in a child process (tools/make_exporter_fixtures.py, families timm-groupnorm and timm-groupnorm-registered) with
that folder on its PYTHONPATH; a Python that imports timm itself runs them as it is. Without either, the tests skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import helper
from repo_paths import REPO
from test_exporter_fixtures import check_fused_with_parity

ROOT = REPO
GENERATOR = ROOT / "tools" / "make_exporter_fixtures.py"
TIMM_SITE = Path(os.environ.get("ONNX_NORM_TIMM_SITE", ROOT / "build" / "timm-site"))
FULL_ZOO = os.environ.get("ONNX_NORM_FULL_ZOO", "") not in ("", "0")
EXPORTERS = ("torchscript", "dynamo")
CASES = [("timm-groupnorm", f"{model}-{e}") for model in ("poolformer", "poolformerv2") for e in EXPORTERS]
FULL_CASES = [
    ("timm-groupnorm-registered", f"{m}-{e}") for m in ("poolformer_s12", "poolformerv2_s12") for e in EXPORTERS
]


def timm_env() -> dict[str, str] | None:
    """The environment in which this Python imports timm (build/timm-site on PYTHONPATH where timm is there), or
    None when it cannot."""
    env = dict(os.environ)
    if (TIMM_SITE / "timm").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TIMM_SITE), env.get("PYTHONPATH", "")) if p)
    probe = [sys.executable, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('timm') is None)"]
    return env if subprocess.run(probe, env=env, check=False).returncode == 0 else None


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """`exported(family) -> {name: manifest entry}` with the family's fresh exports, made once per module."""
    env = timm_env()
    if env is None:
        pytest.skip(f"timm is not importable here nor from {TIMM_SITE} (bash tools/setup.sh installs it)")
    made: dict[str, dict[str, dict]] = {}

    def get(family: str) -> dict[str, dict]:
        if family not in made:
            out = tmp_path_factory.mktemp(family)
            run = subprocess.run(
                [sys.executable, str(GENERATOR), "--family", family, "--out", str(out)],
                capture_output=True,
                text=True,
                check=False,
                env=env,
                timeout=900,
            )
            assert run.returncode == 0, f"{family} export failed:\n{run.stderr[-3000:]}"
            entries = json.loads((out / "manifest.json").read_text())[family]
            made[family] = {e["file"]: dict(e, path=out / e["file"]) for e in entries}
        return made[family]

    return get


@pytest.mark.parametrize(
    ("family", "name"),
    [
        *CASES,
        *(pytest.param(*c, marks=pytest.mark.skipif(not FULL_ZOO, reason="ONNX_NORM_FULL_ZOO=1")) for c in FULL_CASES),
    ],
    ids=[n for _, n in CASES + FULL_CASES],
)
def test_timm_group_norm_1_models_fuse_with_parity(exported, family: str, name: str) -> None:
    """Every GroupNorm1 the forward pass ran becomes one GroupNorm of one group (nothing of InstanceNormalization's
    route left), the model's LayerNorms fused beside them, and the optimized model gives ONNX Runtime's numbers for
    the original (onnx_norm.verify: fp32 tolerance, and no farther from float64 than the original)."""
    entry = exported(family)[f"{family}-{name}.onnx"]
    original = onnx.load(str(entry["path"]))
    assert entry["group_norms"] > 0 and entry["norms"] > entry["group_norms"]
    optimized = check_fused_with_parity(original, entry["norms"], None, entry["shapes"])
    groups = [n for n in optimized.graph.node if n.op_type == "GroupNorm"]
    assert len(groups) == entry["group_norms"]
    assert {helper.get_attribute_value(a) for n in groups for a in n.attribute if a.name == "num_groups"} == {1}
    assert "InstanceNormalization" not in {n.op_type for n in optimized.graph.node}
