"""Write OUT/summary.md from what tools/device/run_gpu.sh left in OUT: the environment (GPU, driver, versions), the
GPU-run issue's goals judged against the tables (met, NOT met, not measured, with the worst row), the whole-model
table (norms found and fused, parity, latency and speedup per sequence length, from the reports of `onnx-norm
optimize/verify/bench`), the examples' parity and the commands that produced them, in Markdown to paste into the
README or docs.

    python tools/device/summarize.py OUT [EARLIER_OUT ...] [--output FILE]

Each device call brings its files back in a folder of its own: name the kernels call's folder after the last
call's to judge the bandwidth goals too (their gpu_check.json tables are read together; OUT's own files come
first). --output writes elsewhere than OUT/summary.md (the fetched folders are read-only). Reads only; a part of
the run that left no files is left out. Exit 1 when there is nothing to summarize.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Iterable
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


# --------------------------------------------------------------------------------------------- goals
# The GPU-run issue's goals, judged from gpu_check.py's tables (cells as it printed them) and the bench reports.
SIXTEEN_BIT = ("fp16", "bf16")
SKIP_GOAL_SHAPES = ("8192x4096", "32768x1024")
WIDE_HIDDEN = (16384, 32768, 65536)
UNFUSED_BY_ORT = "llama-reciprocal"  # the models whose norms ORT leaves unfused: >= 1.15x; the others: not slower
UNFUSED_SPEEDUP = 1.15
ORT_TABLE = "Ours vs ONNX Runtime's CUDA kernels"


@dataclasses.dataclass(frozen=True)
class Verdict:
    goal: str
    status: str  # "met", "NOT met" or "not measured"
    evidence: str


def _number(cell: str) -> float | None:
    try:
        return float(cell.rstrip("%x"))
    except (AttributeError, ValueError):
        return None


def _judge(goal: str, rows: Iterable[dict[str, Any]], value: Callable[[dict[str, Any]], float | None],
           passes: Callable[[float], bool], label: Callable[[dict[str, Any]], str],
           worst: Callable[..., Any] = min) -> Verdict:  # fmt: skip
    """Met when every row's value passes; the evidence names the worst row (`worst`: min where higher is
    better, max where lower is)."""
    measured = [(v, row) for row in rows if (v := value(row)) is not None]
    if not measured:
        return Verdict(goal, "not measured", "no rows")
    failing = [(v, row) for v, row in measured if not passes(v)]
    worst_value, worst_row = worst(failing or measured, key=lambda item: item[0])
    status = "NOT met" if failing else "met"
    return Verdict(goal, status, f"{len(measured)} rows, {len(failing)} failing; {label(worst_row)}: {worst_value:.3g}")


def _speedup(point: dict[str, Any], key: str) -> float | None:
    value = (point.get("speedup") or {}).get(key)
    return None if value is None else float(value)


def _row_label(row: dict[str, Any]) -> str:
    return f"{row['op']} {row['dtype']} {row['shape']}"


def judge(tables: dict[str, list[dict[str, str]]], benches: dict[str, list[dict[str, Any]]]) -> list[Verdict]:
    """The goals, each met / NOT met / not measured. `tables`: gpu_check.json's tables by title; `benches`: each
    model's bench points (CUDA graphs off and on together)."""
    bandwidth = tables.get("Bandwidth", [])
    sixteen = [row for row in bandwidth if row["dtype"] in SIXTEEN_BIT]
    ort_rows = [{**row, "graph": graph} for row in tables.get(ORT_TABLE, []) for graph in (False, True)]
    points = [{"model": name, **point} for name, model_points in benches.items() for point in model_points]
    unfused = [point for point in points if point["model"] == UNFUSED_BY_ORT]
    fused = [point for point in points if point["model"] != UNFUSED_BY_ORT]

    def point_label(point: dict[str, Any]) -> str:
        return f"{point['model']} {point['dims']}"

    return [
        _judge(">= 95% of copy bandwidth, Skip ops at [8192, 4096] and [32768, 1024], fp16/bf16",
               [r for r in sixteen if r["op"].startswith("Skip") and r["shape"] in SKIP_GOAL_SHAPES],
               lambda r: _number(r["of copy"]), lambda v: v >= 95, _row_label),
        _judge(">= 85% of copy bandwidth at hidden 16K-64K, fp16/bf16",
               [r for r in sixteen if int(r["shape"].split("x")[1]) in WIDE_HIDDEN],
               lambda r: _number(r["of copy"]), lambda v: v >= 85, _row_label),
        _judge("[1, 4096] RMSNorm <= 2 us under a CUDA graph",
               [r for r in bandwidth if r["op"] == "RMSNorm" and r["shape"] == "1x4096" and r["timing"] == "graph"],
               lambda r: _number(r["ours us"]), lambda v: v <= 2.0, _row_label, worst=max),
        _judge("faster than ONNX Runtime's CUDA kernels on every shape (ORT time / ours)", ort_rows,
               lambda r: _number(r["ORT/ours (graph)" if r["graph"] else "ORT/ours"]), lambda v: v > 1.0,
               lambda r: _row_label(r) + (" graph" if r["graph"] else "")),
        _judge(f"whole model >= {UNFUSED_SPEEDUP}x where ORT leaves the norms unfused (median speedup)", unfused,
               lambda p: _speedup(p, "median"), lambda v: v >= UNFUSED_SPEEDUP, point_label),
        _judge("whole model never slower where ORT fuses the norms (upper end of the speedup's 95% CI)", fused,
               lambda p: _speedup(p, "ci_high"), lambda v: v >= 1.0, point_label),
    ]  # fmt: skip


def goal_lines(outs: list[Path]) -> list[str]:
    tables: dict[str, list[dict[str, str]]] = {}
    for out in reversed(outs):  # OUT's own tables last, so that they win
        tables.update(_load(out / "gpu_check.json") or {})
    benches: dict[str, list[dict[str, Any]]] = {}
    for name in MODELS:
        for suffix in ("bench", "bench-graph"):
            report = _first(outs, f"models/{name}.{suffix}.json")
            benches.setdefault(name, []).extend((report or {}).get("points", []))
    verdicts = judge(tables, {name: points for name, points in benches.items() if points})
    if all(v.status == "not measured" for v in verdicts):
        return []
    lines = ["## Goals (the GPU-run issue)", "", "| goal | status | evidence |", "|---|---|---|"]
    return lines + [f"| {v.goal} | {v.status} | {v.evidence} |" for v in verdicts] + [""]


def _first(outs: list[Path], name: str) -> dict[str, Any] | None:
    return next((report for out in outs if (report := _load(out / name)) is not None), None)


def write_summary(out: Path, earlier: list[Path] | None = None, output: Path | None = None) -> str | None:
    """The summary of `out` (and the gpu_check tables and reports of `earlier` calls' folders), written to
    `output` (default out/summary.md); None when there is nothing to summarize."""
    outs = [out, *(earlier or [])]
    parts = []
    environment = next((o / "environment.txt" for o in outs if (o / "environment.txt").is_file()), None)
    if environment is not None:
        parts += ["## Environment", "", "```", environment.read_text().strip(), "```", ""]
    parts += goal_lines(outs)
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
    parts += [
        f"Kernel tables: `{o / 'gpu_check.md'}` (tools/gpu_check.py)." for o in outs if (o / "gpu_check.md").is_file()
    ]
    if not parts:
        return None
    commands = out / "commands.txt"
    if commands.is_file():
        parts += ["", "## Commands", "", "```", commands.read_text().strip(), "```", ""]
    text = "# GPU run summary\n\n" + "\n".join(parts)
    (output or out / "summary.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder run_gpu.sh wrote (the last call's)")
    parser.add_argument("earlier", type=Path, nargs="*", help="earlier calls' folders (the kernels call's)")
    parser.add_argument("--output", type=Path, help="where to write the summary (default: OUT/summary.md)")
    args = parser.parse_args(argv)
    if write_summary(args.out, args.earlier, args.output) is None:
        print(f"nothing to summarize in {args.out}", file=sys.stderr)
        return 1
    print(f"summary: {args.output or args.out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
