"""tools/gpu_check.py's bandwidth table: bytes moved per op, CUDA-graph timing, and the copy, torch and Triton
baselines."""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpu_backends import TorchHarnessBackend
from gpu_cases import F16, HARNESS, OPS, SIGNATURES, TYPE_NAMES, measure_by_priority

# --------------------------------------------------------------------------------------------- bandwidth


def bytes_moved(op: str, element_size: int, rows: int, cols: int) -> int:
    """Bytes one call must read and write at least: X and Y (and Skip and Sum for the Skip ops) once, plus
    Scale (and Bias for LayerNorm)."""
    skip_op, rms = SIGNATURES[op].skip, SIGNATURES[op].rms
    return rows * cols * element_size * (2 + (2 if skip_op else 0)) + cols * element_size * (1 if rms else 2)


@dataclasses.dataclass
class BenchRow:
    op: str
    dtype: str
    shape: tuple[int, int]
    bytes_moved: int
    ours_us: float
    copy_us: float
    torch_us: float
    triton_us: float | None
    timing: str  # "graph" or "events" (capture failed)
    # Ours with clusters off (one block per row), where the launcher may split rows over a cluster.
    single_us: float | None = None

    def cells(self) -> list[str]:
        gbs = self.bytes_moved / (self.ours_us * 1e3)
        copy_gbs = self.bytes_moved / (self.copy_us * 1e3)
        triton = "-" if self.triton_us is None else f"{self.triton_us:.1f}"
        vs_triton = "-" if self.triton_us is None else f"{self.triton_us / self.ours_us:.2f}x"
        return [
            self.op,
            self.dtype,
            f"{self.shape[0]}x{self.shape[1]}",
            f"{self.bytes_moved / 1e6:.1f}",
            f"{self.ours_us:.1f}",
            f"{gbs:.0f}",
            f"{copy_gbs:.0f}",
            f"{100 * gbs / copy_gbs:.0f}%",
            f"{self.torch_us:.1f}",
            f"{self.torch_us / self.ours_us:.2f}x",
            triton,
            vs_triton,
            "-" if self.single_us is None else f"{self.single_us:.1f}",
            self.timing,
        ]


BENCH_HEADER = [
    "op", "dtype", "shape", "MB", "ours us", "ours GB/s", "copy GB/s", "of copy", "torch us", "vs torch",
    "triton us", "vs triton", "no-cluster us", "timing",
]  # fmt: skip
BENCH_NOTE = (
    "MB: bytes read + written per call (X, Skip, Scale, Bias, Y, Sum). GB/s = MB / time. copy: a device-to-device "
    "copy moving the same bytes. torch: F.layer_norm / F.rms_norm (Skip ops: x + skip first). triton: one row per "
    "program (tools/gpu_harness/triton_norm.py). vs: their time / ours. no-cluster: ours with clusters off (one "
    "block per row), where rows are few (rows x 2 <= SMs) or wider than a block's shared memory. timing: median "
    "over replays of a CUDA "
    "graph of the calls (inputs rotated past L2), or CUDA events around eager calls where capture failed."
)


def time_calls(torch: Any, calls: list[Callable[[], None]], use_graph: bool, replays: int = 15) -> float:
    """Median microseconds per call: the calls captured once in a CUDA graph and the graph replayed between
    CUDA events (no Python or launch overhead in the timing), or, with use_graph False, the calls launched
    eagerly between the events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # warm-up outside the capture (lazy init, attribute calls)
            call()
    torch.cuda.current_stream().wait_stream(stream)
    run: Callable[[], None]
    if use_graph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for call in calls:
                call()
        run = graph.replay
    else:

        def run() -> None:
            for call in calls:
                call()

    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times)


def _load_triton() -> Any:
    """tools/gpu_harness/triton_norm.py, or None when triton is missing or does not work here."""
    try:
        sys.path.insert(0, str(HARNESS.parent))
        import triton_norm

        return triton_norm if triton_norm.available() else None
    except Exception:  # no triton, or a triton that cannot compile here: the column says "-"
        return None


@dataclasses.dataclass
class _BenchSet:
    """Input sets for one op x dtype x shape (rotated so one graph replay streams past L2), and the calls timed
    on them: our launch, torch's kernels, the Triton stand-in and a same-size device-to-device copy."""

    backend: TorchHarnessBackend
    op: str
    dtype: int
    rows: int
    cols: int
    sets: int
    tensors: dict[str, list[Any]]
    weight: Any
    bias: Any

    @property
    def skip_op(self) -> bool:
        return SIGNATURES[self.op].skip

    @property
    def rms(self) -> bool:
        return SIGNATURES[self.op].rms

    @classmethod
    def make(
        cls, backend: TorchHarnessBackend, op: str, dtype: int, shape: tuple[int, int], per_call: int, l2_bytes: int
    ) -> _BenchSet:
        torch, device = backend.torch, backend.device
        tdtype = backend._torch_types[dtype]
        rows, cols = shape
        # Enough input sets that one graph replay streams more than twice the L2 cache.
        sets = max(2, min(8, math.ceil(l2_bytes / per_call)))
        skip_op, rms = SIGNATURES[op].skip, SIGNATURES[op].rms
        xs = [torch.randn(rows, cols, device=device, dtype=tdtype) for _ in range(sets)]
        srcs = [torch.empty(per_call // 2, dtype=torch.uint8, device=device) for _ in range(sets)]
        tensors = {
            "x": xs,
            "skip": [torch.randn_like(xs[0]) for _ in range(sets)] if skip_op else [],
            "y": [torch.empty_like(xs[0]) for _ in range(sets)],
            "sum": [torch.empty_like(xs[0]) for _ in range(sets)] if skip_op else [],
            "src": srcs,
            "dst": [torch.empty_like(s) for s in srcs],
        }
        weight = torch.randn(cols, device=device, dtype=tdtype)
        bias = None if rms else torch.randn(cols, device=device, dtype=tdtype)
        return cls(backend, op, dtype, rows, cols, sets, tensors, weight, bias)

    def ours(self, i: int, clusters: bool = True) -> Callable[[], None]:
        t, torch = self.tensors, self.backend.torch

        def call() -> None:
            self.backend.harness.launch(
                x=t["x"][i].data_ptr(), y=t["y"][i].data_ptr(), rows=self.rows, cols=self.cols,
                x_type=self.dtype, y_type=self.dtype, stream=torch.cuda.current_stream().cuda_stream,
                skip=t["skip"][i].data_ptr() if self.skip_op else None, scale=self.weight.data_ptr(),
                bias=self.bias.data_ptr() if self.bias is not None else None,
                sum_out=t["sum"][i].data_ptr() if self.skip_op else None, scale_size=self.cols,
                scale_type=self.dtype, rms=self.rms, device=self.backend.device.index, clusters=clusters,
            )  # fmt: skip

        return call

    def eager(self, i: int) -> Callable[[], None]:
        t, functional = self.tensors, self.backend.torch.nn.functional

        def call() -> None:
            h = t["x"][i] + t["skip"][i] if self.skip_op else t["x"][i]
            if self.rms:
                functional.rms_norm(h, (self.cols,), self.weight, 1e-5)
            else:
                functional.layer_norm(h, (self.cols,), self.weight, self.bias, 1e-5)

        return call

    def triton(self, triton_norm: Any, i: int) -> Callable[[], None]:
        t = self.tensors
        skip = t["skip"][i] if self.skip_op else None
        sum_out = t["sum"][i] if self.skip_op else None
        return lambda: triton_norm.norm(t["x"][i], skip, self.weight, self.bias, t["y"][i], sum_out, 1e-5, self.rms)

    def copy(self, i: int) -> Callable[[], None]:
        return lambda: self.tensors["dst"][i].copy_(self.tensors["src"][i])


def _bench_one(
    backend: TorchHarnessBackend, op: str, dtype: int, rows: int, cols: int, l2_bytes: int, use_graph: bool
) -> BenchRow:
    torch = backend.torch
    size = torch.tensor([], dtype=backend._torch_types[dtype]).element_size()
    per_call = bytes_moved(op, size, rows, cols)
    inputs = _BenchSet.make(backend, op, dtype, (rows, cols), per_call, l2_bytes)
    order = [i % inputs.sets for i in range(2 * inputs.sets)]

    def timed(make: Callable[[int], Callable[[], None]]) -> float:
        return time_calls(torch, [make(i) for i in order], use_graph)

    triton_norm = _load_triton()
    triton_us = None
    if triton_norm is not None and triton_norm.supports(cols, size):
        triton_us = timed(lambda i: inputs.triton(triton_norm, i))
    props = torch.cuda.get_device_properties(backend.device)
    optin = getattr(props, "shared_memory_per_block_optin", 227 * 1024)
    single_us = None
    if rows * 2 <= props.multi_processor_count or cols * size > optin:
        single_us = timed(lambda i: inputs.ours(i, clusters=False))
    mode = "graph" if use_graph else "events"
    return BenchRow(
        op, TYPE_NAMES[dtype], (rows, cols), per_call, timed(inputs.ours), timed(inputs.copy), timed(inputs.eager),
        triton_us, mode, single_us,
    )  # fmt: skip


def bench(
    backend: TorchHarnessBackend,
    shapes: Iterable[tuple[int, int]],
    dtypes: Iterable[int],
    use_graph: bool,
    deadline: float,
) -> tuple[list[BenchRow], int]:
    """The bandwidth rows until `deadline` (time.perf_counter()), measured goals first (`by_priority`) and
    returned op by op; also how many were left out."""
    torch = backend.torch
    l2_bytes = 2 * getattr(torch.cuda.get_device_properties(backend.device), "L2_cache_size", 64 << 20)
    plan = [(op, dtype, shape) for op in OPS for dtype in dtypes for shape in shapes]

    def measure(op: str, dtype: int, shape: tuple[int, int]) -> BenchRow | None:
        try:
            return _bench_one(backend, op, dtype, *shape, l2_bytes, use_graph)
        except Exception as exc:  # one shape that cannot be timed (memory, a capture) does not end the table
            print(f"bench {op} {TYPE_NAMES[dtype]} {shape[0]}x{shape[1]}: {type(exc).__name__}: {exc}", flush=True)
            torch.cuda.synchronize()
            return None
        finally:
            torch.cuda.empty_cache()

    rows = measure_by_priority(plan, deadline, measure)
    return rows, len(plan) - len(rows)


# Across the launcher's cluster thresholds (ChooseNormConfig, docs/cuda_kernels.md), chosen without a GPU: fp16
# rows of 4096 split over a cluster while rows x 2 <= SMs (66 on an H200); rows of >= 256 vectors (2048 fp16) when
# rows are few; and rows over one block's shared memory (227 KiB: 116224 fp16 elements), where the fallback
# re-reads X. Each point is timed with clusters allowed and not.
CLUSTER_SWEEP = (
    *(("RMSNorm", rows, 4096) for rows in (1, 8, 32, 64, 66, 67, 100, 132, 264)),
    *(("SkipRMSNorm", rows, 4096) for rows in (32, 66, 67, 132)),
    *(("RMSNorm", rows, cols) for rows in (1, 32) for cols in (1024, 1536, 2048, 3072, 8192, 16384)),
    *(("LayerNorm", 256, cols) for cols in (98304, 114688, 118784, 131072, 196608)),
)
SWEEP_HEADER = ["op", "dtype", "shape", "clusters us", "no-cluster us", "no-cluster / clusters", "clusters us/row"]
SWEEP_NOTE = (
    "fp16; clusters: ours as the launcher chooses (a row split over a thread-block cluster where its thresholds "
    "say so); no-cluster: the same launch with clusters off (one block per row: register rows, or the re-read over "
    "shared memory). Where the launcher does not split, both are the same kernel (ratio ~1). A threshold is right "
    "when the ratio is >= 1 on its splitting side and the time per row has no step up as the shape crosses it."
)


def cluster_sweep(
    backend: TorchHarnessBackend,
    use_graph: bool,
    deadline: float,
    points: Iterable[tuple[str, int, int]] = CLUSTER_SWEEP,
) -> list[list[str]]:
    """The sweep's rows (SWEEP_HEADER) until `deadline`, fp16: ours with clusters allowed and not, per point."""
    torch = backend.torch
    l2_bytes = 2 * getattr(torch.cuda.get_device_properties(backend.device), "L2_cache_size", 64 << 20)
    table = []
    for op, rows, cols in points:
        if time.perf_counter() > deadline:
            break
        try:
            inputs = _BenchSet.make(backend, op, F16, (rows, cols), bytes_moved(op, 2, rows, cols), l2_bytes)
            order = [i % inputs.sets for i in range(2 * inputs.sets)]
            on = time_calls(torch, [inputs.ours(i) for i in order], use_graph)
            off = time_calls(torch, [inputs.ours(i, clusters=False) for i in order], use_graph)
        except Exception as exc:  # one point that cannot be timed does not end the sweep
            print(f"sweep {op} {rows}x{cols}: {type(exc).__name__}: {exc}", flush=True)
            torch.cuda.synchronize()
            continue
        finally:
            torch.cuda.empty_cache()
        table.append([op, TYPE_NAMES[F16], f"{rows}x{cols}", f"{on:.1f}", f"{off:.1f}", f"{off / on:.2f}x",
                      f"{on / rows:.3f}"])  # fmt: skip
    return table


def format_table(header: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    """Right-aligned columns for the terminal, or a markdown table."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(widths[i]) for i, cell in enumerate(row)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
