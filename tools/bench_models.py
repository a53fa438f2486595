"""Bench onnx-norm on a larger LLaMA-style model than the bundled examples: hidden size 2048 and sequence 512 by
default, random weights (nothing is downloaded), exported with torch's TorchScript exporter, then timed original
(ONNX Runtime, ORT_ENABLE_ALL) against optimized, with the same machinery as `onnx-norm bench`.

    python tools/bench_models.py                                   # fp32 and fp16, hidden 2048, sequence 512
    python tools/bench_models.py --hidden 4096 --layers 1 --sequence 1024 --dtype fp16 --threads 2 --profile
    python tools/bench_models.py --keep /tmp/llama-2048             # keep the exported and optimized models
    python tools/bench_models.py --dtype fp16 --provider cuda --cuda-graph   # on a GPU, as CUDA graphs

Needs torch and transformers (the zoo's dependencies). Prints one table per model and a summary table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx
from rich.console import Console
from rich.table import Table

from onnx_norm.bench import OPTIMIZED, ORIGINAL, BenchReport, bench
from onnx_norm.bench_plot import plot_speedups
from onnx_norm.cli import expected_error
from onnx_norm.cli.bench import print_report
from onnx_norm.dtypes import type_name
from onnx_norm.zoo.export import output_names_of, to_torch, write_onnx
from onnx_norm.zoo.models import ZooModel, build_model, example_inputs


def llama_spec(hidden: int, layers: int, vocab: int, heads: int, sequence: int) -> ZooModel:
    config = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        # LLaMA's MLP width: 8/3 of the hidden size, rounded up to a multiple of 256.
        "intermediate_size": -(-(8 * hidden // 3) // 256) * 256,
        "max_position_embeddings": max(2048, sequence),
    }
    return ZooModel(f"llama-h{hidden}-l{layers}", "LlamaConfig", config, ort_model_type="gpt2")


def export_model(spec: ZooModel, dtype: str, exporter: str, path: Path, console: Console) -> None:
    import torch

    start = time.perf_counter()
    model = build_model(spec, seed=0)
    trace = example_inputs(spec, 1, 8, seed=0)
    names = output_names_of(model, to_torch(trace, torch.float32))
    write_onnx(model, spec, exporter, dtype, trace, path, names)
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    console.print(f"exported {path.name} ({size / 2**20:.0f} MiB) in {time.perf_counter() - start:.0f}s")


Row = tuple[str, int, str, int, BenchReport]  # model file, hidden size, dtype, norms fused, bench report


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    console = Console()
    try:
        rows = _measure(args, console)
    except Exception as err:
        message = expected_error(err)  # the CLI's: bad input or a machine that cannot run it, one line
        if message is None:
            raise
        print(f"bench_models: {message}", file=sys.stderr)
        return 2
    console.print(_summary(args, rows))
    if args.plot:
        _plot(args, rows, console)
    return 0


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[2048], help="one or more hidden sizes")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=2048, help="vocabulary (small: the embedding is not measured)")
    parser.add_argument("--sequence", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    dtypes = [type_name(t) for t in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]  # the zoo's dtype names
    parser.add_argument("--dtype", nargs="+", choices=dtypes, default=dtypes)
    parser.add_argument(
        "--exporter",
        default="torchscript-17",
        help="torchscript-<opset> (Div-style RMSNorm, which ORT fuses) or dynamo (rsqrt as Reciprocal(Sqrt))",
    )
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu", help="ONNX Runtime execution provider")
    parser.add_argument(
        "--cuda-graph", action="store_true", help="with --provider cuda: run every session as a CUDA graph"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=1, help="sessions per variant, used in turn (see bench)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="plot the speedup against the hidden size")
    parser.add_argument("--keep", type=Path, help="directory to keep the models in (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.cuda_graph and args.provider != "cuda":
        parser.error("--cuda-graph needs --provider cuda (CUDA graphs are a CUDA feature)")
    if args.vocab < 3:
        parser.error(f"--vocab must be at least 3 (ids 0 and 1 are special), got {args.vocab}")
    for name in ("layers", "heads", "sequence", "batch", "repeat", "sessions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if any(h < 1 or h % args.heads for h in args.hidden):
        parser.error(f"every --hidden must be a positive multiple of --heads {args.heads}, got {args.hidden}")
    return args


def _measure(args: argparse.Namespace, console: Console) -> list[Row]:
    """Exports (or reuses) each model, optimizes it and benches it against the original."""
    from onnx_norm.rewrite import optimize

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="onnx_norm_bench_") as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for hidden in args.hidden:
            spec = llama_spec(hidden, args.layers, args.vocab, args.heads, args.sequence)
            for dtype in args.dtype:
                path = out / f"{spec.name}-{args.exporter}-{dtype}.onnx"
                if not path.is_file():
                    export_model(spec, dtype, args.exporter, path, console)
                optimized, report = optimize(onnx.load(str(path)))
                console.print(f"{path.name}: {report.fused} norms fused ({dict(report.rule_counts)})")
                # By input name: exporters name the dims differently (dynamo writes s0, s1, ...).
                shapes = {name: [args.batch, args.sequence] for name in ("input_ids", "attention_mask")}
                result = bench(
                    str(path),
                    optimized,
                    shapes=shapes,
                    provider=args.provider,
                    cuda_graph=args.cuda_graph,
                    threads=args.threads,
                    warmup=args.warmup,
                    repeat=args.repeat,
                    sessions_per_variant=args.sessions,
                    profile=args.profile,
                )
                print_report(result, console, title=path.name)
                rows.append((path.name, hidden, dtype, report.fused, result))
    return rows


def _summary(args: argparse.Namespace, rows: list[Row]) -> Table:
    table = Table(
        title=f"LLaMA-style, {args.layers} layers, batch {args.batch}, sequence {args.sequence}, "
        f"threads {args.threads or 'default'}, {args.exporter}, {args.provider}"
        + (" as CUDA graphs" if args.cuda_graph else ""),
        title_justify="left",
    )
    columns = (
        "model",
        "norms fused",
        "original ms",
        "optimized ms",
        "speedup (p10-p90)",
        "95% CI of the median",
        "vs ORT_DISABLE_ALL",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, _, _, fused, result in rows:
        point = result.points[0]
        noopt = point.speedup_vs_noopt
        table.add_row(
            name,
            str(fused),
            f"{point.latency[ORIGINAL].median_ms:.1f}",
            f"{point.latency[OPTIMIZED].median_ms:.1f}",
            f"{point.speedup.median:.3f}x ({point.speedup.p10:.2f}-{point.speedup.p90:.2f})",
            f"{point.speedup.ci_low:.3f}-{point.speedup.ci_high:.3f} ({point.speedup.verdict})",
            "-" if noopt is None else f"{noopt.median:.3f}x",
        )
    return table


def _plot(args: argparse.Namespace, rows: list[Row], console: Console) -> None:
    """One plot per dtype: the speedup against the hidden size."""
    for dtype in args.dtype:
        series = [(hidden, result.points[0]) for _, hidden, d, _, result in rows if d == dtype]
        target = args.plot if len(args.dtype) == 1 else args.plot.with_stem(f"{args.plot.stem}-{dtype}")
        plot_speedups(
            [h for h, _ in series],
            [p for _, p in series],
            target,
            xlabel="hidden size",
            title=f"LLaMA-style {dtype}, sequence {args.sequence} ({args.exporter})",
        )
        console.print(f"plot written to {target}")


if __name__ == "__main__":
    sys.exit(main())
