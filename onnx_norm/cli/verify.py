"""`onnx-norm verify ORIGINAL OPTIMIZED`: the parity gate (exit 0 passed, 1 parity failed, 2 usage/input error)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from onnx_norm.cli import args as common
from onnx_norm.parity import STATS, Comparison, ParityReport


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "verify",
        help="check that an optimized model computes what the original computes",
        description="Run both models on the same inputs and compare every output, against each other and against a "
        "float64 evaluation of the original. Exit 0 passed, 1 parity failed, 2 usage or input error.",
    )
    parser.add_argument("original", help="the original ONNX model")
    parser.add_argument("optimized", help="the optimized ONNX model")
    add_parity_args(parser)
    common.add_input_args(parser)
    common.add_runtime_args(parser)
    common.add_report_args(parser, "parity report")
    parser.set_defaults(func=run)
    return parser


def add_parity_args(parser: argparse.ArgumentParser) -> None:
    """The comparison flags; `optimize --verify` adds them too."""
    group = parser.add_argument_group("comparison")
    group.add_argument(
        "--atol",
        nargs="+",
        metavar="[OUTPUT:]VALUE",
        help="absolute tolerance, for all outputs or per output (default by dtype: fp32 1e-4, fp16 1e-2, bf16 5e-2)",
    )
    group.add_argument("--rtol", nargs="+", metavar="[OUTPUT:]VALUE", help="relative tolerance (defaults as --atol)")
    group.add_argument(
        "--check-error-stat",
        nargs="+",
        metavar="[OUTPUT:]STAT",
        help=f"statistic compared with the tolerances: {', '.join(STATS)} (default: elementwise)",
    )
    group.add_argument("--error-quantile", type=float, default=0.99, help="quantile for --check-error-stat quantile")
    group.add_argument(
        "--golden",
        choices=("auto", "ort", "reference", "none"),
        default="auto",
        help="float64 evaluation of the original: an upcast copy in ONNX Runtime, onnx's ReferenceEvaluator, "
        "or none (default: auto, ORT then the reference evaluator)",
    )
    group.add_argument(
        "--original-opt-level",
        choices=("all", "extended", "basic", "disabled"),
        default="all",
        help="ONNX Runtime graph optimizations for the original model (default: all, as users run it)",
    )
    group.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="pass an output that is NaN/Inf everywhere in both models (by default it fails: nothing to compare)",
    )
    group.add_argument(
        "--per-node",
        action="store_true",
        help="also compare every fused norm with the subgraph it replaced, to name the norm that diverged",
    )


def add_gate_args(parser: argparse.ArgumentParser) -> None:
    """The parity flags for `optimize --verify`: comparison, inputs, runtime, and `--verify-report` (optimize's
    own `--report` is its rewrite report)."""
    add_parity_args(parser)
    common.add_input_args(parser)
    common.add_runtime_args(parser)
    parser.add_argument("--verify-report", type=Path, metavar="PATH", help="write the parity report as JSON to PATH")


def gate(original: Any, optimized: Any, args: argparse.Namespace, *, console: Console | None = None) -> int:
    """The parity gate of `optimize --verify`: prints the comparison, returns 0 (passed) or 1 (failed); raises
    UsageError (exit 2) for inputs that do not fit. The caller removes OUT unless this returns 0."""
    flags = argparse.Namespace(**{**vars(args), "report": getattr(args, "verify_report", None)})
    code, _ = verify_and_print(original, optimized, flags, console=console)
    return code


def parity_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """verify() keyword arguments from parsed flags (missing flags take their defaults), validated by the same
    function verify() validates its arguments with (`parity.check_options`): bad values exit 2 before any work."""
    from onnx_norm.parity import check_options

    kwargs = {
        "input_files": getattr(args, "inputs", []) or [],
        "shapes": common.shapes(args) if getattr(args, "shape", None) else None,
        "samples": getattr(args, "samples", 2),
        "seed": getattr(args, "seed", 0),
        "provider": getattr(args, "provider", "cpu"),
        "threads": getattr(args, "threads", None),
        "device_id": getattr(args, "device_id", 0),
        "original_optimization": getattr(args, "original_opt_level", "all"),
        "atol": common.per_output_values(getattr(args, "atol", None), "--atol"),
        "rtol": common.per_output_values(getattr(args, "rtol", None), "--rtol"),
        "check_error_stat": common.per_output_values(
            getattr(args, "check_error_stat", None), "--check-error-stat", str
        ),
        "error_quantile": getattr(args, "error_quantile", 0.99),
        "golden": getattr(args, "golden", "auto"),
        "per_node": getattr(args, "per_node", False),
        "allow_nonfinite": getattr(args, "allow_nonfinite", False),
    }
    with common.input_errors():
        check_options(**kwargs)
    return kwargs


def run(args: argparse.Namespace) -> int:
    common.check_model_path(args.original, "original model")
    common.check_model_path(args.optimized, "optimized model")
    common.check_outputs([("--report", args.report)], [args.original, args.optimized], input_data=args.inputs)
    code, _ = verify_and_print(args.original, args.optimized, args)
    return code


def verify_and_print(
    original: Any, optimized: Any, args: argparse.Namespace, *, console: Console | None = None
) -> tuple[int, ParityReport]:
    """Runs the parity gate with the flags in `args`, prints the result, writes `--report`; returns (exit code,
    report). Input and session errors raise UsageError. `optimize --verify` calls this with the in-memory model."""
    from onnx_norm.parity import verify

    console = console or common.console()
    kwargs = parity_kwargs(args)
    start = time.perf_counter()
    with common.input_errors():
        report = verify(original, optimized, **kwargs)
    print_report(report, console)
    report_path = getattr(args, "report", None)
    if report_path is not None:
        report.write_json(report_path)
        console.print(f"report written to {report_path}")
    status = "PASSED" if report.passed else "FAILED"
    style = "bold green" if report.passed else "bold red"
    console.print(
        f"[{style}]{status}[/] | Runtime: {time.perf_counter() - start:.2f}s | Command: {common.command_line()}",
        highlight=False,
    )
    return (0 if report.passed else 1), report


def _status(passed: bool) -> str:
    return "[bold green]PASSED[/]" if passed else "[bold red]FAILED[/]"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def print_report(report: ParityReport, console: Console) -> None:
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    for output in report.outputs:
        console.print(f"{_status(output.passed)} | Output: {output.name!r} | {output.message}", highlight=False)
        if not output.passed and output.metrics is not None:
            for item in output.metrics.first_mismatches:
                console.print(
                    f"    sample {item['sample']} index {item['index']}: optimized {item['actual']:.6g}, "
                    f"original {item['expected']:.6g}",
                    highlight=False,
                )
    table = Table(
        title=f"Parity: {report.samples} sample(s), {report.provider}, golden: {report.golden}", title_justify="left"
    )
    for column in ("output", "dtype", "shape", "max abs", "max rel", "mean abs", "p99 abs", "cosine", "out of tol"):
        table.add_column(column, justify="left" if column in ("output", "dtype", "shape") else "right")
    table.add_column("vs exact: orig / opt", justify="right")
    table.add_column("status")
    for output in report.outputs:
        table.add_row(*_row(output), _status(output.passed))
    console.print(table)
    if report.norms:
        norms = Table(title="Fused norms against the subgraphs they replaced", title_justify="left")
        for column in ("norm", "op", "rule", "replaces", "max abs", "mean abs", "inputs match", "status"):
            norms.add_column(column)
        for norm in report.norms:
            metrics = norm.output.metrics if norm.output is not None else None
            color = {"ok": "green", "diverges": "bold red", "input differs": "yellow"}.get(norm.status, "yellow")
            norms.add_row(
                norm.node,
                norm.op_type,
                norm.rule or "-",
                norm.original_value or "?",
                _fmt(metrics.max_abs if metrics else None),
                _fmt(metrics.mean_abs if metrics else None),
                {True: "yes", False: "no", None: "-"}[norm.inputs_match],
                f"[{color}]{norm.status}[/]",
            )
        console.print(norms)
        first = report.first_divergent_norm
        if first is not None:
            where = "its inputs still match" if first.status == "diverges" else "its inputs already differ"
            console.print(
                f"[bold red]FAILED[/] | first divergent norm: {first.node!r} ({first.op_type}, "
                f"rule {first.rule or '?'}, replaces {first.original_value!r}): {where}",
                highlight=False,
            )


def _row(output: Comparison) -> list[str]:
    m = output.metrics
    golden = output.golden
    vs_exact = "-" if golden is None else f"{golden.original_max_abs:.3g} / {golden.optimized_max_abs:.3g}"
    if m is None:
        return [output.name, output.dtype, str(output.shape), *["-"] * 6, vs_exact]
    return [
        output.name,
        output.dtype,
        "x".join(map(str, output.shape or [])),
        _fmt(m.max_abs),
        _fmt(m.max_rel),
        _fmt(m.mean_abs),
        _fmt(m.p99_abs),
        f"{m.cosine:.6f}",
        f"{m.mismatched}/{m.total}",
        vs_exact,
    ]
