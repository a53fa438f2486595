"""Honest speedup measurement: the optimized model against the original under ONNX Runtime's own optimizations.

Variants, all on the same inputs, provider and thread count, each with its own session:

- `original`: the original model with ORT_ENABLE_ALL (the baseline; ORT already fuses some norms itself);
- `optimized`: the optimized model (ORT_ENABLE_ALL, our custom-op library registered when it needs it);
- `original-noopt`: the original with ORT_DISABLE_ALL, for reference.

Runs are interleaved round by round, so that drift in the machine's load hits every variant alike, in a seeded
random order per round, so that no variant always runs right after the same other one (a run is faster after a
similar graph's); the first `warmup` rounds are not recorded. Intra-op threads do not
spin-wait, so that the idle threads of one variant's session do not compete with the variant timed after it.
The speedup is the median of the per-round ratios original / optimized, with the 10th and 90th percentiles of
those ratios as its spread and a 95% confidence interval of the median (from the order statistics, no assumption
about the distribution): the optimized model is called faster only when that interval lies above 1 and, with
several sessions per variant, every session pair's median ratio is above 1 too; slower likewise below.
On CUDA the inputs are copied to the device once and the outputs are bound there (IO binding), so host copies are
not timed.

With `cuda_graph=True` (CUDA only) every session has ONNX Runtime's `enable_cuda_graph` on: each session's first
bound runs (untimed) capture the whole model as one CUDA graph, the timed runs replay it. Capture needs fixed device
addresses, so the outputs are bound to OrtValues preallocated (static shapes, or one ordinary run's), and every point
of a sweep gets fresh sessions (a graph replays the shapes it was captured with). A model ORT cannot capture (a node
not on the CUDA provider, such as a shape op left on the CPU) fails at session creation or at its first run: for
`original-noopt` that variant is left out and its reason ("CUDA graph not possible: ...") kept in the report's
`skipped`; for the original or the optimized model there is no speedup to measure, so it is a SessionError.

Two sessions of one model can differ in speed by a few percent for the whole of their lives (where their buffers
landed in memory): with `sessions_per_variant` > 1 each variant gets that many sessions, used in turn round by
round, so that the paired ratios and their interval include that variation instead of one draw of it.

Before anything is timed, bench checks that it compares the same computation. The two models must take and give
the same tensors (`onnx_norm.correspond`: names, element types, ranks; InputError otherwise), and, unless
`parity_check=False`, the first input sample runs through the first session of the original and of the optimized
model and their outputs must agree (`onnx_norm.bench_check`: verify's tolerance, then a looser normwise test, then,
only when both fail, the float64 result of the original); InputError naming the output otherwise. The report's
`parity_check` records the result.

With `profile=True`, profiled sessions (separate from the timed ones, since profiling costs time) split the kernel
time into norm nodes and the rest: in the optimized model the fused norm ops, in the original the ops ORT fused
into a norm itself plus the nodes the rewrite removed (the decomposed norms).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import platform
import random
import sys
import tempfile
import time
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import numpy as np
import onnx
import onnxruntime as ort

from onnx_norm import bench_check, correspond, model_io, weights
from onnx_norm import inputs as model_inputs
from onnx_norm.ops.schema import OPS, native_norm_ops
from onnx_norm.options import BenchKwargs, BenchOptions, InputOptions
from onnx_norm.parity.tolerances import ToleranceSpec
from onnx_norm.paths import json_safe, write_json_atomic
from onnx_norm.sessions import (
    OptLevel,
    Runner,
    RuntimeConfig,
    RuntimeUnavailableError,
    SessionError,
    create_session,
    half_weights_policy,
    model_label,
    preallocate_outputs,
    static_output_shapes,
)

logger = logging.getLogger(__name__)

ORIGINAL = "original"
OPTIMIZED = "optimized"
UNOPTIMIZED = "original-noopt"
VARIANT_LABELS = {
    ORIGINAL: "original (ORT_ENABLE_ALL)",
    OPTIMIZED: "optimized (onnx-norm)",
    UNOPTIMIZED: "original (ORT_DISABLE_ALL)",
}
#: Op types that are a whole norm: ours, ONNX's and ONNX Runtime's contrib ops (which ORT's fusions produce).
NORM_OP_TYPES = frozenset(OPS) | frozenset(op_type for _, op_type in native_norm_ops())
_PROFILE_RUNS = 10
GIB = weights.GIB
#: At most this many bytes of weight copies, one per session, before the sessions share one copy.
PER_SESSION_WEIGHTS_LIMIT = GIB
#: Untimed bound runs of each CUDA graph session before the bench: the regular run ORT needs, then the capture.
_GRAPH_SETUP_RUNS = 2

Clock = Callable[[], float]
Progress = Callable[[int, int], None]


@dataclasses.dataclass
class LatencyStats:
    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    runs: int

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencyStats:
        ms = np.asarray(seconds, dtype=np.float64) * 1e3
        return cls(
            float(np.median(ms)),
            float(np.percentile(ms, 90)),
            float(ms.mean()),
            float(ms.min()),
            float(ms.max()),
            len(ms),
        )


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the order statistics x(l) and x(n-l+1) with l the
    largest rank such that P(Binomial(n, 1/2) <= l - 1) <= (1 - level) / 2. With too few values for that level
    it is the whole range."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    if n == 0:
        raise ValueError("no values")
    alpha = (1.0 - level) / 2.0
    # log P(B = i) from log-gamma, so that large n neither overflows nor underflows before the sum.
    log_pmf = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2) for i in range(n)]
    cdf = np.cumsum(np.exp(log_pmf))
    rank = int(np.searchsorted(cdf, alpha, side="right"))  # the l above: P(B <= l - 1) <= alpha
    if rank == 0:
        return float(x[0]), float(x[-1])
    return float(x[rank - 1]), float(x[n - rank])


@dataclasses.dataclass
class Speedup:
    """Per-round ratios baseline / candidate: their median, 10th-90th percentile spread and the median's 95%
    confidence interval."""

    median: float
    p10: float
    p90: float
    ci_low: float = math.nan
    ci_high: float = math.nan
    per_session: list[float] = dataclasses.field(default_factory=list)  # median ratio of each session pair

    @classmethod
    def of(
        cls, baseline: Sequence[float], candidate: Sequence[float], sessions: Sequence[int] | None = None
    ) -> Speedup:
        """`sessions[i]`: which session pair ran round i (several sessions per variant, used in turn)."""
        ratios = np.asarray(baseline, dtype=np.float64) / np.asarray(candidate, dtype=np.float64)
        low, high = median_interval(ratios)
        per_session: list[float] = []
        if sessions is not None and len(set(sessions)) > 1:
            index = np.asarray(sessions)
            per_session = [float(np.median(ratios[index == k])) for k in sorted(set(sessions))]
        return cls(
            float(np.median(ratios)),
            float(np.percentile(ratios, 10)),
            float(np.percentile(ratios, 90)),
            low,
            high,
            per_session,
        )

    @property
    def verdict(self) -> str:
        """ "Faster" or "slower" when the confidence interval excludes 1 and every session pair agrees (the interval
        treats rounds as independent, which rounds of the same few sessions are not), else "no measurable
        difference"."""
        if self.ci_low > 1.0 and all(m > 1.0 for m in self.per_session):
            return "faster"
        if self.ci_high < 1.0 and all(m < 1.0 for m in self.per_session):
            return "slower"
        return "no measurable difference"


@dataclasses.dataclass
class BenchPoint:
    """One input shape: latency of every variant and the speedups."""

    shapes: dict[str, list[int]]
    dims: dict[str, int]  # the swept dim's value, when sweeping
    latency: dict[str, LatencyStats]
    speedup: Speedup  # original (ORT_ENABLE_ALL) / optimized
    speedup_vs_noopt: Speedup | None  # original (ORT_DISABLE_ALL) / optimized


@dataclasses.dataclass
class ProfileSplit:
    """Kernel time per run of one variant, split into norm nodes and the rest (from ORT's profiler)."""

    norm_ms: float
    other_ms: float
    norm_nodes: int

    @property
    def norm_share(self) -> float:
        total = self.norm_ms + self.other_ms
        return self.norm_ms / total if total else 0.0


@dataclasses.dataclass
class BenchReport:
    speedup: float  # the headline: median per-round ratio original / optimized (geometric mean over sweep points)
    speedup_spread: tuple[float, float]
    speedup_ci95: tuple[float, float]  # the median's 95% interval (over a sweep: the widest of the points')
    verdict: str  # "faster", "slower" or "no measurable difference" (the interval against 1)
    provider: str
    threads: int | None
    warmup: int
    repeat: int
    sessions_per_variant: int
    points: list[BenchPoint]
    profile: dict[str, ProfileSplit] | None
    optimized_in_memory: bool
    environment: dict[str, str]
    cuda_graph: bool = False
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # variant -> why it was not measured
    weights_policy: str = ""  # how the sessions got their weights (copies per session, or one shared copy)
    #: That the two models compute the same thing, checked on the first input sample before timing.
    parity_check: bench_check.ParityCheck = dataclasses.field(default_factory=bench_check.ParityCheck)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.profile is not None:
            for name, split in self.profile.items():
                data["profile"][name]["norm_share"] = split.norm_share
        data["variants"] = VARIANT_LABELS
        data["parity_check"]["passed"] = self.parity_check.passed
        return json_safe(data)

    def write_json(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())


def interleave(
    runners: Mapping[str, Callable[[], object]],
    *,
    warmup: int,
    repeat: int,
    clock: Clock = time.perf_counter,
    progress: Progress | None = None,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Runs every runner once per round for `warmup + repeat` rounds; returns the durations (seconds) of the last
    `repeat` rounds per runner.

    Each round runs the variants in a fresh random order (seeded, so reproducible): a run is faster after a run
    of a similar graph (warm instruction caches and branch predictors), and a fixed order (original, optimized,
    ...) made a model benched against itself about 1% "faster" on a CPU. Shuffled, every variant is equally
    likely to follow every other one, itself included."""
    if warmup < 0 or repeat < 1:
        raise ValueError(f"need warmup >= 0 and repeat >= 1, got warmup={warmup}, repeat={repeat}")
    times: dict[str, list[float]] = {name: [] for name in runners}
    rounds = warmup + repeat
    order = list(runners.items())
    shuffle = random.Random(seed).shuffle
    for round_index in range(rounds):
        shuffle(order)
        for name, run in order:
            start = clock()
            run()
            elapsed = clock() - start
            if round_index >= warmup:
                times[name].append(elapsed)
        if progress is not None:
            progress(round_index + 1, rounds)
    return times


def _rotating(runs: Sequence[Callable[[], object]]) -> Callable[[], object]:
    """One runner cycling through a variant's sessions, one session per call: each variant is called once per
    round, so round r uses session r mod n of every variant."""
    if len(runs) == 1:
        return runs[0]
    cycle = itertools.cycle(runs)

    def run() -> object:
        return next(cycle)()

    return run


def _removed_node_names(original: onnx.ModelProto, optimized: onnx.ModelProto) -> frozenset[str]:
    kept = {node.name for node in optimized.graph.node}
    return frozenset(node.name for node in original.graph.node if node.name and node.name not in kept)


def profile_split(
    session_factory: Callable[[str], ort.InferenceSession],
    feeds: Mapping[str, np.ndarray],
    norm_nodes: frozenset[str],
    *,
    runs: int = _PROFILE_RUNS,
) -> ProfileSplit:
    """Profiles `runs` runs (after one unrecorded warm-up run is not possible with ORT's profiler, so the first run
    is dropped from the events) and splits kernel time into norm nodes and the rest."""
    with tempfile.TemporaryDirectory(prefix="onnx_norm_profile_") as tmp:
        session = session_factory(os.path.join(tmp, "profile"))
        for _ in range(runs + 1):
            session.run(None, dict(feeds))
        path = session.end_profiling()
        events = json.loads(Path(path).read_text())
    return split_profile_events(events, norm_nodes, runs=runs + 1, skip_first=True)


def split_profile_events(
    events: Sequence[Mapping[str, Any]], norm_nodes: frozenset[str], *, runs: int, skip_first: bool = False
) -> ProfileSplit:
    """Sums `*_kernel_time` node events per run into norm and other time. A node counts as a norm if its op type
    is in NORM_OP_TYPES or its name is in `norm_nodes`."""
    model_runs = [event for event in events if event.get("cat") == "Session" and event.get("name") == "model_run"]
    start_after = None
    if skip_first and len(model_runs) >= 2:
        first = min(model_runs, key=lambda event: event["ts"])
        start_after = first["ts"] + first["dur"]
        runs -= 1
    norm_us = other_us = 0.0
    norm_names: set[str] = set()
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        if start_after is not None and event.get("ts", 0) < start_after:
            continue
        node = event["name"][: -len("_kernel_time")]
        op = event.get("args", {}).get("op_name", "")
        if op in NORM_OP_TYPES or node in norm_nodes:
            norm_us += float(event.get("dur", 0))
            norm_names.add(node)
        else:
            other_us += float(event.get("dur", 0))
    runs = max(runs, 1)
    return ProfileSplit(norm_us / runs / 1e3, other_us / runs / 1e3, len(norm_names))


def _environment(provider: str, threads: int | None, cuda_graph: bool = False) -> dict[str, str]:
    return {
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": str(os.cpu_count()),
        "provider": provider,
        "threads": str(threads or "ORT default"),
        "cuda_graph": str(cuda_graph),
    }


@dataclasses.dataclass
class _Models:
    """The models a bench times: the original, the optimized one, labels for messages, the variants (what a session
    is made from and ORT optimization level, by variant name), and the weights policy (`_weights_policy`)."""

    original: onnx.ModelProto
    optimized: onnx.ModelProto
    in_memory: bool
    labels: dict[str, str]
    variants: dict[str, tuple[onnx.ModelProto | str | Path, OptLevel]]
    shared: weights.SharedWeights | None = None
    policy: str = ""
    half_at_run: bool = False  # sessions cast half-precision weights where used (RuntimeConfig.half_weights_at_run)
    given: dict[str, Any] = dataclasses.field(default_factory=dict)  # what the caller passed, by variant


def _load_models(original: Any, optimized: Any, include_unoptimized: bool, provider: str) -> _Models:
    original_proto = model_io.load_proto(original, resolve_external=True)
    in_memory = optimized is None
    labels = {ORIGINAL: model_label("original", original), UNOPTIMIZED: model_label("original", original)}
    labels[OPTIMIZED] = "the original model optimized in memory" if in_memory else model_label("optimized", optimized)
    if optimized is None:
        from onnx_norm.rewrite import optimize

        # Refused before the rewrite's work when not even the original's one session fits: a lower bound of what
        # `_weights_policy` checks (its weights once, the fewest fp32 copies of half-precision ones a session holds).
        least = weights.weight_bytes(original_proto) + weights.session_copies(original_proto, provider, at_run=True)
        weights.check_memory(least, "bench")

        # From the path when there is one: the rewrite memory-maps the weights instead of reading them.
        optimized, _ = optimize(original if isinstance(original, (str, Path)) else original_proto)
    optimized_proto = model_io.load_proto(optimized, resolve_external=True)
    # The CLI's line too (exit 2): a speedup between models that take or give other tensors means nothing.
    correspond.check(original_proto, optimized_proto, (original, None if in_memory else optimized))
    variants: dict[str, tuple[onnx.ModelProto | str | Path, OptLevel]] = {
        ORIGINAL: (original_proto, "all"),
        OPTIMIZED: (optimized_proto, "all"),
    }
    if include_unoptimized:
        variants[UNOPTIMIZED] = (original_proto, "disabled")
    given = {ORIGINAL: original, UNOPTIMIZED: original, OPTIMIZED: optimized}
    return _Models(original_proto, optimized_proto, in_memory, labels, variants, given=given)


def _weights_policy(models: _Models, count: int, provider: str) -> int:
    """Decides how the sessions get their weights and how many sessions per variant fit (at most `count`), says so
    in `models.policy`, and returns that number.

    Every session loading its own copy (ONNX Runtime's default, weights pre-packed) is kept while all those copies
    take at most PER_SESSION_WEIGHTS_LIMIT and half of the memory available (with external data: and every variant
    has a file ORT can load). Beyond that, with external data, every
    session of every variant reads one memory-mapped copy (`weights.SharedWeights`; the optimized model's tensors
    that hold the same bytes as the original's are the original's), with ORT's pre-packing off in all of them alike,
    so that the variants stay comparable. What each session still holds of its own (`weights.session_copies`)
    decides how many sessions per variant fit; InputError (one line, before any session is made) when not even one
    of each variant does, as verify refuses. Half-precision weights whose fp32 copies pass HALF_COPIES_LIMIT are
    cast where used in every variant alike (`models.half_at_run`): their fp32 copies then exist only while a run
    lasts, one run at a time."""
    protos = [proto for proto, _ in models.variants.values()]
    models.half_at_run = weights.half_weights_at_run(protos, provider)
    sizes = {name: weights.weight_bytes(proto) for name, (proto, _) in models.variants.items()}
    own = {name: weights.session_copies(proto, provider) for name, (proto, _) in models.variants.items()}
    # Cast where used, the fp32 copies are no session's own: they exist during one run, one run at a time.
    per_run = max(weights.session_copies(p, provider, at_run=True) for p in protos) if models.half_at_run else 0
    if models.half_at_run:
        own = dict.fromkeys(own, 0)
    copies = count * (sum(sizes.values()) + sum(own.values()))
    external = weights.has_external_data(models.original) or weights.has_external_data(models.optimized)
    available = weights.available_memory() - per_run
    # With external data ORT loads each model from its own file, as users run it: every variant needs a path (a
    # model optimized in memory has none), else one would be pre-packed and the other not.
    paths = all(isinstance(models.given[name], (str, Path)) for name in models.variants)
    if not external or (paths and copies <= min(PER_SESSION_WEIGHTS_LIMIT, available // 2)):
        per_round = sum(sizes.values()) + sum(own.values())  # one session of every variant, each its own copy
        fit = _sessions_that_fit(count, per_round, 0, per_run)
        if external:
            for name, (_, level) in list(models.variants.items()):
                models.variants[name] = (models.given[name], level)
        sessions, held = fit * len(models.variants), fit * per_round / GIB
        models.policy = f"weights: {sessions} sessions, each with its own copy ({held:.2f} GiB in all)"
        return _said(models, _fewer(models, fit, count, per_round, available), per_run)
    shared_bytes = _share(models)
    fit = _sessions_that_fit(count, sum(own.values()), shared_bytes, per_run)
    models.policy = (
        f"weights: one memory-mapped copy ({shared_bytes / GIB:.2f} GiB) shared by all {fit * len(models.variants)} "
        f"sessions, ONNX Runtime's weight pre-packing off in every variant (per-session copies would take "
        f"{copies / GIB:.2f} GiB)"
    )
    return _said(models, _fewer(models, fit, count, sum(own.values()), available), per_run)


def _sessions_that_fit(count: int, per_round: int, once: int, per_run: int) -> int:
    """How many sessions per variant (at most `count`) fit the memory available: `once` bytes held for all of them,
    `per_round` by one session of every variant, `per_run` while a run lasts. InputError (`weights.check_memory`:
    one line, the memory needed and available) when not even one session of each variant fits."""
    weights.check_memory(once + per_round + per_run, "bench")
    if per_round == 0:
        return count
    room = weights.available_memory() - per_run - weights.HEADROOM - once
    return max(1, min(count, room // per_round))


def _fewer(models: _Models, fit: int, count: int, per_round: int, available: int) -> int:
    """Says in `models.policy` why there are `fit` sessions per variant, not `count`; returns `fit`."""
    if fit < count:
        models.policy += (
            f"; {fit} session(s) per variant, not {count}: one session of each variant holds {per_round / GIB:.2f} "
            f"GiB of its own (fp32 copies of half-precision weights on ONNX Runtime's CPU provider, or the weights), "
            f"and {available / GIB:.1f} GiB is available"
        )
    return fit


def _said(models: _Models, fit: int, per_run: int) -> int:
    """Adds the half-precision weights' handling to `models.policy`, logs it, and returns `fit`."""
    if models.half_at_run:
        models.policy += "; " + half_weights_policy("in every variant alike", per_run)
    logger.info("%s", models.policy)
    return fit


def _share(models: _Models) -> int:
    """Sets up `models.shared` (the optimized model's tensors with the original's bytes served by the original's);
    returns the bytes the shared copy takes."""
    shared = weights.SharedWeights()
    original_refs = {t.name: weights.reference(t) for t in weights.handed_over(models.original)}
    unshared = 0
    for tensor in weights.handed_over(models.optimized):
        ref, same = weights.reference(tensor), original_refs.get(tensor.name)
        if same is not None and weights.same_bytes(ref, same):
            shared.alias(ref, same)
        else:
            unshared += ref.length
    models.shared = shared
    return weights.weight_bytes(models.original) + unshared


@dataclasses.dataclass
class _Point:
    """One measurement: the swept dim's value (when sweeping), the shapes asked for, and the inputs."""

    dims: dict[str, int]
    shapes: Mapping[str, Sequence[int]] | None
    sample: dict[str, np.ndarray]
    hint: str = ""  # for a run failure on generated inputs: the values and dims chosen (inputs.run_hint)


def _points(
    model: onnx.ModelProto,
    inputs: Mapping[str, np.ndarray] | None,
    options: InputOptions,
    sweep: tuple[str, Sequence[int]] | None,
) -> list[_Point]:
    """One point per value of the swept dim, else one point; each with its input sample, given or generated."""
    shapes = options.shapes
    if sweep is not None:
        dim, values = sweep
        asked = [({dim: int(value)}, {**(shapes or {}), dim: [int(value)]}) for value in values]
    else:
        asked = [({}, shapes)]
    points = []
    for dims, point_shapes in asked:
        hint = ""
        if inputs is not None:
            sample = model_inputs.check_given(model, [inputs], options.values)[0]
        else:
            files, values = options.input_files, options.values
            sample = model_inputs.prepare(model, files=files, shapes=point_shapes, seed=options.seed, values=values)[0]
            hint = "" if files else model_inputs.run_hint(model, sample, shapes=point_shapes, values=values)
        points.append(_Point(dims, point_shapes, sample, hint))
    return points


@dataclasses.dataclass
class _Timing:
    """How a bench times: rounds, sessions, clock, and whether the inputs were generated (for the hint a failed run
    gets)."""

    warmup: int
    repeat: int
    sessions_per_variant: int
    seed: int
    clock: Clock
    generated: bool


def _sessions(models: _Models, config: RuntimeConfig, count: int) -> dict[str, list[Any]]:
    """`count` sessions of every variant."""
    return {
        name: [
            create_session(proto, config.replace(optimization=level), label=models.labels[name], shared=models.shared)
            for _ in range(count)
        ]
        for name, (proto, level) in models.variants.items()
    }


def _graph_runners(
    proto: Any,
    config: RuntimeConfig,
    feeds: Mapping[str, np.ndarray],
    count: int,
    label: str,
    *,
    shared: weights.SharedWeights | None = None,
) -> list[Runner]:
    """`count` CUDA graph sessions of one variant, outputs bound to preallocated device memory, each run until it
    has captured its graph. Raises SessionError with "CUDA graph not possible" when ORT refuses the graph."""
    probe = None
    runners = []
    for _ in range(count):
        try:
            session = create_session(proto, config, label=label, shared=shared)
        except RuntimeUnavailableError:
            raise
        except SessionError as err:
            raise SessionError(f"CUDA graph not possible: {err}") from err
        if probe is None and static_output_shapes(session) is None:
            # An ordinary session gives the output shapes; its own errors are the model's, not the graph's.
            probe = create_session(proto, config.replace(cuda_graph=False), label=label, shared=shared)
        outputs = preallocate_outputs(session, feeds, "cuda", config.device_id, probe=probe, label=label)
        runner = Runner(session, feeds, config, label=label, outputs=outputs)
        try:
            # ORT's CUDA EP runs once normally (allocations) before it captures: both runs happen here, untimed.
            for _ in range(_GRAPH_SETUP_RUNS):
                runner.run_bound()
        except SessionError as err:
            raise SessionError(f"CUDA graph not possible: {err}") from err
        runners.append(runner)
    return runners


def _runners(
    models: _Models, sessions: Mapping[str, Sequence[Any]] | None, point: _Point, config: RuntimeConfig, count: int
) -> tuple[dict[str, list[Runner]], dict[str, str]]:
    """The runners of every variant on one point's inputs, and the variants left out with their reason: with CUDA
    graphs, fresh graph sessions (`sessions` is None); else runners of the shared `sessions`."""
    if sessions is not None:
        return {
            name: [Runner(s, point.sample, config, label=models.labels[name]) for s in group]
            for name, group in sessions.items()
        }, {}
    runners: dict[str, list[Runner]] = {}
    skipped: dict[str, str] = {}
    for name, (proto, level) in models.variants.items():
        label = models.labels[name]
        try:
            level_config = config.replace(optimization=level)
            shared = {"shared": models.shared} if models.shared is not None else {}
            runners[name] = _graph_runners(proto, level_config, point.sample, count, label, **shared)
        except SessionError as err:
            if isinstance(err, RuntimeUnavailableError):
                raise
            if name != UNOPTIMIZED:
                raise SessionError(f"{err}; without a graph of both models there is no speedup to measure") from err
            logger.warning("%s is not timed: %s", VARIANT_LABELS[name], err)
            skipped[name] = str(err)
    return runners, skipped


def _measure(
    models: _Models,
    runners: Mapping[str, Sequence[Runner]],
    point: _Point,
    timing: _Timing,
    progress: Progress | None,
) -> BenchPoint:
    """Times every variant on one point's inputs, round by round."""
    runs = {name: _rotating([runner.run_bound for runner in group]) for name, group in runners.items()}
    try:
        times = interleave(
            runs, warmup=timing.warmup, repeat=timing.repeat, clock=timing.clock, progress=progress, seed=timing.seed
        )
    except SessionError as err:
        raise _with_hint(err, point, timing) from err
    # The runners cycle through their sessions in lockstep from the first warm-up round on.
    session_of = [(timing.warmup + i) % timing.sessions_per_variant for i in range(timing.repeat)]
    return BenchPoint(
        shapes={name: list(array.shape) for name, array in point.sample.items()},
        dims=point.dims,
        latency={name: LatencyStats.of(values) for name, values in times.items()},
        speedup=Speedup.of(times[ORIGINAL], times[OPTIMIZED], session_of),
        speedup_vs_noopt=(
            Speedup.of(times[UNOPTIMIZED], times[OPTIMIZED], session_of) if UNOPTIMIZED in times else None
        ),
    )


def _profiles(models: _Models, config: RuntimeConfig, feeds: Mapping[str, np.ndarray]) -> dict[str, ProfileSplit]:
    """Kernel time of every variant split into norm nodes and the rest: in the original, the nodes the rewrite
    removed count as norm nodes (with ORT's own norm ops)."""
    removed = _removed_node_names(models.original, models.optimized)
    config = config.replace(cuda_graph=False)  # the profiler times ORT's kernels, which a graph replay hides
    profiles = {}
    for name, (proto, level) in models.variants.items():
        norm_nodes = frozenset() if name == OPTIMIZED else removed

        def factory(prefix: str, proto: Any = proto, level: OptLevel = level) -> Any:
            level_config = config.replace(optimization=level)
            return create_session(proto, level_config, profile_prefix=prefix, shared=models.shared)

        profiles[name] = profile_split(factory, feeds, norm_nodes)
    return profiles


def _headline(points: Sequence[BenchPoint]) -> tuple[float, tuple[float, float], tuple[float, float], str]:
    """The report's speedup, spread, interval and verdict: the point's, or over a sweep the geometric mean of the
    medians, the widest spread and interval, and one verdict only when every point agrees."""
    if len(points) == 1:
        headline = points[0].speedup.median
        spread = (points[0].speedup.p10, points[0].speedup.p90)
    else:
        headline = float(np.exp(np.mean([np.log(p.speedup.median) for p in points])))
        spread = (min(p.speedup.p10 for p in points), max(p.speedup.p90 for p in points))
    interval = (min(p.speedup.ci_low for p in points), max(p.speedup.ci_high for p in points))
    verdicts = {p.speedup.verdict for p in points}
    return headline, spread, interval, verdicts.pop() if len(verdicts) == 1 else "mixed across the sweep"


def bench(
    original: str | Path | onnx.ModelProto | Any,
    optimized: str | Path | onnx.ModelProto | Any | None = None,
    options: BenchOptions | None = None,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    progress: Progress | None = None,
    clock: Clock = time.perf_counter,
    **kwargs: Unpack[BenchKwargs],
) -> BenchReport:
    """Times `optimized` against `original` (see the module docstring). With no `optimized`, the original is
    optimized in memory with `onnx_norm.optimize`. The options are a `BenchOptions` (`onnx_norm.options`), or
    keyword arguments named as its fields (applied on top of `options`): `sweep=("sequence", [128, 256])` measures
    one point per value of a symbolic dim; `cuda_graph=True` (provider "cuda" only, else ValueError) runs every
    session as a CUDA graph. `inputs` is one sample to time instead of generated inputs. Raises InputError for
    options or inputs that do not fit, for models that do not take and give the same tensors, and (unless
    `parity_check=False`) for models whose outputs on the first sample differ; SessionError when a model cannot
    run."""
    options = BenchOptions.build(options, "bench", **kwargs)
    measure, runtime = options.measure, options.runtime
    spec = bench_check.tolerances(options.check)  # its values validated before any work
    models = _load_models(original, optimized, measure.include_unoptimized, runtime.provider)
    if spec is not None:
        spec.check_names([value.name for value in models.original.graph.output])
    count = _weights_policy(models, measure.sessions_per_variant, runtime.provider)
    points = _points(models.original, inputs, options.input, measure.sweep)
    config = RuntimeConfig(runtime.provider, runtime.threads, "all", runtime.device_id, spinning=False)
    config = config.replace(cuda_graph=measure.cuda_graph, half_weights_at_run=models.half_at_run)
    generated = inputs is None and options.input.generated
    timing = _Timing(measure.warmup, measure.repeat, count, options.input.seed, clock, generated)
    measured, skipped, parity = _measure_points(models, points, config, timing, progress, spec)
    profiles = _profiles(models, config, points[-1].sample) if measure.profile else None
    headline, spread, interval, verdict = _headline(measured)
    return BenchReport(
        speedup=headline,
        speedup_spread=spread,
        speedup_ci95=interval,
        verdict=verdict,
        provider=runtime.provider,
        threads=runtime.threads,
        warmup=measure.warmup,
        repeat=measure.repeat,
        sessions_per_variant=count,
        points=measured,
        profile=profiles,
        optimized_in_memory=models.in_memory,
        environment=_environment(runtime.provider, runtime.threads, measure.cuda_graph),
        cuda_graph=measure.cuda_graph,
        skipped=skipped,
        weights_policy=models.policy,
        parity_check=parity,
    )


def _measure_points(
    models: _Models,
    points: Sequence[_Point],
    config: RuntimeConfig,
    timing: _Timing,
    progress: Progress | None,
    spec: ToleranceSpec | None,
) -> tuple[list[BenchPoint], dict[str, str], bench_check.ParityCheck]:
    """Every point measured, the variants left out with their reason, and the parity check (on the first point's
    sample, with `spec`; skipped when None). Graph sessions are made per point, with their runners; ordinary ones
    serve every point."""
    sessions = None if config.cuda_graph else _sessions(models, config, timing.sessions_per_variant)
    rounds = timing.warmup + timing.repeat
    measured: list[BenchPoint] = []
    skipped: dict[str, str] = {}
    parity = bench_check.ParityCheck(skipped="--no-parity-check (parity_check=False)") if spec is None else None
    for index, point in enumerate(points):

        def point_progress(done: int, _total: int, offset: int = index * rounds) -> None:
            if progress is not None:
                progress(offset + done, rounds * len(points))

        runners, left_out = _runners(models, sessions, point, config, timing.sessions_per_variant)
        if parity is None and spec is not None:
            parity = _parity_check(models, runners, point, spec, timing, config)
        skipped.update(left_out)
        measured.append(_measure(models, runners, point, timing, point_progress))
        del runners  # a sweep's graph sessions are freed before the next point's are made
    assert parity is not None  # there is at least one point
    return measured, skipped, parity


def _parity_check(
    models: _Models,
    runners: Mapping[str, Sequence[Runner]],
    point: _Point,
    spec: ToleranceSpec,
    timing: _Timing,
    config: RuntimeConfig,
) -> bench_check.ParityCheck:
    """The point's sample through the first timed session of the original and of the optimized model, their outputs
    compared (`bench_check`); InputError naming the output that differs. No session of its own (but the float64
    copy's, `_exact`, made only when the cheap tests fail): the check's runs are one more untimed run of each,
    before the warm-up rounds, one run at a time (as the memory policy counts)."""
    try:
        original = _outputs_of(runners[ORIGINAL][0])
        optimized = _outputs_of(runners[OPTIMIZED][0])
    except SessionError as err:
        raise _with_hint(err, point, timing) from err
    checks = bench_check.check_outputs(optimized, original, spec, lambda: _exact(models, point, config.threads))
    del original, optimized  # the outputs are not kept while the bench times
    error = bench_check.refusal(checks, models.labels[ORIGINAL], models.labels[OPTIMIZED])
    if error is not None:
        raise error
    logger.info("parity check passed: %s", bench_check.ParityCheck(checks).summary)
    return bench_check.ParityCheck(checks)


def _exact(models: _Models, point: _Point, threads: int | None) -> tuple[dict[str, np.ndarray] | None, str]:
    """The original's float64 results on the point's sample, for outputs the parity check could not decide (or None
    and why): a session of the float64 copy beside the bench's sessions, when the memory left takes it (the copy's
    weights counted twice: the float64 ones and ORT's copy of them) and freed before timing."""
    from onnx_norm.parity.golden import GoldenEvaluator

    needed = 2 * weights.weight_bytes(models.original) + weights.HEADROOM
    available = weights.available_memory()
    if needed > available:
        return None, f"the float64 copy needs about {needed / GIB:.1f} GiB, {available / GIB:.1f} GiB is left"
    evaluator = GoldenEvaluator(models.original, "auto", threads)
    if evaluator.method == "none":
        return None, "the original has no float64 evaluation (ONNX Runtime's own ops, or external data)"
    names = [value.name for value in models.original.graph.output]
    results = evaluator.run(point.sample, names)
    return (results, "") if results is not None else (None, "the float64 evaluation failed")


def _outputs_of(runner: Runner) -> dict[str, np.ndarray]:
    """One run's outputs on the host. A CUDA graph runner's run replays its graph into its bound device outputs,
    which are read from there (a bfloat16 one cannot be read into numpy from the device: it is left out)."""
    if runner.outputs is None:
        return runner.run()
    runner.run_bound()
    return {name: value.numpy() for name, value in runner.outputs.items() if value.data_type() != "tensor(bfloat16)"}


def _with_hint(err: SessionError, point: _Point, timing: _Timing) -> SessionError:
    """A failed run's error, with the hint (the values and dims chosen, the flags that set them) when the inputs were
    generated."""
    return SessionError(f"{err}{point.hint if timing.generated else ''}")


class _CallableModule(types.ModuleType):
    """This module, callable as `bench()`: `onnx_norm.bench` is the public function (onnx_norm/__init__.py), but
    importing this module (`onnx_norm.bench_plot` does, and so does the CLI) makes the import system set the package's
    `bench` attribute to the module, and a second `onnx_norm.bench(...)` then called a module."""

    def __call__(self, *args: Any, **kwargs: Any) -> BenchReport:
        return bench(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
