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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
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

from onnx_norm import zoo
from onnx_norm.zoo.compare import TOLERANCES, Parity, compare_outputs
from onnx_norm.zoo.detect import fused_norms, native_norms

logger = logging.getLogger("coverage")

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


def run_onnx_norm(original: onnx.ModelProto, _spec: zoo.ZooModel) -> ToolOutput:
    import onnx_norm

    optimized, _report = onnx_norm.optimize(original, take_over_native=bool(native_norms(original)))
    try:
        options = onnx_norm.session_options()
    except (ImportError, FileNotFoundError, OSError):
        options = ort.SessionOptions()  # the model-local functions run the fused ops
    return optimized, sum(fused_norms(optimized).values()), options


def run_ort(original: onnx.ModelProto, _spec: zoo.ZooModel) -> ToolOutput:
    with tempfile.TemporaryDirectory() as tmp:
        options = _options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        _cpu_session(original, options)
        saved = onnx.load(options.optimized_model_filepath)
    # Parity runs the original under ORT_ENABLE_ALL (the saved model holds CPU-only fused ops and layouts).
    return original, _count_native(saved), _options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL)


def run_ort_transformers(original: onnx.ModelProto, spec: zoo.ZooModel) -> ToolOutput:
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(original, model_type=spec.ort_model_type, opt_level=0, use_gpu=False).model
    return optimized, _count_native(optimized), _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def run_onnxscript(original: onnx.ModelProto, _spec: zoo.ZooModel) -> ToolOutput:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model, _counts = optimize_for_ort(ir.from_proto(original))
    optimized = ir.to_proto(model)
    return optimized, _count_native(optimized), _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def run_onnxscript_onnx(original: onnx.ModelProto, _spec: zoo.ZooModel) -> ToolOutput:
    import onnx_ir as ir
    from onnxscript.rewriter.rules.fusion import _layer_norm, _rms_normalization

    opset = next(o.version for o in original.opset_import if o.domain in ("", "ai.onnx"))
    converted = onnx.version_converter.convert_version(original, 23) if opset < 23 else original
    model = ir.from_proto(converted)
    _layer_norm.fuse_layer_normalization(model)
    _rms_normalization.fuse_rms_normalization(model)
    optimized = ir.to_proto(model)
    return optimized, _count_native(optimized), _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)


def run_olive_peephole(original: onnx.ModelProto, _spec: zoo.ZooModel) -> ToolOutput:
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


TOOLS: dict[str, Callable[[onnx.ModelProto, zoo.ZooModel], ToolOutput]] = {
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
    inputs = exported.inputs()
    reference = _run(_cpu_session(original, _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)), inputs)
    golden = exported.golden()
    results = {}
    for tool in tools:
        copy = onnx.ModelProto()
        copy.CopyFrom(original)  # some tools (the transformers optimizer) rewrite the proto they are given
        try:
            with _quiet():
                rewritten, caught, options = TOOLS[tool](copy, zoo.ZOO[exported.model])
        except Exception as err:  # a tool that fails on a model is a result of this comparison, not a crash
            logger.debug("%s failed on %s", tool, exported.directory, exc_info=True)
            results[tool] = ToolResult(None, error=_first_line(err))
            continue
        try:
            outputs = _run(_cpu_session(rewritten, options), inputs)
            parity = compare_outputs(reference, outputs, golden, TOLERANCES[exported.dtype])
        except Exception as err:
            parity = Parity(False, float("nan"), f"does not run: {_first_line(err)}")
        results[tool] = ToolResult(caught, parity)
    return results


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
        "--cache", type=Path, default=None, help="export cache (default: $ONNX_NORM_ZOO_CACHE, else .cache/zoo)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and tool failures")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")

    models = list(zoo.ZOO) if args.all else (args.models.split(",") if args.models else list(zoo.DEFAULT_SUBSET))
    choices = {
        "model": (models, zoo.ZOO),
        "exporter": (args.exporters.split(","), zoo.EXPORTERS),
        "dtype": (args.dtypes.split(","), zoo.DTYPES),
        "tool": (args.tools.split(","), TOOLS),
    }
    for kind, (chosen, known) in choices.items():
        unknown = [c for c in chosen if c not in known]
        if unknown:
            parser.error(f"unknown {kind} {', '.join(unknown)}; known: {', '.join(known)}")
    tools = args.tools.split(",")

    header = ["model", "exporter", "dtype", "norms (native)", *tools]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    totals = {tool: [0, 0, 0] for tool in tools}  # caught all, parity ok, rows
    started = time.monotonic()
    for model in models:
        for exporter in choices["exporter"][0]:
            for dtype in choices["dtype"][0]:
                try:
                    exported = zoo.export(model, exporter, dtype, args.cache)  # type: ignore[arg-type]
                except zoo.ZooExportError as err:
                    print(
                        f"| {model} | {exporter} | {dtype} | export failed: {str(err).split(': ', 1)[-1][:80]} |"
                        + " |" * len(tools)
                    )
                    continue
                native = _count_native(onnx.load(exported.path))
                results = evaluate(exported, tools)
                cells = [results[t].cell(exported.norms_in_forward) for t in tools]
                print(
                    f"| {model} | {exporter} | {dtype} | {exported.norms_in_forward} ({native}) | "
                    + " | ".join(cells)
                    + " |",
                    flush=True,
                )
                for tool in tools:
                    result = results[tool]
                    totals[tool][2] += 1
                    totals[tool][0] += result.caught == exported.norms_in_forward
                    totals[tool][1] += bool(result.parity and result.parity.passed)
    print()
    print("| tool | models with every norm caught | parity passed |")
    print("|---|---|---|")
    for tool, (caught, parity, rows) in totals.items():
        print(f"| {tool} | {caught}/{rows} | {parity}/{rows} |")
    logger.info("%.0f s", time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
