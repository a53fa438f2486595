"""Checks and times the `--target onnx` output on runtimes that cannot load onnx-norm's custom-op library: OpenVINO
(CPU, its ONNX frontend), onnxruntime-web's wasm backend and onnxruntime-node (both through tools/web/run_model.mjs,
as transformers.js runs a model), and ONNX Runtime's Python CPU provider without the library.

    python tools/runtime_check.py                                  # the suite below, on every runtime
    python tools/runtime_check.py --openvino --repeat 20           # OpenVINO only
    python tools/runtime_check.py --web model.onnx zoo:qwen3:dynamo  # your models / zoo exports, wasm and node
    python tools/runtime_check.py --openvino --llama-hidden 2048 --no-suite   # a LLaMA-style model at hidden 2048
    python tools/runtime_check.py --openvino model.onnx --optimized model.opt.onnx  # an optimized model of yours
    python tools/runtime_check.py --target ort --upgrade-opset 0    # ONNX Runtime's ops, at the models' own opsets

The suite: every bundled example (examples/*.onnx), the zoo's BERT (TorchScript, opset 17) and LLaMA (dynamo,
opset 20), and diffusers' blocks (tests/data: ResNet and VAE GroupNorms, AdaLayerNormContinuous with RMSNorm,
attention's q/k RMSNorm). Each model is optimized with `--target onnx` (or --target) as exported, and again after
onnx.version_converter raised its default opset to --upgrade-opset (23: RMSNormalization's; LayerNormalization needs
17, GroupNormalization 21), because `--target onnx` never raises a model's opset and exporters write 13 to 20.

Every runtime runs the original and the optimized model on the same seeded inputs; the optimized model's outputs
are compared, by onnx-norm's parity verdict and default tolerances (onnx_norm.parity.compare, with the float64
evaluation of the original), with the original run by ONNX Runtime's CPU provider and with the original run by the
same runtime. Latency: --repeat rounds, each running the original, the optimized model and (upgraded variants) the
upgraded original once, in an order that rotates from round to round; the speedup is the median of the per-round
ratios (onnx_norm.bench.Speedup, with its 95% interval), so each ratio is measured in one run. OpenVINO runs with
INFERENCE_PRECISION_HINT f32 (on CPUs with AMX or AVX512-BF16 its default is bf16, which no fp32 tolerance fits); its
table also counts the RMS and MVN layers of the compiled graph, where OpenVINO fused a norm itself. Exit 0 when every
check passed, 1 when a model did not load or run or failed parity, 2 on a usage error or a runtime that is not
installed (tools/setup.sh installs OpenVINO and the npm packages, as optional steps). Results: docs/targets.md.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
#: Where tools/setup.sh installs openvino (not into the venv: it pins numpy and pulls its telemetry package);
#: $ONNX_NORM_OPENVINO_SITE names another folder.
OPENVINO_SITE = Path(os.environ.get("ONNX_NORM_OPENVINO_SITE") or ROOT / "build" / "openvino-site")
WEB_DIR = ROOT / "tools" / "web"
RUNTIMES = ("openvino", "wasm", "node", "ort")
#: The ops `--target onnx` writes and the default opset each needs (what --upgrade-opset must reach).
STANDARD_OPS = {"LayerNormalization": 17, "GroupNormalization": 21, "RMSNormalization": 23}
#: Compiled-graph layer types of OpenVINO's CPU plugin that compute a norm in one kernel.
OPENVINO_NORM_LAYERS = ("RMS", "MVN")
SUITE_ZOO = ("zoo:bert:torchscript-17", "zoo:llama:dynamo")
SUITE_FIXTURES = (
    "tests/data/group_norm/diffusers-resnet-block-2d-torchscript.onnx",
    "tests/data/group_norm/diffusers-vae-up-decoder-block-2d-dynamo.onnx",
    "tests/data/exporters/diffusers-adalayernorm-continuous-rms-torchscript.onnx",
    "tests/data/exporters/diffusers-attention-qk-rmsnorm-dynamo.onnx",
)

Sample = dict[str, np.ndarray]


class UsageError(Exception):
    """A bad flag, a model that cannot be read, or a runtime that is not installed: one line, exit 2."""


# ----------------------------------------------------------------------------------------------------------------
# Models: what is checked


@dataclasses.dataclass
class Case:
    name: str
    original: Path
    shapes: dict[str, list[int]] | None = None
    optimized: Path | None = None  # given by the user; else the tool optimizes the original


@dataclasses.dataclass
class Variant:
    """One optimized form of a case: the user's original, and what the target made of it (or of its upgrade)."""

    case: Case
    label: str  # "as exported (opset 17)" or "opset 17->23"
    optimized: Path
    fused: int
    ops: dict[str, int]  # the standard norm ops in the optimized model
    left: str  # why norms were left decomposed, when some were
    upgraded: Path | None = None  # the original at the raised opset, not optimized (what the upgrade alone does)
    run: bool = True  # False: nothing was fused and the upgraded variant is checked instead


def check_readable(path: Path) -> None:
    """UsageError, one line, for a missing, truncated, non-ONNX or invalid file (external data is not read)."""
    from onnx_norm import model_io
    from onnx_norm.errors import InputError

    try:
        model_io.load_proto(path)
    except InputError as err:
        raise UsageError(str(err)) from err


def load(path: Path) -> onnx.ModelProto:
    """The model at `path`, external data read."""
    check_readable(path)
    return onnx.load(str(path))


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def resolve_cases(models: Sequence[str], keep: Path, console: Console) -> list[Case]:
    """Cases from paths and `zoo:NAME:EXPORTER[:DTYPE]` specs (exported into the zoo's cache)."""
    cases = []
    for item in models:
        if item.startswith("zoo:"):
            cases.append(_zoo_case(item, console))
            continue
        path = Path(item)
        if not path.is_file():
            raise UsageError(f"model not found: {item}")
        cases.append(Case(path.stem, path))
    return cases


def _zoo_case(item: str, console: Console) -> Case:
    from onnx_norm import zoo

    parts = item.split(":")[1:]
    if len(parts) not in (2, 3):
        raise UsageError(f"{item}: a zoo model is zoo:NAME:EXPORTER[:DTYPE] (exporters: {', '.join(zoo.EXPORTERS)})")
    name, exporter, dtype = (*parts, "fp32")[:3]
    start = time.perf_counter()
    try:
        found = zoo.export(name, exporter, dtype)  # type: ignore[arg-type]
    except (KeyError, ValueError, zoo.ZooExportError) as err:
        raise UsageError(f"{item}: {err}") from err
    console.print(f"{item}: zoo export ready ({time.perf_counter() - start:.0f}s)")
    return Case(f"zoo {name} {exporter} {dtype}", found.path)


def llama_case(hidden: int, layers: int, sequence: int, exporter: str, keep: Path, console: Console) -> Case:
    """A LLaMA-style model at `hidden` (tools/bench_models.py's configuration and export), kept in `keep`."""
    sys.path.insert(0, str(ROOT / "tools"))
    import bench_models

    heads = 16 if hidden % 16 == 0 else 1
    spec = bench_models.llama_spec(hidden, layers, 2048, heads, sequence)
    path = keep / f"{spec.name}-{exporter}-fp32.onnx"
    if not path.is_file():
        bench_models.export_model(spec, "fp32", exporter, path, console)
    shapes = {name: [1, sequence] for name in ("input_ids", "attention_mask")}
    return Case(f"llama hidden {hidden} x{layers} {exporter}", path, shapes)


def make_variants(case: Case, upgrade_opset: int, out: Path, target: str = "onnx") -> list[Variant]:
    """The case as exported and, below `upgrade_opset`, upgraded to it, each optimized for `target`."""
    original = load(case.original)
    opset = _opset(original)
    if case.optimized is not None:
        given = load(case.optimized)
        return [Variant(case, "given", case.optimized, -1, norm_ops(given), "")]
    stem = out / _slug(case.name)
    optimize = functools.partial(_optimized, case, target=target)
    variants = [optimize(original, f"as exported (opset {opset})", Path(f"{stem}.target-{target}.onnx"))]
    if upgrade_opset and opset < upgrade_opset:
        from onnx import version_converter

        import onnx_norm

        upgraded = version_converter.convert_version(original, upgrade_opset)
        label = f"opset {opset}->{upgrade_opset}"
        variant = optimize(upgraded, label, Path(f"{stem}.opset{upgrade_opset}.target-{target}.onnx"))
        variant.upgraded = Path(f"{stem}.opset{upgrade_opset}.onnx")
        onnx_norm.save(upgraded, variant.upgraded)
        variants.append(variant)
        variants[0].run = variants[0].fused > 0
    return variants


def _optimized(case: Case, model: onnx.ModelProto, label: str, path: Path, *, target: str) -> Variant:
    import onnx_norm

    optimized, report = onnx_norm.optimize(model, target=target)
    onnx_norm.save(optimized, path)
    reasons = collections.Counter(miss.reason.removeprefix(f"target {target}: ") for miss in report.near_misses)
    left = "; ".join(f"{count}x {reason}" for reason, count in reasons.most_common(2))
    return Variant(case, label, path, report.fused, norm_ops(optimized), left)


def norm_ops(model: onnx.ModelProto) -> dict[str, int]:
    """The norm ops in the model by type (`domain.Op` outside ONNX's domain), subgraphs and model-local functions
    included: the standard ones, ONNX Runtime's, ours, and InstanceNormalization (torch's GroupNorm)."""
    from onnx_norm.zoo.detect import model_nodes

    found: collections.Counter[str] = collections.Counter()
    for node in model_nodes(model):
        if "Norm" in node.op_type:
            found[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
    return dict(sorted(found.items()))


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-")


# ----------------------------------------------------------------------------------------------------------------
# Runtimes: each runs a list of models on the same samples and times them in turn


@dataclasses.dataclass
class Run:
    """One model on one runtime: its outputs per sample, or why it did not load or run."""

    outputs: list[Sample] | None = None
    error: str | None = None
    times_ms: list[float] = dataclasses.field(default_factory=list)
    layers: dict[str, int] | None = None  # OpenVINO: norm layers of the compiled graph

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.times_ms) if self.times_ms else None


@dataclasses.dataclass(frozen=True)
class Timing:
    warmup: int
    repeat: int
    threads: int


class Runtime:
    name = ""
    version = ""

    def run(self, models: Sequence[Path], samples: Sequence[Sample], timing: Timing) -> list[Run]:
        raise NotImplementedError


def _time_in_turn(calls: Sequence[Callable[[], object] | None], runs: Sequence[Run], timing: Timing) -> None:
    """Every model once per round, starting one model later each round: a model run first in a round (after the
    others' caches) is not always the same one. Round r's time of each model goes to its list at index r."""
    for round_ in range(timing.warmup + timing.repeat):
        for step in range(len(calls)):
            index = (round_ + step) % len(calls)
            call, run = calls[index], runs[index]
            if call is None:
                continue
            start = time.perf_counter()
            call()
            if round_ >= timing.warmup:
                run.times_ms.append((time.perf_counter() - start) * 1e3)


class OpenVINORuntime(Runtime):
    name = "openvino"

    def __init__(self) -> None:
        if OPENVINO_SITE.is_dir() and str(OPENVINO_SITE) not in sys.path:
            sys.path.append(str(OPENVINO_SITE))
        try:
            import openvino
        except ImportError as err:
            raise UsageError(
                f"openvino is not installed ({err}); bash tools/setup.sh installs it into build/openvino-site"
            ) from err
        self._ov = openvino
        self._core = openvino.Core()
        self.version = openvino.__version__.split("-")[0]

    def run(self, models: Sequence[Path], samples: Sequence[Sample], timing: Timing) -> list[Run]:
        config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": timing.threads}
        config |= {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        runs, calls = [], []
        for model in models:
            run, call = Run(), None
            try:
                compiled = self._core.compile_model(self._core.read_model(str(model)), "CPU", config)
            except Exception as err:  # OpenVINO raises RuntimeError/OpConversionFailure subclasses
                run.error = f"does not load: {openvino_error(str(err))}"
            else:
                run.layers = _openvino_layers(compiled)
                request = compiled.create_infer_request()
                names = _output_names(compiled, model)
                try:
                    run.outputs = [_named(request.infer(sample), names) for sample in samples]
                    call = _bind(request.infer, samples[0])
                except Exception as err:
                    run.error = f"does not run: {openvino_error(str(err))}"
            runs.append(run)
            calls.append(call)
        _time_in_turn(calls, runs, timing)
        return runs


def _bind(function: Callable[[Any], object], argument: Any) -> Callable[[], object]:
    return lambda: function(argument)


def _output_names(compiled: Any, model: Path) -> list[str]:
    """The ONNX output name of each compiled output: OpenVINO gives a tensor several names (get_any_name() may be
    an inner one that the Result also carries)."""
    graph_outputs = {output.name for output in onnx.load(str(model), load_external_data=False).graph.output}
    names = []
    for output in compiled.outputs:
        found = sorted(graph_outputs & set(output.get_names()))
        names.append(found[0] if found else output.get_any_name())
    return names


def _named(results: Any, names: Sequence[str]) -> Sample:
    return {name: np.array(value) for name, value in zip(names, results.values(), strict=True)}


def openvino_error(message: str) -> str:
    """The line of an OpenVINO exception that names the problem: the ops its ONNX frontend has no conversion for,
    else the last line that is not a source location."""
    found = re.search(r"No conversion rule found for operations: ([^\n]+)", message)
    if found:
        return f"OpenVINO's ONNX frontend has no conversion for {found.group(1).strip()}"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    useful = [line for line in lines if not re.match(r"^(Exception from|Check '|Summary:)", line)]
    return (useful or lines or ["(no message)"])[-1]


def _openvino_layers(compiled: Any) -> dict[str, int]:
    counts = collections.Counter(
        op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()
    )
    return {layer: counts[layer] for layer in OPENVINO_NORM_LAYERS}


class OrtRuntime(Runtime):
    """ONNX Runtime's Python CPU provider without onnx-norm's library (what a user without it runs)."""

    name = "ort"

    def __init__(self) -> None:
        import onnxruntime

        self.version = onnxruntime.__version__

    def run(self, models: Sequence[Path], samples: Sequence[Sample], timing: Timing) -> list[Run]:
        from onnx_norm.sessions import RuntimeConfig, SessionError, create_session, run_model

        runs, calls = [], []
        for model in models:
            run, call = Run(), None
            try:
                session = create_session(model, RuntimeConfig(threads=timing.threads, spinning=False), custom_ops=False)
                run.outputs = [run_model(session, sample) for sample in samples]
                call = _bind(lambda feeds, s=session: s.run(None, feeds), samples[0])
            except SessionError as err:
                run.error = str(err)
            runs.append(run)
            calls.append(call)
        _time_in_turn(calls, runs, timing)
        return runs


class NodeRuntime(Runtime):
    """onnxruntime-web's wasm backend or onnxruntime-node, run by tools/web/run_model.mjs in one Node process."""

    def __init__(self, backend: str) -> None:
        self.name = backend
        package = {"wasm": "onnxruntime-web", "node": "onnxruntime-node"}[backend]
        node = _which("node")
        if node is None:
            raise UsageError("node is not on PATH (Node 20 or newer runs tools/web/run_model.mjs)")
        manifest = WEB_DIR / "node_modules" / package / "package.json"
        if not manifest.is_file():
            raise UsageError(f"{package} is not installed; run: cd tools/web && npm ci --ignore-scripts")
        self.node = node
        self.version = json.loads(manifest.read_text())["version"]

    def run(self, models: Sequence[Path], samples: Sequence[Sample], timing: Timing) -> list[Run]:
        with tempfile.TemporaryDirectory(prefix="onnx_norm_web_") as tmp:
            folder = Path(tmp)
            write_samples(samples, folder / "inputs")
            command = [self.node, str(WEB_DIR / "run_model.mjs"), "--backend", self.name]
            command += ["--inputs", str(folder / "inputs" / "inputs.json"), "--out", str(folder / "out")]
            command += [
                "--warmup",
                str(timing.warmup),
                "--repeat",
                str(timing.repeat),
                "--threads",
                str(timing.threads),
            ]
            done = subprocess.run([*command, *map(str, models)], capture_output=True, text=True, check=False)
            result_file = folder / "out" / "result.json"
            if done.returncode != 0 or not result_file.is_file():
                error = _node_error(done.stderr, done.returncode)
                return [Run(error=f"run_model.mjs failed: {error}") for _ in models]
            result = json.loads(result_file.read_text())
            return [_node_run(entry, folder / "out") for entry in result["models"]]


def _node_error(stderr: str, returncode: int) -> str:
    """run_model.mjs's own one-line message, else the line of Node's report that names the error."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("run_model:")]
    errors = [line for line in lines if "Error" in line]
    return (ours or errors or lines or [f"exit {returncode}"])[0]


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def write_samples(samples: Sequence[Sample], folder: Path) -> None:
    """The samples as raw little-endian files and the manifest run_model.mjs reads (inputs.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = []
    for index, sample in enumerate(samples):
        entries = {}
        for position, (name, value) in enumerate(sample.items()):
            file = f"s{index}-{position}.bin"
            array = np.ascontiguousarray(value)
            (folder / file).write_bytes(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
            entries[name] = {"dtype": array.dtype.name, "shape": list(array.shape), "file": file}
        manifest.append(entries)
    (folder / "inputs.json").write_text(json.dumps({"samples": manifest}))


def read_tensor(folder: Path, entry: Mapping[str, Any]) -> np.ndarray:
    dtype = np.dtype("bool" if entry["dtype"] == "bool" else entry["dtype"]).newbyteorder("<")
    data = np.frombuffer((folder / entry["file"]).read_bytes(), dtype=dtype)
    return data.reshape(entry["shape"]).astype(dtype.newbyteorder("="))


def _node_run(entry: Mapping[str, Any], folder: Path) -> Run:
    if entry.get("error"):
        return Run(error=" ".join(str(entry["error"]).split()))
    outputs = [{name: read_tensor(folder, value) for name, value in sample.items()} for sample in entry["outputs"]]
    return Run(outputs=outputs, times_ms=list(entry.get("times_ms") or []))


def make_runtime(name: str) -> Runtime:
    if name == "openvino":
        return OpenVINORuntime()
    if name == "ort":
        return OrtRuntime()
    return NodeRuntime(name)


# ----------------------------------------------------------------------------------------------------------------
# Checks: parity by onnx-norm's verdict, latency ratios


@dataclasses.dataclass
class Reference:
    """The original run by ONNX Runtime's CPU provider on the samples, and its float64 evaluation."""

    samples: list[Sample]
    outputs: list[Sample]
    golden: list[Sample] | None
    computed_in: dict[str, np.dtype | None]


def reference(case: Case, shapes: Mapping[str, Sequence[int]] | None, n_samples: int, threads: int) -> Reference:
    from onnx_norm import inputs
    from onnx_norm.parity import GoldenEvaluator
    from onnx_norm.parity.precision import narrowest_on_path
    from onnx_norm.sessions import RuntimeConfig, create_session, run_model

    model = load(case.original)
    samples = inputs.generate(model, shapes=case.shapes or shapes, samples=n_samples, seed=0)
    session = create_session(case.original, RuntimeConfig(threads=threads), custom_ops=False)
    outputs = [run_model(session, sample) for sample in samples]
    names = list(outputs[0])
    evaluator = GoldenEvaluator(model, "auto", threads)
    golden = [evaluator.run(sample, names) for sample in samples]
    usable = None if any(g is None for g in golden) else [g for g in golden if g is not None]
    return Reference(samples, outputs, usable, narrowest_on_path(model, names))


@dataclasses.dataclass(frozen=True)
class Parity:
    """Every output of one model against another's: passed, a short text for the table, the verdicts in full."""

    passed: bool
    text: str
    detail: str = ""


def parity(actual: Sequence[Sample], expected: Sequence[Sample], ref: Reference) -> Parity:
    """`actual` against `expected` on every output of the original, by onnx_norm.parity.compare with the default
    tolerances of the narrowest float type on each output's path and the float64 evaluation of the original."""
    from onnx_norm.parity import ToleranceSpec, compare
    from onnx_norm.parity.precision import narrower

    tolerances, short, full, worst = ToleranceSpec(), [], [], 0.0
    for name in ref.outputs[0]:
        if name not in actual[0] or name not in expected[0]:
            short.append(f"{name}: missing")
            full.append(short[-1])
            continue
        dtype = np.asarray(expected[0][name]).dtype
        computed = narrower(ref.computed_in.get(name), dtype)
        tolerance = tolerances.for_output(name, dtype, computed)
        golden = None if ref.golden is None else [g[name] for g in ref.golden]
        result = compare(
            name, [a[name] for a in actual], [e[name] for e in expected], tolerance, golden, compute_dtype=computed
        )
        if not result.passed:
            short.append(f"{name}: {result.verdict.split(':')[0]} ({result.row})")
            full.append(f"{name}: {result.message}")
        elif result.metrics is not None:
            worst = max(worst, result.metrics.max_abs)
    if short:
        return Parity(False, "; ".join(short), "; ".join(full))
    return Parity(True, f"pass {worst:.2g}")


@dataclasses.dataclass
class Row:
    """One model variant on one runtime. `vs_self` (optimized against the original, both run here) is the rewrite's
    check; `vs_ort` (against the original run by ONNX Runtime) may fail where `runtime_vs_ort` (the original run
    here against ONNX Runtime) fails too: the runtime's own numerics, not the rewrite's."""

    variant: Variant
    runtime: str
    original: Run
    optimized: Run
    upgraded: Run | None = None
    vs_ort: Parity | None = None
    vs_self: Parity | None = None
    runtime_vs_ort: Parity | None = None

    @property
    def runtime_differs(self) -> bool:
        """The optimized model misses ONNX Runtime's result only as the original run here does."""
        own = self.runtime_vs_ort
        return self.vs_ort is not None and not self.vs_ort.passed and own is not None and not own.passed

    @property
    def passed(self) -> bool:
        if self.optimized.error or self.vs_ort is None:  # the original failing here is reported, not held against us
            return False
        if self.vs_self is not None and not self.vs_self.passed:
            return False
        return self.vs_ort.passed or self.runtime_differs

    def speedup(self, baseline: Run | None = None) -> Any:
        """baseline (the original by default) / optimized per round (onnx_norm.bench.Speedup: median, spread and
        95% interval); None where either was not timed."""
        from onnx_norm.bench import Speedup

        a, b = (baseline or self.original).times_ms, self.optimized.times_ms
        return Speedup.of(a, b) if a and len(a) == len(b) else None


def check(variant: Variant, runtime: Runtime, ref: Reference, timing: Timing) -> Row:
    models = [variant.case.original, variant.optimized, *([variant.upgraded] if variant.upgraded else [])]
    original, optimized, *upgraded = runtime.run(models, ref.samples, timing)
    row = Row(variant, runtime.name, original, optimized, upgraded[0] if upgraded else None)
    if optimized.outputs is not None:
        row.vs_ort = parity(optimized.outputs, ref.outputs, ref)
        if original.outputs is not None:
            row.vs_self = parity(optimized.outputs, original.outputs, ref)
    if original.outputs is not None and runtime.name != "ort":
        row.runtime_vs_ort = parity(original.outputs, ref.outputs, ref)
    return row


# ----------------------------------------------------------------------------------------------------------------
# Report


#: How the tables name the standard ops (followed by the opset each needs).
SHORT_OPS = {"LayerNormalization": "LN", "GroupNormalization": "GN", "RMSNormalization": "RMS"}


def _ops_text(variant: Variant) -> str:
    names = {op: f"{SHORT_OPS[op]}-{STANDARD_OPS[op]}" if op in SHORT_OPS else op for op in variant.ops}
    return ", ".join(f"{n} {names[op]}" for op, n in variant.ops.items()) or "none"


def _check_text(result: Parity | None, run: Run, runtime_differs: bool = False) -> str:
    if run.error:
        return f"[red]{run.error}[/red]"
    if result is None:
        return "-"
    if result.passed:
        return result.text
    if runtime_differs:
        return f"[yellow]as the original here: {result.text}[/yellow]"
    return f"[red]FAIL {result.text}[/red]"


def _ms(run: Run) -> str:
    median = run.median_ms
    return "-" if median is None else f"{median:.3g}"


def _speedup_text(row: Row, baseline: Run | None = None) -> str:
    speedup = row.speedup(baseline)
    if speedup is None:
        return "-"
    return f"{speedup.median:.3f} [{speedup.ci_low:.2f}, {speedup.ci_high:.2f}]"


def table(rows: Sequence[Row], runtime: Runtime, timing: Timing) -> Table:
    title = (
        f"{runtime.name} {runtime.version}: the optimized output; parity as max abs error when it passed; "
        f"threads {timing.threads}, median of {timing.repeat} rounds; speedup = original / optimized per round"
    )
    result = Table(title=title, title_justify="left")
    result.add_column("model", overflow="fold")
    for column in ("variant", "fused", "norm ops", "vs ORT original", "vs original here"):
        result.add_column(column)
    for column in ("original ms", "optimized ms", "speedup [95% CI]", "vs upgraded original"):
        result.add_column(column, justify="right")
    if runtime.name == "openvino":
        result.add_column("RMS/MVN layers (original -> optimized)")
    for row in rows:
        original_text = row.original.error and f"original: {row.original.error}"
        fused = "-" if row.variant.fused < 0 else str(row.variant.fused)
        cells = [row.variant.case.name, row.variant.label, fused, _ops_text(row.variant)]
        cells.append(_check_text(row.vs_ort, row.optimized, row.runtime_differs))
        cells.append(original_text or _check_text(row.vs_self, row.optimized))
        cells += [_ms(row.original), _ms(row.optimized), _speedup_text(row)]
        cells.append(_speedup_text(row, row.upgraded) if row.upgraded is not None else "-")
        if runtime.name == "openvino":
            cells.append(_layers_text(row))
        result.add_row(*cells)
    return result


def _layers_text(row: Row) -> str:
    def text(run: Run) -> str:
        return "-" if run.layers is None else "/".join(str(run.layers[name]) for name in OPENVINO_NORM_LAYERS)

    return f"{text(row.original)} -> {text(row.optimized)}"


def skipped_table(variants: Sequence[Variant], target: str) -> Table:
    title = f"--target {target} as exported: nothing fused, so only the upgraded model is run"
    result = Table(title=title, title_justify="left")
    for column in ("model", "variant", "why the norms stay decomposed"):
        result.add_column(column)
    for variant in variants:
        result.add_row(variant.case.name, variant.label, variant.left or "no norm found")
    return result


def _speedup_data(row: Row, baseline: Run | None) -> dict[str, Any] | None:
    speedup = row.speedup(baseline)
    return None if speedup is None else dataclasses.asdict(speedup)


def report_data(rows: Sequence[Row], runtimes: Sequence[Runtime], timing: Timing, target: str) -> dict[str, Any]:
    def run_data(run: Run) -> dict[str, Any]:
        return {"error": run.error, "median_ms": run.median_ms, "times_ms": run.times_ms, "layers": run.layers}

    return {
        "target": target,
        "runtimes": {runtime.name: runtime.version for runtime in runtimes},
        "timing": dataclasses.asdict(timing),
        "rows": [
            {
                "model": row.variant.case.name,
                "original": str(row.variant.case.original),
                "variant": row.variant.label,
                "fused": row.variant.fused,
                "ops": row.variant.ops,
                "left": row.variant.left,
                "runtime": row.runtime,
                "passed": row.passed,
                "vs_ort_original": None if row.vs_ort is None else dataclasses.asdict(row.vs_ort),
                "vs_original_here": None if row.vs_self is None else dataclasses.asdict(row.vs_self),
                "original_here_vs_ort": None if row.runtime_vs_ort is None else dataclasses.asdict(row.runtime_vs_ort),
                "speedup": _speedup_data(row, None),
                "speedup_vs_upgraded": None if row.upgraded is None else _speedup_data(row, row.upgraded),
                "original_run": run_data(row.original),
                "optimized_run": run_data(row.optimized),
                "upgraded_run": None if row.upgraded is None else run_data(row.upgraded),
            }
            for row in rows
        ],
    }


# ----------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="ONNX files or zoo:NAME:EXPORTER[:DTYPE]; default: the suite")
    for name in RUNTIMES:
        parser.add_argument(f"--{name}", action="store_true", help=f"run on {name} (default: every runtime)")
    parser.add_argument("--web", action="store_true", help="--wasm and --node")
    parser.add_argument("--no-suite", action="store_true", help="only the models given (and --llama-hidden)")
    parser.add_argument("--optimized", type=Path, help="with one model: its optimized form (not optimized here)")
    parser.add_argument("--target", default="onnx", help="the target to optimize for (onnx, ort or onnx-norm)")
    parser.add_argument("--upgrade-opset", type=int, default=23, help="also check each model at this opset (0: no)")
    parser.add_argument("--llama-hidden", type=int, help="also a LLaMA-style model at this hidden size")
    parser.add_argument("--llama-layers", type=int, default=1)
    parser.add_argument("--llama-sequence", type=int, default=128)
    parser.add_argument("--llama-exporter", default="torchscript-17", help="torchscript-<opset> or dynamo")
    parser.add_argument("--shape", action="append", default=[], metavar="DIM:SIZE", help="as onnx-norm's --shape")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument(
        "--threads", type=int, default=1, help="threads of every runtime (1: steadier on a loaded machine)"
    )
    parser.add_argument("--keep", type=Path, help="folder for the models made (default: build/runtime-check)")
    parser.add_argument("--report", type=Path, help="write the rows as JSON")
    args = parser.parse_args(argv)
    for name in ("samples", "repeat", "threads", "llama_layers", "llama_sequence"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.upgrade_opset < 0:
        parser.error("--warmup and --upgrade-opset must be >= 0")
    if args.optimized is not None and (len(args.models) != 1 or not args.no_suite):
        parser.error("--optimized needs exactly one model and --no-suite")
    if args.no_suite and not args.models and args.llama_hidden is None:
        parser.error("--no-suite with no model and no --llama-hidden: nothing to check")
    from onnx_norm.rewrite.targets import TARGETS

    if args.target not in TARGETS:
        parser.error(f"--target must be one of {', '.join(TARGETS)}, got {args.target!r}")
    if args.web:
        args.wasm = args.node = True
    return args


def _suite() -> list[str]:
    return [*map(str, sorted((ROOT / "examples").glob("*.onnx"))), *SUITE_ZOO, *(str(ROOT / f) for f in SUITE_FIXTURES)]


def _prepare(args: argparse.Namespace, console: Console) -> tuple[list[Runtime], list[Case], dict[str, Any], Path]:
    from onnx_norm import inputs

    chosen = [name for name in RUNTIMES if getattr(args, name)] or list(RUNTIMES)
    runtimes = [make_runtime(name) for name in chosen]  # a missing runtime is said before any model is made
    try:
        shapes = inputs.parse_shapes(args.shape)
    except inputs.InputError as err:
        raise UsageError(str(err)) from err
    if args.report is not None and not args.report.parent.is_dir():
        raise UsageError(f"--report {args.report}: folder {args.report.parent} does not exist")
    keep = args.keep or ROOT / "build" / "runtime-check"
    keep.mkdir(parents=True, exist_ok=True)
    cases = resolve_cases([*([] if args.no_suite else _suite()), *args.models], keep, console)
    if args.optimized is not None:
        cases[-1].optimized = args.optimized
    for case in cases:
        for path in (case.original, case.optimized):
            if path is not None:
                check_readable(path)
    if args.llama_hidden is not None:
        cases.append(
            llama_case(args.llama_hidden, args.llama_layers, args.llama_sequence, args.llama_exporter, keep, console)
        )
    return runtimes, cases, shapes, keep


def main(argv: Sequence[str] | None = None) -> int:
    from onnx_norm.cli import expected_error

    args = parse_args(argv)
    console = Console(width=200, emoji=False)
    try:
        return _check_all(args, console)
    except UsageError as err:
        print(f"runtime_check: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        message = expected_error(err)  # the CLI's: a model ONNX Runtime cannot run, inputs that do not fit, ...
        if message is None:
            raise
        print(f"runtime_check: {message}", file=sys.stderr)
        return 2


def _check_all(args: argparse.Namespace, console: Console) -> int:
    runtimes, cases, shapes, keep = _prepare(args, console)
    timing = Timing(args.warmup, args.repeat, args.threads)
    rows: list[Row] = []
    skipped: list[Variant] = []
    for case in cases:
        variants = make_variants(case, args.upgrade_opset, keep, args.target)
        skipped += [variant for variant in variants if not variant.run]
        ref = reference(case, shapes, args.samples, args.threads)
        for variant in (variant for variant in variants if variant.run):
            for runtime in runtimes:
                rows.append(check(variant, runtime, ref, timing))
                verdict = "pass" if rows[-1].passed else "FAIL"
                console.print(f"{case.name} / {variant.label} / {runtime.name}: {verdict}")
    if skipped:
        console.print(skipped_table(skipped, args.target))
    for runtime in runtimes:
        console.print(table([row for row in rows if row.runtime == runtime.name], runtime, timing))
    if args.report is not None:
        args.report.write_text(json.dumps(report_data(rows, runtimes, timing, args.target), indent=1, default=str))
    failed = [row for row in rows if not row.passed]
    console.print(f"{len(rows) - len(failed)}/{len(rows)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
