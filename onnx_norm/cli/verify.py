"""`onnx-norm verify ORIGINAL OPTIMIZED`: the parity gate (exit 0 passed, 1 parity failed, 2 usage/input error)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from onnx_norm.cli import args as common

if TYPE_CHECKING:  # the parity module is imported when the command runs
    from onnx_norm.options import VerifyOptions
    from onnx_norm.parity import Comparison, ParityReport

#: The flag groups of `verify`, in help order; `optimize --verify` takes the same comparison, inputs and runtime.
PATHS = common.PathArgs(
    [("original", "the original ONNX model"), ("optimized", "the optimized ONNX model")],
    [common.Output("--report", "write the parity report as JSON to PATH")],
)
COMPARISON = common.ToleranceArgs()
INPUTS = common.InputArgs()
RUNTIME = common.RuntimeArgs()


#: The line `onnx-norm --help` shows (given without building this command's parser).
HELP = "check that an optimized model computes what the original computes"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "verify",
        help=HELP,
        description="Run both models on the same inputs and compare every output, against each other and against a "
        "float64 evaluation of the original. Exit 0 passed, 1 parity failed, 2 usage or input error.",
    )
    PATHS.add(parser)
    add_gate_args(parser, report=False)
    parser.set_defaults(func=run)
    return parser


def add_gate_args(parser: argparse.ArgumentParser, *, report: bool = True) -> None:
    """The parity flags: comparison, inputs, runtime; for `optimize --verify` also `--verify-report` (optimize's
    own `--report` is its rewrite report)."""
    for group in (COMPARISON, INPUTS, RUNTIME):
        group.add(parser)
    if report:
        parser.add_argument(
            "--verify-report", type=Path, metavar="PATH", help="write the parity report as JSON to PATH"
        )


def gate(
    original: Any,
    optimized: Any,
    options: VerifyOptions,
    *,
    report: Path | None = None,
    shown_as: str | Path | None = None,
    console: Console | None = None,
) -> int:
    """The parity gate of `optimize --verify`: prints the comparison, writes `report` (`--verify-report`), returns 0
    (passed) or 1 (failed); raises UsageError (exit 2) for inputs that do not fit. `options` were parsed once, before
    the rewrite (`parity_options`); `original` is the model the rewrite read (a `model_io.ModelFile`: not read again),
    `optimized` the staged OUT, which the report names as `shown_as`. The caller removes OUT unless this returns 0."""
    code, _ = verify_and_print(original, optimized, options, report=report, shown_as=shown_as, console=console)
    return code


def parity_options(args: argparse.Namespace) -> VerifyOptions:
    """verify()'s options from the parsed flags of the comparison, input and runtime groups, validated by the same
    function verify() validates its options with (`parity.check_options`): bad values exit 2 before any work. Called
    once per command: the objects are passed down from there."""
    from onnx_norm.options import VerifyOptions
    from onnx_norm.parity import check_options

    options = VerifyOptions(INPUTS.parse(args), RUNTIME.parse(args), COMPARISON.parse(args))
    with common.input_errors():
        check_options(options)
    return options


def run(args: argparse.Namespace) -> int:
    PATHS.parse(args)
    options = parity_options(args)
    code, _ = verify_and_print(
        args.original, args.optimized, options, report=args.report, quiet=bool(getattr(args, "quiet", 0))
    )
    return code


def verify_and_print(
    original: Any,
    optimized: Any,
    options: VerifyOptions,
    *,
    report: Path | None = None,
    shown_as: str | Path | None = None,
    console: Console | None = None,
    quiet: bool = False,
) -> tuple[int, ParityReport]:
    """Runs the parity gate with `options`, prints the result, writes the JSON `report` (naming the optimized model
    as `shown_as` when given); returns (exit code, report). Input and session errors raise UsageError. Without a
    `console` (`verify` itself), `quiet` (-q) keeps only the PASSED/FAILED line: the verdict CI looks for."""
    from onnx_norm.parity import verify

    verdict = console or common.console()
    console = console or common.console(quiet=quiet)
    start = time.perf_counter()
    from onnx_norm.cli.progress import status

    with common.input_errors(), status("verify: loading the models and running both"):
        parity = verify(original, optimized, options)
    if not parity.passed:
        check_reproducible(original, options)
    print_report(parity, console)
    if not parity.passed:
        for hint in tolerance_hints(parity, original):
            console.print(hint, highlight=False, soft_wrap=True)
    if report is not None:
        from onnx_norm.cli import write_json_report

        # optimize --verify checks a staged copy of OUT: the report names OUT, where it is kept.
        models = {"original": original, "optimized": shown_as or optimized}
        write_json_report(report, parity.to_dict(), {k: _file_name(v) for k, v in models.items()})
        console.print(f"report written to {report}")
    status = "PASSED" if parity.passed else "FAILED"
    style = "bold green" if parity.passed else "bold red"
    verdict.print(
        f"[{style}]{status}[/] | Runtime: {time.perf_counter() - start:.2f}s | Command: {common.command_line()}",
        highlight=False,
        soft_wrap=True,  # one line however long the command: CI greps it
    )
    return (0 if parity.passed else 1), parity


def check_reproducible(original: Any, options: VerifyOptions) -> None:
    """After a failed comparison: does the original pass the same check against itself? If not (its outputs change
    from run to run, or are NaN/Inf where nothing can be compared), no optimized model can be judged against it:
    UsageError (exit 2) saying so, not a parity failure blamed on the optimized model."""
    from onnx_norm.cli import UsageError
    from onnx_norm.cli.progress import status
    from onnx_norm.parity import verify

    with common.input_errors(), status("verify: checking the original against itself"):
        itself = verify(original, original, options, per_node=False)
    if itself.passed:
        return
    worst = next(output for output in itself.outputs if not output.passed)
    raise UsageError(
        f"the original model does not reproduce itself: compared with itself it fails (output {worst.name!r}: "
        f"{worst.message}), so the optimized model cannot be judged against it. Nondeterministic ops or NaN/Inf "
        "outputs (--allow-nonfinite), or a comparison too strict for this model (--atol/--rtol [OUTPUT:]VALUE)"
    )


def tolerance_hints(report: ParityReport, original: Any) -> list[str]:
    """For each output that failed on its values: the tolerance that applied, whose defaults they were, and the flag
    that changes it."""
    hints = []
    for output in report.outputs:
        if output.passed or output.metrics is None:
            continue
        tolerance = output.tolerance
        source = f"{output.computed_in}, the narrowest type on its path" if output.computed_in else output.dtype
        hints.append(
            f"output {output.name!r} ({output.dtype}) was compared with atol={tolerance.atol:g} "
            f"rtol={tolerance.rtol:g} (the defaults of {source}, unless given); --atol/--rtol {output.name}:VALUE "
            "change it for this output"
        )
    return hints


def _file_name(model: Any) -> str:
    from onnx_norm.model_io import ModelFile

    return str(model) if isinstance(model, str | Path | ModelFile) else "(in memory)"


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
    if report.inputs_line:
        console.print(report.inputs_line, highlight=False, markup=False)
    if report.weights_policy:
        console.print(report.weights_policy, highlight=False, markup=False)
    if report.form != "whole model":
        parting = report.first_parting_segment
        where = "the models agree at every cut" if parting is None else f"the models part after segment {parting}"
        console.print(f"form: {report.form}; {where}", highlight=False, markup=False)
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
        _print_numerics(console, report)
        if report.repaired_line:
            console.print(f"[bold green]{report.repaired_line}[/] (their statistics now kept in float32)")
        first = report.first_divergent_norm
        if first is not None:
            where = "its inputs still match" if first.status == "diverges" else "its inputs already differ"
            console.print(
                f"[bold red]FAILED[/] | first divergent norm: {first.node!r} ({first.op_type}, "
                f"rule {first.rule or '?'}, replaces {first.original_value!r}): {where}",
                highlight=False,
            )


def _print_numerics(console: Any, report: Any) -> None:
    """The original norms that overflow, underflow or lose their epsilon in their own types on these inputs, with
    the fused op's error beside the original's (both against float64): what the optimisation fixed."""
    flagged = [norm for norm in report.norms if norm.numerics is not None and norm.numerics.problems]
    if not flagged:
        return
    console.print("[bold]Original norms in their own types[/] (as a float16/bfloat16 kernel computes each op):")
    for norm in flagged:
        n = norm.numerics
        console.print(
            f"  {norm.node} (replaces {norm.original_value!r}): max error from float64: original "
            f"{_fmt(n.original_max_error)}, fused {_fmt(n.fused_max_error)}",
            highlight=False,
        )
        for problem in n.problems:
            console.print(f"    {problem}", highlight=False)


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
