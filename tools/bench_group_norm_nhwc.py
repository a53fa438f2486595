"""Bench channels-last GroupNorm as Keras (tf2onnx) and flax (jax2onnx) export it: each export of
`python tools/group_norm_nhwc_fixtures.py --bench DIR` (a UNet block's GroupNorm(32, 320) at 32x32 with G = 32 + swish
and G = 1, a VAE decoder's GroupNorm(32, 128) at 128x128 + swish; [N, H, W, C], random weights) is optimized (one
GroupNorm between two Transposes) and timed against the original under ONNX Runtime (ORT_ENABLE_ALL), with the same
machinery as `onnx-norm bench`: interleaved rounds, the speedup the median per-round ratio original / optimized, in
one run.

    python tools/group_norm_nhwc_fixtures.py --bench build/group-norm-nhwc            # tensorflow, tf2onnx, jax, ...
    python tools/bench_group_norm_nhwc.py build/group-norm-nhwc --threads 2 --repeat 50

The exports need TensorFlow and JAX (their own venv: tools/group_norm_nhwc_fixtures.py); this script needs only
onnx-norm. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import onnx

from onnx_norm.bench import OPTIMIZED, ORIGINAL, bench
from onnx_norm.rewrite import optimize


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where group_norm_nhwc_fixtures.py --bench wrote the exports")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=50, help="timed rounds per model (default 50)")
    return parser.parse_args(argv)


def _row(entry: dict, folder: Path, args: argparse.Namespace) -> str:
    original = onnx.load(str(folder / entry["file"]))
    optimized, _ = optimize(original)
    fused = sum(n.op_type == "GroupNorm" for n in optimized.graph.node)
    if fused != 1:
        raise SystemExit(f"{entry['file']}: {fused} GroupNorm fused, expected 1; the bench would time nothing")
    result = bench(original, optimized, threads=args.threads, warmup=args.warmup, repeat=args.repeat)
    point = result.points[0]
    speedup = point.speedup
    cells = [
        entry["file"].removesuffix(".onnx"),
        "x".join(map(str, entry["shape"])),
        str(entry["groups"]),
        "yes" if entry["silu"] else "no",
        f"{point.latency[ORIGINAL].median_ms:.2f}",
        f"{point.latency[OPTIMIZED].median_ms:.2f}",
        f"{speedup.median:.2f}x ({speedup.ci_low:.2f}-{speedup.ci_high:.2f}, {result.verdict})",
        f"{point.latency[OPTIMIZED].median_ms / point.latency[ORIGINAL].median_ms:.2f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    manifest = args.folder / "manifest-bench.json"
    if not manifest.is_file():
        print(f"error: {manifest} not found; write it with tools/group_norm_nhwc_fixtures.py --bench", file=sys.stderr)
        return 2
    entries = json.loads(manifest.read_text())
    print(f"threads {args.threads}, {args.warmup} warm-up and {args.repeat} timed rounds, CPU provider")
    print("| export | [N, H, W, C] | G | SiLU | original ms | optimized ms | speedup (95% CI) | time ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for entry in entries:
        print(_row(entry, args.folder, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
