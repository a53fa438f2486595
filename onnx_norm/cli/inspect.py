"""`onnx-norm inspect MODEL [--explain]`: list the norms `optimize` would fuse, without writing anything."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from onnx_norm.cli import UsageError
from onnx_norm.cli import args as common
from onnx_norm.rewrite import OptimizeReport


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "inspect",
        help="list the decomposed norms of a model (dry run)",
        description="List every decomposed LayerNorm/RMSNorm that `optimize` would fuse: nodes, kind, dtype, "
        "epsilon, axes, cast placement, residual. --explain also lists the near-misses and why they are left.",
    )
    parser.add_argument("model", help="ONNX model to inspect")
    common.TargetArgs("target to check against").add(parser)
    common.RewriteReportArgs().add(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from onnx_norm.rewrite import inspect

    common.check_outputs([("--report", args.report)], [args.model])
    with common.input_errors():
        report = inspect(args.model, target=args.target)
    console = Console()
    print_norms(console, report)
    if args.explain:
        print_near_misses(console, report)
    elif report.near_misses:
        console.print(f"{len(report.near_misses)} near-miss(es) not fused; --explain lists them with the reasons")
    if args.report:
        write_report(args.report, report)
    return 0


def print_norms(console: Console, report: OptimizeReport) -> None:
    table = Table(title=f"{report.fused} norm(s) found", title_justify="left")
    for column in ("rule", "nodes", "dtype", "eps", "axes", "casts", "residual", "graph"):
        table.add_column(column)
    for norm in report.norms:
        nodes = ", ".join(norm.replaced_nodes[:3]) + (
            f" +{len(norm.replaced_nodes) - 3}" if len(norm.replaced_nodes) > 3 else ""
        )
        residual = "sum kept" if norm.residual_sum_kept else ("fused" if norm.residual else "-")
        table.add_row(
            norm.rule,
            nodes,
            norm.dtype,
            f"{norm.epsilon:.3g}",
            str(norm.axes),
            norm.cast_placement,
            residual,
            norm.graph,
        )
    console.print(table)


def print_near_misses(console: Console, report: OptimizeReport) -> None:
    if not report.near_misses:
        console.print("no near-misses")
        return
    table = Table(title=f"{len(report.near_misses)} near-miss(es), not fused", title_justify="left")
    table.add_column("nodes")
    table.add_column("reason")
    table.add_column("graph")
    for miss in report.near_misses:
        table.add_row(", ".join(miss.nodes[:3]), miss.reason, miss.graph)
    console.print(table)


def write_report(path: Path, report: OptimizeReport) -> None:
    from onnx_norm.paths import write_json_atomic

    try:
        write_json_atomic(path, report.to_dict())
    except OSError as err:
        raise UsageError(f"cannot write the report {path}: {err.strerror or err}") from err
