"""`onnx-norm demo`: inspect, optimize, verify and bench the bundled example models; nothing is downloaded.

Exit 0 when every example passed the parity gate, 1 when one failed, 2 when the examples cannot be found.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from importlib import resources
from pathlib import Path

from rich.table import Table

from onnx_norm.cli import UsageError
from onnx_norm.cli import args as common

#: The bundled examples, in the order the demo runs them (see examples/README.md).
EXAMPLES = (
    "llama-rmsnorm-fp32.onnx",
    "llama-rmsnorm-fp16.onnx",
    "bert-layernorm-opset13.onnx",
    "llama-rmsnorm-dynamo-fp32.onnx",
    "llama-rmsnorm-dynamo-fp16.onnx",
)


RUNTIME = common.RuntimeArgs()
# The examples run in about a millisecond: enough rounds for an interval that can tell 5% apart is cheap.
MEASUREMENT = common.BenchSessionArgs(title="bench", warmup=10, repeat=300)


#: The line `onnx-norm --help` shows (given without building this command's parser).
HELP = "run inspect, optimize, verify and bench on the bundled example models"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "demo",
        help=HELP,
        description="The whole flow on small LLaMA-style (RMSNorm, fp32 and fp16, TorchScript and dynamo exports) "
        "and BERT-style (LayerNorm, opset 13) models shipped with onnx-norm.",
    )
    parser.add_argument(
        "--model",
        action="append",
        choices=[name.removesuffix(".onnx") for name in EXAMPLES],
        help="run only this example (repeatable; default: all)",
    )
    parser.add_argument("--out", type=Path, help="keep the optimized models in this directory (default: temporary)")
    RUNTIME.add(parser)
    MEASUREMENT.add(parser)
    common.add_shape_flag(parser, "input shapes for verify and bench (default: batch 1, sequence 64)")
    parser.add_argument("--examples-dir", type=Path, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)
    return parser


def examples_dir(explicit: Path | None = None) -> Path:
    """Where the bundled models are: packaged with onnx_norm, or examples/ of a source checkout."""
    candidates = [explicit] if explicit else []
    # A zipped or frozen package has no resource directory to look in.
    with contextlib.suppress(ModuleNotFoundError, TypeError):
        candidates.append(Path(str(resources.files("onnx_norm") / "examples")))
    candidates.append(Path(__file__).resolve().parents[2] / "examples")
    for candidate in candidates:
        # All of them: an install from an older checkout may carry fewer examples than this version runs.
        if candidate is not None and all((candidate / name).is_file() for name in EXAMPLES):
            return candidate
    raise UsageError(f"bundled example models not found (looked in {', '.join(str(c) for c in candidates if c)})")


def _subcommand(argv: list[str], *, temporary: bool = False) -> int:
    """Runs a subcommand as its command line; `temporary`: its output is in the demo's temporary folder, which the
    subcommand says instead of presenting a path that is gone when the demo ends."""
    from onnx_norm.cli import build_parser

    parsed = build_parser().parse_args(argv)
    if temporary:
        parsed.output_note = "into a temporary folder deleted when the demo ends; --out DIR keeps the models"
    return int(parsed.func(parsed))


def _check_before_work(args: argparse.Namespace) -> None:
    from onnx_norm.paths import OutputError, check_writable_dir

    MEASUREMENT.parse(args)
    RUNTIME.parse(args)
    common.shapes(argparse.Namespace(shape=args.shape))
    if args.out is not None:
        try:
            check_writable_dir(args.out, "--out")
        except OutputError as err:
            raise UsageError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    from onnx_norm.cli import build_parser
    from onnx_norm.cli.bench import bench_and_print, bench_options
    from onnx_norm.cli.verify import parity_options, verify_and_print
    from onnx_norm.parity import RULE_KEY

    _check_before_work(args)
    source = examples_dir(args.examples_dir)
    names = [f"{name}.onnx" for name in args.model] if args.model else list(EXAMPLES)
    shapes = args.shape or ["sequence:64"]
    console = common.console()
    summary: list[tuple[str, int, bool, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="onnx_norm_demo_") as tmp:
        out_dir = args.out or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in names:
            original = source / name
            optimized = out_dir / name.replace(".onnx", ".optimized.onnx")
            console.rule(f"[bold]{name}")
            console.print(f"[bold]$ onnx-norm inspect {original}", highlight=False, soft_wrap=True)
            _subcommand(["inspect", str(original)])
            console.print(f"[bold]$ onnx-norm optimize {original} -o {optimized}", highlight=False, soft_wrap=True)
            code = _subcommand(["optimize", str(original), "-o", str(optimized)], temporary=args.out is None)
            if code != 0 or not optimized.is_file():
                console.print(f"[bold red]optimize failed on {name} (exit {code})")
                summary.append((name, 0, False, float("nan"), "-"))
                continue
            import onnx

            fused = sum(
                1
                for node in onnx.load(str(optimized), load_external_data=False).graph.node
                if any(prop.key == RULE_KEY for prop in node.metadata_props)
            )
            # The verify and bench steps run exactly the command lines they echo: parsed by the CLI's parser.
            verify_argv = ["verify", str(original), str(optimized), "--per-node", "--shape", *shapes]
            verify_argv += RUNTIME.flags(args)
            console.print(f"[bold]$ {common.command_line(verify_argv)}", highlight=False, soft_wrap=True)
            verify_options = parity_options(build_parser().parse_args(verify_argv))
            verify_code, _ = verify_and_print(str(original), str(optimized), verify_options, console=console)
            bench_argv = ["bench", str(original), str(optimized), "--warmup", str(args.warmup)]
            bench_argv += ["--repeat", str(args.repeat), "--sessions", str(args.sessions), "--shape", *shapes]
            bench_argv += RUNTIME.flags(args)
            console.print(f"[bold]$ {common.command_line(bench_argv)}", highlight=False, soft_wrap=True)
            options = bench_options(build_parser().parse_args(bench_argv))
            report = bench_and_print(str(original), str(optimized), options, console, title=name)
            low, high = report.speedup_ci95
            summary.append((name, fused, verify_code == 0, report.speedup, f"{low:.2f}-{high:.2f} ({report.verdict})"))

    table = Table(title="onnx-norm demo", title_justify="left")
    for column in ("model", "norms fused", "parity", "speedup vs ORT_ENABLE_ALL", "95% CI of the median"):
        table.add_column(column, justify="left" if column in ("model", "parity") else "right")
    for name, fused, passed, speedup, interval in summary:
        verdict = "[green]PASSED[/]" if passed else "[red]FAILED[/]"
        table.add_row(name, str(fused), verdict, f"{speedup:.2f}x", interval)
    console.print(table)
    return 0 if all(passed for _, _, passed, _, _ in summary) else 1
