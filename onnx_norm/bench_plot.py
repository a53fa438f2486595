"""Plots of bench reports (matplotlib, the `plot` extra): the speedup against a swept dim, or latency per variant.
Files are written atomically, like every other output of the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnx_norm.bench import VARIANT_LABELS, BenchPoint, BenchReport
from onnx_norm.paths import staged_file


def plot(report: BenchReport, path: str | Path, *, title: str | None = None) -> None:
    """Speedup against the swept dim (error bars: 10th-90th percentile of the per-round ratios); with a single
    point, median latency per variant (whiskers to the 90th percentile)."""
    swept = [p for p in report.points if p.dims]
    title = title or f"onnx-norm bench ({report.provider}), speedup {report.speedup:.2f}x"
    if len(swept) >= 2:
        dim = next(iter(swept[0].dims))
        plot_speedups([p.dims[dim] for p in swept], swept, path, xlabel=dim, title=title)
        return
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    point = report.points[0]
    names = list(point.latency)
    medians = [point.latency[n].median_ms for n in names]
    whiskers = [[0] * len(names), [point.latency[n].p90_ms - point.latency[n].median_ms for n in names]]
    ax.bar([VARIANT_LABELS.get(n, n) for n in names], medians, yerr=whiskers, capsize=3)
    ax.set_ylabel("median latency (ms)")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(title)
    _save(plt, fig, path)


def plot_speedups(
    xs: Sequence[float], points: Sequence[BenchPoint], path: str | Path, *, xlabel: str, title: str
) -> None:
    """Speedup of each point against `xs` (a sequence length, a hidden size...), error bars p10-p90."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ys = [p.speedup.median for p in points]
    err = [
        [y - p.speedup.p10 for y, p in zip(ys, points, strict=True)],
        [p.speedup.p90 - y for y, p in zip(ys, points, strict=True)],
    ]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label="original (ORT_ENABLE_ALL) / optimized")
    noopt = [p.speedup_vs_noopt for p in points]
    if all(s is not None for s in noopt):
        ax.plot(
            xs,
            [s.median for s in noopt if s],
            marker="s",
            linestyle="--",
            label="original (ORT_DISABLE_ALL) / optimized",
        )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speedup (x)")
    ax.legend(fontsize=8)
    ax.set_title(title)
    _save(plt, fig, path)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as err:
        raise RuntimeError("--plot needs matplotlib: pip install 'onnx-norm[plot]'") from err

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: str | Path) -> None:
    fig.tight_layout()
    try:
        with staged_file(path) as staged:
            fig.savefig(staged)
    finally:
        plt.close(fig)
