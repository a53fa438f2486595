"""`onnx-norm inspect MODEL [--explain]`: list the norms `optimize` would fuse, without writing anything."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from onnx_norm.cli import UsageError
from onnx_norm.cli import args as common

if TYPE_CHECKING:  # the rewrite is imported when the command runs: `onnx-norm --version` need not pay for it
    from onnx_norm.rewrite import OptimizeReport


#: The line `onnx-norm --help` shows (given without building this command's parser).
HELP = "list the decomposed norms of a model (dry run)"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "inspect",
        help=HELP,
        description="List every decomposed LayerNorm/RMSNorm that `optimize` would fuse: nodes, kind, dtype, "
        "epsilon, axes, cast placement, residual. --explain also lists the near-misses and why they are left.",
    )
    parser.add_argument("model", help="ONNX model to inspect")
    common.TargetArgs("target to check against").add(parser)
    common.RewriteReportArgs().add(parser)
    parser.add_argument(
        "--activation-rms",
        type=float,
        default=None,
        metavar="RMS",
        help="evaluate each fp16/bf16 norm op by op in its own type on inputs of this RMS and name those whose "
        "statistics overflow (default 1000, a residual stream of a few hundred to a few thousand as trained LLMs "
        "carry; 0 turns the check off)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from onnx_norm.rewrite import inspect

    common.check_outputs([("--report", args.report)], [args.model])
    if args.activation_rms is not None and not (math.isfinite(args.activation_rms) and args.activation_rms >= 0):
        raise UsageError(f"--activation-rms must be a finite number >= 0, not {args.activation_rms:g}")
    with common.input_errors():
        report = inspect(args.model, target=args.target, opset=args.opset)
    console = common.console()
    print_opset(console, report)
    print_norms(console, report, nothing_else=args.explain and not report.near_misses)
    if args.explain and (report.norms or report.near_misses):
        print_near_misses(console, report)
    elif report.near_misses:
        console.print(f"{len(report.near_misses)} near-miss(es) not fused; --explain lists them with the reasons")
    overflow = overflow_check(args.model, report, args.activation_rms)
    if overflow is not None:
        print_overflows(console, report, overflow)
    if args.report:
        write_report(args.report, report, {"model": args.model}, overflow)
    return 0


def overflow_check(model: str, report: OptimizeReport, rms: float | None) -> dict[str, Any] | None:
    """The fp16/bf16 norms whose statistics overflow in their own type at residual RMS `rms` (parity/numerics.py),
    as {"activation_rms", "overflows": [{"norm": index, "nodes", "what"}]}; None when no norm is narrow or rms is 0."""
    import onnx

    from onnx_norm.parity.numerics import REALISTIC_RMS, overflows_at

    rms = REALISTIC_RMS if rms is None else rms
    if rms == 0 or not any(norm.dtype in ("fp16", "bf16") for norm in report.norms):
        return None
    with common.input_errors():
        found = overflows_at(onnx.load(model), report.norms, rms)
    rows = [{"norm": i, "nodes": report.norms[i].replaced_nodes, "what": what} for i, what in sorted(found.items())]
    return {"activation_rms": rms, "overflows": rows}


def print_overflows(console: Console, report: OptimizeReport, overflow: dict[str, Any]) -> None:
    narrow = sum(1 for norm in report.norms if norm.dtype in ("fp16", "bf16"))
    rows = overflow["overflows"]
    console.print(
        f"{len(rows)} of {narrow} fp16/bf16 norm(s) overflow in their own type at activation RMS "
        f"{overflow['activation_rms']:g}"
        + (": optimize replaces them with ops that keep statistics in float32" if rows else ""),
        highlight=False,
        soft_wrap=True,
    )
    for row in rows:
        console.print(f"  {row['nodes'][0]}: {row['what']}", highlight=False, soft_wrap=True)


def print_opset(console: Console, report: OptimizeReport) -> None:
    """`--opset N`: the opset the model was raised from, before the rewrite (nothing when it was at N already)."""
    raised = report.opset_raised
    if raised:
        verb = "would be raised" if report.dry_run else "raised"
        line = f"default opset {verb} from {raised['from']} to {raised['to']} (onnx's version converter)"
        console.print(line, highlight=False)


def native_hint(report: OptimizeReport) -> str | None:
    """The native norm ops the model already had, and the flag that moves them onto our kernels; None if none or
    when they were already taken over."""
    from onnx_norm.rewrite.native import NATIVE_OP_NAMES

    if report.native_taken_over:
        return None
    native = {op: n for op, n in report.ops_before.items() if op in NATIVE_OP_NAMES}
    if not native:
        return None
    ops = ", ".join(f"{n} {op.split('::')[-1]}" for op, n in sorted(native.items()))
    return (
        f"the model already has native norm ops ({ops}), left as they are; "
        "`onnx-norm optimize --take-over-native` moves them onto onnx-norm's kernels"
    )


def print_norms(console: Console, report: OptimizeReport, *, nothing_else: bool = False) -> None:
    """The norms found, as a table; one line when there are none (`nothing_else`: and no near-miss either). Either
    way, the native norms already there."""
    hint = native_hint(report)
    if not report.norms:
        line = "no decomposed norm and no near-miss found" if nothing_else else "no decomposed norm found"
        console.print(line + (f"; {hint}" if hint else ""), highlight=False, soft_wrap=True)
        return
    table = Table(title=f"{report.fused} norm(s) found", title_justify="left")
    for column in ("rule", "nodes", "dtype", "eps", "axes", "casts", "residual", "graph"):
        table.add_column(column, no_wrap=column == "rule")
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
    if hint:
        console.print(hint, highlight=False, soft_wrap=True)


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
    errors = sum(1 for miss in report.near_misses if miss.error)
    if errors:
        console.print(
            f"{errors} of these are errors of onnx-norm itself, not of the model: please report them "
            "(-vv prints the tracebacks)",
            highlight=False,
            soft_wrap=True,
        )


def write_report(
    path: Path, report: OptimizeReport, models: dict[str, Any], overflow: dict[str, Any] | None = None
) -> None:
    """The rewrite report as JSON, with the model files it describes (by role) and the versions that made it; with
    `overflow` (inspect's fp16 check) under "overflow_check"."""
    from onnx_norm.cli import write_json_report

    data = report.to_dict()
    if overflow is not None:
        data["overflow_check"] = overflow
    try:
        write_json_report(path, data, models)
    except OSError as err:
        raise UsageError(f"cannot write the report {path}: {err.strerror or err}") from err
