"""Which tool catches which norm: the model zoo through onnx-norm and through the fusions others ship.

For each (model, exporter, dtype) the table shows the norms in the model (norm-module calls in the torch forward
pass; in brackets how many the exporter already emitted as a native op), then per tool how many norms its output
holds as a fused op, and whether its outputs still match the original's:

- onnx-norm:   onnx_norm.optimize (default target; native norms taken over where the exporter emitted them)
- ort:         ONNX Runtime's own graph optimizer at ORT_ENABLE_ALL, CPU; the saved optimized model is counted
- ort-transformers: onnxruntime.transformers.optimizer.optimize_model, model_type chosen per family
- onnxscript:  onnxscript.rewriter.ort_fusions.optimize_for_ort (ORT contrib ops)
- olive-peephole: Olive's OnnxPeepholeOptimizer pass (olive-ai; Olive's OnnxScriptFusion pass is `onnxscript`)
- onnxscript-onnx: onnxscript's rules.fusion LayerNormalization and RMSNormalization rules, after converting
  the model to opset 23 (they need ReduceMean axes as an input, and RMSNormalization is opset 23)

Parity: the tool's model against the original, both under ONNX Runtime on the CPU (the original with graph
optimizations off, so that ORT's own rewrites are measured too), with the zoo's per-dtype tolerances and the
float64 torch evaluation as arbiter for fp16. "caught" counts norm ops in the output, so it includes norms the
exporter had already fused.

    python tools/coverage.py                          # the default subset, every exporter and dtype
    python tools/coverage.py --all                    # the whole zoo
    python tools/coverage.py -m llama,t5 -e torchscript-14 -d fp32 -t onnx-norm,ort
    python tools/coverage.py --fixtures                # the exporter fixtures (tf2onnx, jax2onnx, paddle2onnx, ...)
    python tools/coverage.py --fixtures tf2onnx,timm   # some of their families

The exporter fixtures are the small models tools/make_exporter_fixtures.py exported with other exporters and tool
chains (tests/data/exporters): "norms" is what the model computes, in brackets how many the exporter or tool had
already made a native op; ort-transformers runs with model_type "bert" on them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from packaging.version import Version

from onnx_norm import zoo
from onnx_norm.dtypes import onnx_opset
from onnx_norm.zoo.compare import TOLERANCES, Parity, Tolerance, compare_outputs
from onnx_norm.zoo.detect import fused_norms, native_norms

logger = logging.getLogger("coverage")
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "data" / "exporters"

# What a tool returns: the model to run for parity, how many norms its output holds fused, and how to run it.
ToolOutput = tuple[onnx.ModelProto, int, ort.SessionOptions]


@dataclasses.dataclass
class ToolResult:
    caught: int | None  # None: the tool failed; `error` says why
    parity: Parity | None = None
    error: str = ""

    def cell(self, expected: int) -> str:
        if self.caught is None:
            return f"error: {self.error}"
        mark = "" if self.caught == expected else " ✗"
        return f"{self.caught}/{expected}{mark}, {self.parity}"


# One table row: its leading cells, each tool's result (None: the export failed) and the norms expected.
Row = tuple[list[str], dict[str, ToolResult] | None, int]


def _cpu_session(model: onnx.ModelProto | str, options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _options(level: ort.GraphOptimizationLevel) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    return options


def _run(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    feed = {i.name: inputs[i.name] for i in session.get_inputs()}
    return dict(zip(names, session.run(names, feed), strict=True))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The third-party optimizers print, warn and log tracebacks a lot; the table is the output."""
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def _count_native(model: onnx.ModelProto) -> int:
    return sum(native_norms(model).values())


def run_onnx_norm(original: onnx.ModelProto, _model_type: str) -> ToolOutput:
    import onnx_norm

    optimized, _report = onnx_norm.optimize(original, take_over_native=bool(native_norms(original)))
    try:
        options = onnx_norm.session_options()
    except (ImportError, FileNotFoundError, OSError):
        options = ort.SessionOptions()  # the model-local functions run the fused ops
    return optimized, sum(fused_norms(optimized).values()), options


def run_ort(original: onnx.ModelProto, _model_type: str) -> ToolOutput:
    with tempfile.TemporaryDirectory() as tmp:
        options = _options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        _cpu_session(original, options)
        saved = onnx.load(options.optimized_model_filepath)
    # Parity runs the original under ORT_ENABLE_ALL (the saved model holds CPU-only fused ops and layouts).
    return original, _count_native(saved), _options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)


def run_ort_transformers(original: onnx.ModelProto, model_type: str) -> ToolOutput:
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(original, model_type=model_type, opt_level=0, use_gpu=False).model
    return optimized, _count_native(optimized), _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def run_onnxscript(original: onnx.ModelProto, _model_type: str) -> ToolOutput:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model, _counts = optimize_for_ort(ir.from_proto(original))
    optimized = ir.to_proto(model)
    return optimized, _count_native(optimized), _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


#: onnxscript releases whose private fusion modules this comparison was written against: its public
#: `onnx_fusions.fuse` fuses only RMSNormalization (opset 23), so the LayerNorm rule is reached privately, and only
#: within this range (outside it, the tool reports itself unavailable instead of guessing at moved internals).
ONNXSCRIPT_TESTED = (Version("0.5"), Version("0.8"))


def run_onnxscript_onnx(original: onnx.ModelProto, _model_type: str) -> ToolOutput:
    import onnx_ir as ir
    import onnxscript

    low, high = ONNXSCRIPT_TESTED
    if not low <= Version(onnxscript.__version__) < high:
        raise RuntimeError(f"onnxscript {onnxscript.__version__} is outside the tested range [{low}, {high})")
    from onnxscript.rewriter.rules.fusion import _layer_norm, _rms_normalization

    opset = onnx_opset({o.domain: o.version for o in original.opset_import})
    converted = onnx.version_converter.convert_version(original, 23) if opset < 23 else original
    model = ir.from_proto(converted)
    _layer_norm.fuse_layer_normalization(model)
    _rms_normalization.fuse_rms_normalization(model)
    optimized = ir.to_proto(model)
    return optimized, _count_native(optimized), _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def run_olive_peephole(original: onnx.ModelProto, _model_type: str) -> ToolOutput:
    # Olive's OnnxPeepholeOptimizer pass with its defaults (onnxoptimizer's step only where that package is
    # installed); Olive's OnnxScriptFusion pass is the `onnxscript` tool above (it calls optimize_for_ort).
    from olive.passes.onnx.peephole_optimizer import ModelOptimizer

    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(original, str(Path(tmp) / "model.onnx"))
        optimizer = ModelOptimizer(str(Path(tmp) / "model.onnx"))
    optimizer.onnxscript_optimize()
    optimizer.onnxoptimizer_optimize()  # logs and returns where onnxoptimizer is not installed
    optimizer.fuse_reshape_operations()
    return optimizer.model, _count_native(optimizer.model), _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


# Each tool: (the original, ONNX Runtime transformers optimizer's model_type) -> its output.
TOOLS: dict[str, Callable[[onnx.ModelProto, str], ToolOutput]] = {
    "onnx-norm": run_onnx_norm,
    "ort": run_ort,
    "ort-transformers": run_ort_transformers,
    "onnxscript": run_onnxscript,
    "onnxscript-onnx": run_onnxscript_onnx,
    "olive-peephole": run_olive_peephole,
}


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:90] if text else ''}"


def evaluate(exported: zoo.ZooExport, tools: list[str]) -> dict[str, ToolResult]:
    original = onnx.load(exported.path)
    spec = zoo.ZOO[exported.model]
    return evaluate_model(
        original, exported.inputs(), exported.golden(), TOLERANCES[exported.dtype], tools, spec.ort_model_type
    )


def evaluate_model(
    original: onnx.ModelProto,
    inputs: dict[str, np.ndarray],
    golden: dict[str, np.ndarray] | None,
    tolerance: Tolerance,
    tools: list[str],
    model_type: str,
) -> dict[str, ToolResult]:
    """Every tool on `original`: norms its output holds fused, and its outputs against the original's."""
    try:
        reference = _run(_cpu_session(original, _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)), inputs)
    except Exception as err:  # an original ONNX Runtime cannot run: nothing to compare with
        return {tool: ToolResult(None, error=f"the original does not run: {_first_line(err)}") for tool in tools}
    results = {}
    for tool in tools:
        copy = onnx.ModelProto()
        copy.CopyFrom(original)  # some tools (the transformers optimizer) rewrite the proto they are given
        try:
            with _quiet():
                rewritten, caught, options = TOOLS[tool](copy, model_type)
        except Exception as err:  # a tool that fails on a model is a result of this comparison, not a crash
            logger.debug("%s failed", tool, exc_info=True)
            results[tool] = ToolResult(None, error=_first_line(err))
            continue
        try:
            outputs = _run(_cpu_session(rewritten, options), inputs)
            parity = compare_outputs(reference, outputs, golden, tolerance)
        except Exception as err:
            parity = Parity(False, float("nan"), f"does not run: {_first_line(err)}")
        results[tool] = ToolResult(caught, parity)
    return results


def fixture_rows(tools: list[str], families: list[str] | None) -> Iterator[Row]:
    """The exporter fixtures (tests/data/exporters, made by tools/make_exporter_fixtures.py): one row each. Their
    inputs and outputs are float32, so the tools' outputs are compared with the original's alone."""
    from onnx_norm import inputs as model_inputs

    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    for family, entries in manifest.items():
        if families and family not in families:
            continue
        for entry in entries:
            original = onnx.load(FIXTURES / entry["file"])
            feeds = model_inputs.generate(original, shapes=entry["shapes"], seed=0)[0]
            internal_fp16 = any(t.data_type == onnx.TensorProto.FLOAT16 for t in original.graph.initializer)
            dtype = "fp16-converted" if internal_fp16 else "fp32"
            results = evaluate_model(original, feeds, None, TOLERANCES[dtype], tools, "bert")
            name = entry["file"].removeprefix(f"{family}-").removesuffix(".onnx")
            yield [name, family, entry["versions"], f"{entry['norms']} ({entry['native']})"], results, entry["norms"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("-m", "--models", help=f"comma-separated zoo models (default: {','.join(zoo.DEFAULT_SUBSET)})")
    parser.add_argument("--all", action="store_true", help="every model in the zoo")
    parser.add_argument("-e", "--exporters", default=",".join(zoo.EXPORTERS), help="comma-separated exporters")
    parser.add_argument("-d", "--dtypes", default=",".join(zoo.DTYPES), help="comma-separated dtypes")
    parser.add_argument("-t", "--tools", default=",".join(TOOLS), help=f"comma-separated tools ({','.join(TOOLS)})")
    parser.add_argument(
        "--fixtures",
        nargs="?",
        const="",
        default=None,
        metavar="FAMILIES",
        help="the exporter fixtures (tests/data/exporters) instead of the zoo; optionally comma-separated families",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="export cache (default: $ONNX_NORM_ZOO_CACHE, else ~/.cache/onnx-norm/zoo)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and tool failures")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")

    tools = args.tools.split(",")
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        parser.error(f"unknown tool {', '.join(unknown)}; known: {', '.join(TOOLS)}")
    started = time.monotonic()
    if args.fixtures is not None:
        families = [f for f in args.fixtures.split(",") if f] or None
        print_table(["model", "family", "versions", "norms (native)"], tools, fixture_rows(tools, families))
    else:
        print_table(["model", "exporter", "dtype", "norms (native)"], tools, zoo_rows(parser, args, tools))
    logger.info("%.0f s", time.monotonic() - started)
    return 0


def zoo_rows(parser: argparse.ArgumentParser, args: argparse.Namespace, tools: list[str]) -> Iterator[Row]:
    models = list(zoo.ZOO) if args.all else (args.models.split(",") if args.models else list(zoo.DEFAULT_SUBSET))
    choices = {
        "model": (models, zoo.ZOO),
        "exporter": (args.exporters.split(","), zoo.EXPORTERS),
        "dtype": (args.dtypes.split(","), zoo.DTYPES),
    }
    for kind, (chosen, known) in choices.items():
        unknown = [c for c in chosen if c not in known]
        if unknown:
            parser.error(f"unknown {kind} {', '.join(unknown)}; known: {', '.join(known)}")
    for model in models:
        for exporter in choices["exporter"][0]:
            for dtype in choices["dtype"][0]:
                try:
                    exported = zoo.export(model, exporter, dtype, args.cache)  # type: ignore[arg-type]
                except zoo.ZooExportError as err:
                    yield [model, exporter, dtype, f"export failed: {str(err).split(': ', 1)[-1][:80]}"], None, 0
                    continue
                native = _count_native(onnx.load(exported.path))
                cells = [model, exporter, dtype, f"{exported.norms_in_forward} ({native})"]
                yield cells, evaluate(exported, tools), exported.norms_in_forward


def print_table(columns: list[str], tools: list[str], rows: Iterator[Row]) -> None:
    """One markdown row per model, then per tool how many models had every norm caught and passed parity."""
    header = [*columns, *tools]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    totals = {tool: [0, 0, 0] for tool in tools}  # caught all, parity ok, rows
    for cells, results, expected in rows:
        if results is None:  # the export failed; the last cell says why
            print("| " + " | ".join(cells) + " |" + " |" * len(tools))
            continue
        print("| " + " | ".join([*cells, *(results[t].cell(expected) for t in tools)]) + " |", flush=True)
        for tool in tools:
            result = results[tool]
            totals[tool][2] += 1
            totals[tool][0] += result.caught == expected
            totals[tool][1] += bool(result.parity and result.parity.passed)
    print()
    print("| tool | models with every norm caught | parity passed |")
    print("|---|---|---|")
    for tool, (caught, parity, count) in totals.items():
        print(f"| {tool} | {caught}/{count} | {parity}/{count} |")


if __name__ == "__main__":
    sys.exit(main())
