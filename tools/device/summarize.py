"""Write OUT/summary.md from what tools/device/run_gpu.sh left in OUT: the environment (GPU, driver, versions), the
whole-model table (norms found and fused, parity, latency and speedup per sequence length, from the reports of
`onnx-norm optimize/verify/bench`), the examples' parity and the commands that produced them, in Markdown to paste
into the README or docs.

    python tools/device/summarize.py OUT

Reads only; a part of the run that left no files is left out. Exit 1 when OUT has nothing to summarize.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MODELS = ("llama-div", "llama-reciprocal", "bert-decomposed", "bert-native")
WHAT = {
    "llama-div": "RMSNorm, Div(1, Sqrt) (ORT fuses it)",
    "llama-reciprocal": "RMSNorm, Reciprocal(Sqrt) (ORT does not fuse it)",
    "bert-decomposed": "LayerNorm decomposed + residual (ORT fuses it)",
    "bert-native": "LayerNormalization + residual (taken over)",
}


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def fused_count(report: dict[str, Any]) -> int:
    """Norms the rewrite fused, native ones taken over included."""
    return len(report.get("norms", [])) + len(report.get("native_taken_over", []))


def model_rows(out: Path) -> list[str]:
    reports = out / "models"
    manifest = _load(reports / "models.json") or {}
    rows = []
    for name in MODELS:
        spec = manifest.get(name)
        optimized = _load(reports / f"{name}.optimize.json")
        if spec is None or optimized is None:
            continue
        verify = _load(reports / f"{name}.verify.json")
        bench = _load(reports / f"{name}.bench.json")
        graph = _load(reports / f"{name}.bench-graph.json")
        parity = "-" if verify is None else ("passed" if verify.get("passed") else "FAILED")
        size = f"{spec['hidden']} / {spec['intermediate']} / {spec['layers']} {spec['dtype']}"
        found = f"{fused_count(optimized)} of {spec['norms']}"
        for point in (bench or {}).get("points", []) or [None]:
            rows.append("| " + " | ".join([name, WHAT[name], size, found, parity, "off", *_point_cells(point)]) + " |")
        for point in (graph or {}).get("points", []):
            rows.append("| " + " | ".join([name, WHAT[name], size, found, parity, "on", *_point_cells(point)]) + " |")
    return rows


def _point_cells(point: dict[str, Any] | None) -> list[str]:
    if point is None:
        return ["-"] * 5
    shape = next(iter(point["shapes"].values()), [])
    latency = point["latency"]

    def ms(variant: str) -> str:
        stats = latency.get(variant)
        return "-" if stats is None else f"{stats['median_ms']:.3f}"

    speedup = point["speedup"]
    ratio = f"{speedup['median']:.3f}x [{speedup['ci_low']:.3f}, {speedup['ci_high']:.3f}]"
    return ["x".join(map(str, shape)), ms("original"), ms("optimized"), ms("original-noopt"), ratio]


def write_summary(out: Path) -> str | None:
    parts = []
    environment = out / "environment.txt"
    if environment.is_file():
        parts += ["## Environment", "", "```", environment.read_text().strip(), "```", ""]
    rows = model_rows(out)
    if rows:
        parts += [
            "## Whole models (`onnx-norm bench`, IO binding; median of per-round ratios, 95% interval)",
            "",
            "| model | norm form | hidden / MLP / layers | fused | parity | CUDA graphs | input | original ms "
            "| optimized ms | ORT_DISABLE_ALL ms | speedup [95% CI] |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    skipped = out / "models" / "skipped.txt"
    if skipped.is_file():
        parts += ["Not measured: " + "; ".join(skipped.read_text().split("\n")).strip("; "), ""]
    examples = out / "examples.tsv"
    if examples.is_file():
        lines = [line.split("\t") for line in examples.read_text().splitlines() if "\t" in line]
        parts += ["## Bundled examples (optimize, then verify)", "", "| example | parity |", "|---|---|"]
        parts += [f"| {name} | {status} |" for name, status in lines] + [""]
    for table in ("gpu_check.md",):
        if (out / table).is_file():
            parts += [f"Kernel tables: `{table}` (tools/gpu_check.py).", ""]
    if not parts:
        return None
    commands = out / "commands.txt"
    if commands.is_file():
        parts += ["## Commands", "", "```", commands.read_text().strip(), "```", ""]
    text = "# GPU run summary\n\n" + "\n".join(parts)
    (out / "summary.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: summarize.py OUT", file=sys.stderr)
        return 2
    if write_summary(Path(args[0])) is None:
        print(f"nothing to summarize in {args[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
