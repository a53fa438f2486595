"""`onnx-norm optimize IN -o OUT`: fuse the norms of a model and write it (never over IN unless --force)."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from onnx_norm.cli import UsageError
from onnx_norm.cli import args as common
from onnx_norm.cli.inspect import print_near_misses, print_norms, print_opset, write_report

if TYPE_CHECKING:  # the rewrite is imported when this command's parser is built or it runs
    from onnx_norm.model_io import ModelFile
    from onnx_norm.options import VerifyOptions
    from onnx_norm.rewrite import OptimizeReport


#: The line `onnx-norm --help` shows (given without building this command's parser).
HELP = "fuse the decomposed norms of a model"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from onnx_norm.rewrite import RULE_NAMES

    parser = subparsers.add_parser(
        "optimize",
        help=HELP,
        description="Replace every decomposed LayerNorm/RMSNorm with a fused op and write the model. Each match is "
        "proven on random inputs before it is rewritten; near-misses are left as they are.",
    )
    parser.add_argument("input", help="ONNX model to optimize, or an ONNX Runtime GenAI model folder")
    parser.add_argument("-o", "--output", required=True, help="where to write the optimized model")
    common.TargetArgs("which ops the fused norms become").add(parser)
    parser.add_argument(
        "--disable", nargs="+", action="extend", default=[], metavar="RULE", choices=RULE_NAMES, help="rules to skip"
    )
    parser.add_argument(
        "--take-over-native",
        action="store_true",
        help="also convert native LayerNormalization/RMSNormalization/SimplifiedLayerNormalization/Skip* nodes",
    )
    common.RewriteReportArgs().add(parser)
    parser.add_argument(
        "--force",
        action="store_true",
        help="allow OUT (or its .data file) to be a file IN reads: the input model or its external data",
    )
    parser.add_argument(
        "--external-data",
        choices=("auto", "always", "never"),
        default="auto",
        help="save weights in OUT.data: auto when the input had external data or the model exceeds 2 GB; always "
        "(every non-empty tensor); never (every tensor in OUT, an error above 2 GB)",
    )
    add_verify_args(parser)
    parser.set_defaults(func=run)
    return parser


def add_verify_args(parser: argparse.ArgumentParser) -> None:
    """`--verify`: the parity gate checks OUT against IN before OUT is kept, with verify's flags."""
    parser.add_argument(
        "--verify", action="store_true", help="check parity of OUT against IN; exit 1 and keep no OUT when it fails"
    )
    from onnx_norm.cli.verify import add_gate_args

    add_gate_args(parser)


def _verify(
    options: VerifyOptions | None, original: ModelFile, staged: Path, args: argparse.Namespace, console: Console
) -> bool:
    """Parity of the staged model against the input, as the rewrite read it (not read again); True when it passed
    or was not asked (`options` None)."""
    if options is None:
        return True
    from onnx_norm.cli.verify import gate

    report = args.verify_report
    return gate(original, staged, options, report=report, shown_as=args.output, console=console) == 0


def _check_before_work(
    args: argparse.Namespace, source: Path, output: Path, external: bool | None
) -> VerifyOptions | None:
    """Every output path and option, before the model is even loaded: a bad one costs nothing and writes nothing.
    Returns the parity gate's options with `--verify` (parsed here, once), else None."""
    from onnx_norm import model_io

    if args.verify_report is not None and not args.verify:
        raise UsageError("--verify-report needs --verify")
    # OUT's data file is written whenever external data may be used: it must not be a file the input reads.
    data = [] if external is False else [(f"the external data file of {output}", model_io.data_file(output))]
    common.check_outputs(
        [("-o", output), ("--report", args.report), ("--verify-report", args.verify_report)],
        [source],
        force=args.force,
        force_flag="--force",
        files=data,
        input_data=args.inputs,
    )
    if not args.verify:
        return None
    from onnx_norm.cli.verify import parity_options

    return parity_options(args)


def _stale_data_file(staging: Path, output: Path, source: Path) -> Path | None:
    """OUT's data file when the new OUT has none: the old OUT read it (a file of that name that OUT did not read
    is not ours to remove) and no input still reads it (the input is read before it is replaced only when it is
    OUT itself, with --force)."""
    from onnx_norm import model_io, paths

    data = model_io.data_file(output)
    if (staging / data.name).exists() or not data.is_file() or not output.is_file():
        return None
    if not any(paths.same_file(data, file) for file in model_io.model_files(output)[1:]):
        return None
    if not paths.same_file(source, output) and any(paths.same_file(data, f) for f in model_io.model_files(source)):
        return None
    return data


def _move_into_place(staging: Path, output: Path, source: Path) -> None:
    """The data files first, the model last: OUT never points at data that is not there yet. A data file of the
    old OUT that the new one does not use is removed after it, so that no earlier run's weights linger beside it."""
    stale = _stale_data_file(staging, output, source)
    staged = sorted(staging.iterdir(), key=lambda path: path.name == output.name)
    for path in staged:
        try:
            os.replace(path, output.parent / path.name)
        except OSError as err:  # it names the staged file; the user knows OUT
            raise UsageError(f"{output.parent / path.name}: cannot write: {err.strerror or err}") from None
    if stale is not None:
        stale.unlink(missing_ok=True)


def run(args: argparse.Namespace) -> int:
    from onnx_norm import model_io
    from onnx_norm.rewrite import optimize

    source, output = Path(args.input), Path(args.output)
    if source.is_dir():  # an ONNX Runtime GenAI model folder: every model its genai_config names
        from onnx_norm.cli.genai_folder import run_folder

        if args.opset is not None:
            raise UsageError(f"{source}: --opset takes one model, not a GenAI model folder")
        return run_folder(args)
    external = {"auto": None, "always": True, "never": False}[args.external_data]
    options = _check_before_work(args, source, output, external)
    with common.input_errors():
        original = model_io.read_file(source)  # read once: the rewrite and the parity gate share it
        model, report = optimize(
            original,
            target=args.target,
            disable=args.disable,
            take_over_native=args.take_over_native,
            opset=args.opset,
        )
    console = common.console(quiet=bool(args.quiet))  # -q: nothing but errors (and a failed gate's line)
    # Written next to OUT under a temporary directory and moved into place only once the parity gate
    # passed, so that a failed or interrupted check never leaves a bad OUT (or replaces a good one).
    with tempfile.TemporaryDirectory(prefix=".onnx-norm-", dir=output.parent) as staging:
        staged = Path(staging) / output.name
        with common.input_errors():
            model_io.save(model, staged, external_data=external, shown_as=output)
        passed = _verify(options, original, staged, args, console)
        if passed:
            _move_into_place(Path(staging), output, source)
    print_opset(console, report)
    print_norms(console, report)
    print_summary(console, report)
    if args.take_over_native:
        print_take_over(console, report)
    if args.explain:
        print_near_misses(console, report)
    elif report.near_misses:
        console.print(f"{len(report.near_misses)} near-miss(es) not fused; --explain lists them with the reasons")
    if args.report:
        write_report(args.report, report, {"input": source, "output": output})
    if not passed:
        common.console().print(f"[red]FAILED[/red] parity gate: {output} not written")
        return 1
    note = getattr(args, "output_note", None)  # set by `demo` for its temporary folder
    console.print(f"wrote {output.name} ({note})" if note else f"wrote {output}", highlight=False)
    return 0


def print_take_over(console: Console, report: OptimizeReport) -> None:
    """`--take-over-native`: each native norm node, what it became, or why it was left as it was."""
    records = report.native_taken_over
    if not records:
        console.print("--take-over-native: the model has no native norm ops")
        return
    converted = sum(1 for record in records if record["converted"])
    table = Table(
        title=f"--take-over-native: {converted} of {len(records)} native norm(s) converted", title_justify="left"
    )
    for column in ("node", "op", "now", "why left"):
        table.add_column(column)
    for record in records:
        table.add_row(
            record["name"] or "-",
            record["from"],
            (record["to"] or "-") if record["converted"] else "(kept)",
            record["reason"] or "-",
        )
    console.print(table)


def print_summary(console: Console, report: OptimizeReport) -> None:
    if not report.norms:
        return  # print_norms said so in one line
    rules = Table(title="fused per rule", title_justify="left")
    rules.add_column("rule")
    rules.add_column("count", justify="right")
    for rule, count in sorted(report.rule_counts.items()):
        rules.add_row(rule, str(count))
    console.print(rules)
    ops = Table(title="ops before and after", title_justify="left")
    ops.add_column("op")
    ops.add_column("before", justify="right")
    ops.add_column("after", justify="right")
    for op in sorted(set(report.ops_before) | set(report.ops_after)):
        before, after = report.ops_before.get(op, 0), report.ops_after.get(op, 0)
        if before != after:
            ops.add_row(op, str(before), str(after))
    console.print(ops)
