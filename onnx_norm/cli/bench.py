"""`onnx-norm bench ORIGINAL [OPTIMIZED]`: latency of the optimized model against the original (ORT_ENABLE_ALL).

Exit 0 measured, 1 the speedup is below `--min-speedup`, 2 usage or input error, models that do not correspond
(other inputs or outputs) or do not compute the same thing (the parity check on the first input sample; bench()'s
checks, so that the CLI and the API refuse the same pairs with the same line).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from onnx_norm.cli import UsageError
from onnx_norm.cli import args as common

if TYPE_CHECKING:
    from onnx_norm.options import BenchOptions, ParityCheckOptions

PATHS = common.PathArgs(
    [
        ("original", "the original ONNX model"),
        ("optimized", "the optimized model (default: optimize ORIGINAL in memory)"),
    ],
    [
        common.Output("--report", "write the bench report as JSON to PATH"),
        common.Output("--plot", "plot the speedup (against the swept dim) to PNG", "PNG"),
    ],
    optional="optimized",
)
INPUTS = common.InputArgs(samples=False)
RUNTIME = common.RuntimeArgs()
CUDA_GRAPH = common.CudaGraphArgs()
MEASUREMENT = common.BenchSessionArgs(variants=True)


class ParityCheckArgs(common.ArgGroup):
    """bench's check that the two models compute the same thing -> ParityCheckOptions: `--no-parity-check`, and
    verify's `--atol`/`--rtol` for its tolerance."""

    title = "parity check"

    def add_flags(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--no-parity-check",
            action="store_true",
            help="time the models without first checking on one input sample that their outputs agree (by default an "
            "output beyond verify's tolerance, a looser normwise test and the original's own error from the float64 "
            "result exits 2 before timing)",
        )
        common.add_tolerance_flags(group, " of the parity check (given for an output, it alone decides)")

    def parse(self, args: argparse.Namespace) -> ParityCheckOptions:
        from onnx_norm.options import ParityCheckOptions

        atol = common.per_output_values(args.atol, "--atol")
        rtol = common.per_output_values(args.rtol, "--rtol")
        with common.input_errors():
            return ParityCheckOptions(not args.no_parity_check, atol, rtol)


PARITY = ParityCheckArgs()


#: The line `onnx-norm --help` shows (given without building this command's parser).
HELP = "measure the speedup of the optimized model over the original"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench",
        help=HELP,
        description="Time the original model (ONNX Runtime with all its optimizations, and with none) against the "
        "optimized one, interleaved, on the same inputs, provider and threads. With one model, it is optimized "
        "in memory first.",
    )
    PATHS.add(parser)
    INPUTS.add(parser)
    RUNTIME.add(parser)
    CUDA_GRAPH.add(parser)
    PARITY.add(parser)
    group = MEASUREMENT.add(parser)
    group.add_argument(
        "--min-speedup", type=float, default=None, help="exit 1 if the median speedup is below this ratio (for CI)"
    )
    parser.set_defaults(func=run)
    return parser


def bench_options(args: argparse.Namespace) -> BenchOptions:
    """bench()'s options from the parsed flags of the input, runtime, CUDA graph, measurement and parity check
    groups, validated (UsageError, exit 2; the tolerances' values by `bench_check.tolerances`, before any work)."""
    from onnx_norm.bench_check import tolerances
    from onnx_norm.options import BenchOptions

    measure = dataclasses.replace(MEASUREMENT.parse(args), **CUDA_GRAPH.parse(args))
    with common.input_errors():
        options = BenchOptions(INPUTS.parse(args), RUNTIME.parse(args), measure, PARITY.parse(args))
        tolerances(options.check)
    return options


def run(args: argparse.Namespace) -> int:
    PATHS.parse(args)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'onnx-norm[plot]'")
    if args.sweep is None and args.plot and args.inputs:
        raise UsageError("--plot with --inputs measures one shape only; use generated inputs with --sweep")
    options = bench_options(args)
    console = common.console()
    report = bench_and_print(args.original, args.optimized, options, console, title=str(args.original))
    if args.report is not None:
        from onnx_norm.cli import write_json_report

        optimized = args.optimized or "(ORIGINAL optimized in memory)"
        write_json_report(args.report, report.to_dict(), {"original": args.original, "optimized": optimized})
        console.print(f"report written to {args.report}")
    if args.plot:
        from onnx_norm.bench_plot import plot

        plot(report, args.plot)
        console.print(f"plot written to {args.plot}")
    if args.min_speedup is not None and report.speedup < args.min_speedup:
        console.print(f"[bold red]FAILED[/] | speedup {report.speedup:.3f}x is below --min-speedup {args.min_speedup}")
        return 1
    return 0


def bench_and_print(original: Any, optimized: Any, options: BenchOptions, console: Console, *, title: str) -> Any:
    """Runs the bench with a progress bar and prints its tables; returns the BenchReport (demo uses it too)."""
    from onnx_norm.bench import bench
    from onnx_norm.cli.progress import rounds_bar

    with rounds_bar() as progress:
        task = progress.add_task(f"bench {title}: loading the models, creating sessions", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, description=f"bench {title}: timing")

        with common.input_errors():
            report = bench(original, optimized, options, progress=advance)
    print_report(report, console, title=title)
    return report


def print_report(report: Any, console: Console, *, title: str) -> None:
    if report.weights_policy:
        console.print(report.weights_policy, highlight=False, markup=False)
    console.print(report.parity_check.summary, highlight=False, markup=False)
    for point in report.points:
        console.print(_latency_table(report, point, title))
    for name, reason in report.skipped.items():
        console.print(f"{name} not timed: {reason}", highlight=False, markup=False)
    if report.profile:
        _print_profile(report.profile, console)
    lo, hi = report.speedup_spread
    ci_lo, ci_hi = report.speedup_ci95
    per_session = report.points[0].speedup.per_session if len(report.points) == 1 else []
    sessions = f"; per session pair {', '.join(f'{m:.3f}' for m in per_session)}" if per_session else ""
    console.print(
        f"speedup (original ORT_ENABLE_ALL / optimized, median of paired rounds): [bold]{report.speedup:.3f}x[/] "
        f"(p10-p90 {lo:.3f}-{hi:.3f}; 95% CI of the median {ci_lo:.3f}-{ci_hi:.3f}{sessions}: {report.verdict})",
        highlight=False,
    )


def _latency_table(report: Any, point: Any, title: str) -> Table:
    from onnx_norm.bench import ORIGINAL, UNOPTIMIZED, VARIANT_LABELS

    graphs = ", CUDA graphs" if report.cuda_graph else ""
    shape_text = ", ".join(f"{name} {'x'.join(map(str, dims))}" for name, dims in point.shapes.items())
    table = Table(
        title=f"{title}: {report.provider}{graphs}, threads {report.threads or 'default'}, "
        f"{report.repeat} timed rounds ({shape_text})",
        title_justify="left",
    )
    for column in ("variant", "median ms", "p90 ms", "min ms", "speedup of optimized"):
        table.add_column(column, justify="left" if column == "variant" else "right", no_wrap=column == "variant")
    for name, stats in point.latency.items():
        speedup = {ORIGINAL: point.speedup, UNOPTIMIZED: point.speedup_vs_noopt}.get(name)
        ratio = "-" if speedup is None else f"{speedup.median:.2f}x ({speedup.p10:.2f}-{speedup.p90:.2f})"
        table.add_row(
            VARIANT_LABELS.get(name, name),
            f"{stats.median_ms:.3f}",
            f"{stats.p90_ms:.3f}",
            f"{stats.min_ms:.3f}",
            ratio,
        )
    return table


def _print_profile(profile: dict[str, Any], console: Console) -> None:
    from onnx_norm.bench import ORIGINAL, VARIANT_LABELS

    table = Table(title="Kernel time per run (ORT profiler)", title_justify="left")
    for column in ("variant", "norm nodes", "norm ms", "other ms", "norm share"):
        table.add_column(column, justify="left" if column == "variant" else "right", no_wrap=column == "variant")
    for name, split in profile.items():
        table.add_row(
            VARIANT_LABELS.get(name, name),
            str(split.norm_nodes),
            f"{split.norm_ms:.3f}",
            f"{split.other_ms:.3f}",
            f"{100 * split.norm_share:.1f}%",
        )
    console.print(table)
    baseline = profile.get(ORIGINAL)
    if baseline is not None and baseline.norm_ms + baseline.other_ms > 0:
        total = baseline.norm_ms + baseline.other_ms
        console.print(
            f"norms are {100 * baseline.norm_share:.1f}% of the original's kernel time: even free norms would "
            f"make it at most {total / max(baseline.other_ms, 1e-9):.3f}x faster",
            highlight=False,
        )
