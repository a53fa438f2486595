"""Graphs from the exporters and tool chains people use, beyond torch: tf2onnx, jax2onnx, paddle2onnx, onnxscript,
timm and diffusers through both torch exporters, graphs run through onnxslim/onnxsim, ONNX Runtime's transformers
optimizer or a float16 converter first, and models from the onnxruntime-genai builder and optimum.

The fixtures are small ONNX files made by tools/make_exporter_fixtures.py and committed under tests/data/exporters,
so that CI checks the rewrite on real exporter output without installing TensorFlow, JAX or Paddle. ONNX's own
function expansions of LayerNormalization-17 and RMSNormalization-23 are onnx's own `_expanded` backend test
cases. Every norm must become one fused op (native norm ops taken over), with parity.

Graphs the rewrite misses today are strict xfails that name the miss (KNOWN_MISSES): they turn into failures, to
be removed from the list, once the rewrite catches them. ONNX_NORM_FULL_ZOO=1 also re-runs the exporters live
(tests/rewrite/test_exporter_live.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from repo_paths import DATA, TOOLS

import onnx_norm
from onnx_norm.zoo.detect import decomposed_norms, fused_norms, native_norms

FIXTURES = DATA / "exporters"

# file -> what the rewrite still misses there (each reason says what `onnx-norm inspect --explain` reports). The
# misses first filed here (tf2onnx's GlobalAveragePool mean, CastLike epsilons, RMSNormalization-23's expansion,
# onnxconverter-common's per-consumer input Casts) are fused now and run as ordinary cases.
KNOWN_MISSES: dict[str, str] = {}


def load_manifest(folder: Path = FIXTURES) -> list[dict[str, Any]]:
    manifest = json.loads((folder / "manifest.json").read_text())
    return [dict(entry, family=family) for family, entries in manifest.items() for entry in entries]


def _param(key: str, value: Any) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[key])] if key in KNOWN_MISSES else []
    return pytest.param(value, id=key.removesuffix(".onnx"), marks=marks)


def check_fused_with_parity(
    original: onnx.ModelProto, norms: int, feeds: list[dict[str, np.ndarray]] | None, shapes: Any = None
) -> onnx.ModelProto:
    """Every norm of `original` becomes one fused op, nothing decomposed or native is left, and the optimized model
    (returned) computes what the original computes. A model converted to float16 inside (float32 inputs and outputs
    kept) is held to float16's tolerance: ONNX Runtime's CPU provider runs the original's float16 ops in float32,
    while a fused op rounds its output to float16."""
    take_over = bool(native_norms(original))
    optimized, report = onnx_norm.optimize(original, take_over_native=take_over)
    misses = [(m.reason, m.nodes[:3]) for m in report.near_misses]
    assert not [m for m in report.near_misses if m.error], misses  # onnx-norm's own exceptions are bugs
    fused = sum(fused_norms(optimized).values())
    assert fused == norms, f"fused {fused} of {norms}; near-misses: {misses}"
    assert decomposed_norms(optimized) == [], f"decomposed norms left; near-misses: {misses}"
    assert not native_norms(optimized), f"native norms not taken over: {dict(native_norms(optimized))}"
    onnx.checker.check_model(optimized)
    internal_fp16 = any(t.data_type == onnx.TensorProto.FLOAT16 for t in original.graph.initializer)
    tolerance = {"atol": 1e-2, "rtol": 1e-2} if internal_fp16 else {}
    parity = onnx_norm.verify(original, optimized, inputs=feeds, shapes=shapes, **tolerance)
    failed = [o.message for o in parity.outputs if not o.passed]
    assert parity.passed, failed
    return optimized


@pytest.mark.parametrize("entry", [_param(e["file"], e) for e in load_manifest()])
def test_exporter_fixture_fuses_every_norm(entry: dict[str, Any]) -> None:
    original = onnx.load(FIXTURES / entry["file"])
    in_graph = len(decomposed_norms(original)) + sum(native_norms(original).values())
    assert in_graph == entry["norms"], f"the fixture holds {in_graph} norms, its model computes {entry['norms']}"
    check_fused_with_parity(original, entry["norms"], None, entry["shapes"])


def test_manifest_lists_every_fixture_file() -> None:
    listed = {e["file"] for e in load_manifest()}
    on_disk = {p.name for p in FIXTURES.glob("*.onnx")}
    assert listed == on_disk
    assert all(e["norms"] > 0 and e["versions"] for e in load_manifest())


def test_coverage_tool_counts_the_fixtures_per_tool() -> None:
    """tools/coverage.py --fixtures: one row per fixture of the family, ours against an anchor, with the totals."""
    import subprocess
    import sys

    tool = TOOLS / "coverage.py"
    run = subprocess.run(
        [sys.executable, str(tool), "--fixtures", "paddle2onnx", "-t", "onnx-norm,onnxscript"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    rows = [line.split(" | ") for line in run.stdout.splitlines() if "| paddle2onnx |" in line]
    entries = [e for e in load_manifest() if e["family"] == "paddle2onnx"]
    assert [row[0] for row in rows] == [
        f"| {e['file'].removeprefix('paddle2onnx-').removesuffix('.onnx')}" for e in entries
    ]
    # onnx-norm fuses every one and keeps parity; onnxscript's ORT fusions only keep the native LayerNormalization.
    assert all(row[4].startswith("1/1, ok (") for row in rows), rows
    assert any(row[5].startswith("0/1 ✗, ok (") for row in rows), rows
    assert f"| onnx-norm | {len(entries)}/{len(entries)} | {len(entries)}/{len(entries)} |" in run.stdout
