"""Real exporter output: tiny Hugging Face models exported with each exporter and dtype (see onnx_norm/zoo).

For each (model, exporter, dtype) the optimized model must contain one fused op per norm module the torch
forward pass ran, no decomposed or native norm may remain, it must pass onnx.checker, and its outputs must match
the original's under ONNX Runtime on the CPU. Default: a subset of models; ONNX_NORM_FULL_ZOO=1 for all.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

pytest.importorskip("torch", reason="the zoo needs torch")
pytest.importorskip("transformers", reason="the zoo needs transformers")

import onnx_norm
import onnx_norm.rewrite
from onnx_norm import zoo
from onnx_norm.zoo import ZooExport
from onnx_norm.zoo.compare import TOLERANCES, compare_outputs
from onnx_norm.zoo.detect import decomposed_norms, fused_norms, native_norms

# The zoo fixtures live next to this module rather than in conftest.py, which other test modules own.
pytest_plugins = ("zoo_fixtures",)

# The default run covers DEFAULT_SUBSET (one model per norm shape) with every exporter and dtype. The cases of one
# model are one pytest-xdist unit (conftest.py): its exports (the fp16-converted ones read the fp32 ones) are made on
# one worker, while the models spread over all of them.
FULL_ZOO = os.environ.get("ONNX_NORM_FULL_ZOO", "") not in ("", "0")
ZOO_CASES = [
    pytest.param(
        model, exporter, dtype, id=f"{model}-{exporter}-{dtype}", marks=[pytest.mark.xdist_group(f"zoo-{model}")]
    )
    for model in (tuple(zoo.ZOO) if FULL_ZOO else zoo.DEFAULT_SUBSET)
    for exporter in zoo.EXPORTERS
    for dtype in zoo.DTYPES
]


def _session(model: onnx.ModelProto, options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _library_options() -> ort.SessionOptions:
    """Session options with our custom-op library registered, or plain options where it is not built (the
    model-local functions then run the fused ops)."""
    try:
        return onnx_norm.session_options()
    except (ImportError, FileNotFoundError, OSError):
        return ort.SessionOptions()


def _run(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))


def _reported_fusions(report: onnx_norm.rewrite.OptimizeReport) -> int:
    """Norms the report says were fused: matched decomposed norms plus native norm ops taken over."""
    return len(report.norms) + len(report.native_taken_over)


def _export(zoo_export, model: str, exporter: str, dtype: str) -> tuple[ZooExport, onnx.ModelProto]:
    exported = zoo_export(model, exporter, dtype)
    return exported, onnx.load(exported.path)


@pytest.mark.parametrize(("model", "exporter", "dtype"), ZOO_CASES)
def test_export_holds_one_norm_per_module_call(zoo_export, model: str, exporter: str, dtype: str) -> None:
    """The zoo itself: every norm module call appears in the export, fused by the exporter or decomposed, so
    that the rewrite tests below count against the right number."""
    exported, proto = _export(zoo_export, model, exporter, dtype)
    onnx.checker.check_model(proto, full_check=True)
    assert exported.norms_in_forward > 0
    in_graph = len(decomposed_norms(proto)) + sum(native_norms(proto).values())
    assert in_graph == exported.norms_in_forward, f"norm calls in forward: {exported.norm_calls}"


@pytest.mark.parametrize(("model", "exporter", "dtype"), ZOO_CASES)
def test_optimize_fuses_every_norm(zoo_export, model: str, exporter: str, dtype: str) -> None:
    exported, original = _export(zoo_export, model, exporter, dtype)
    take_over = bool(native_norms(original))

    optimized, report = onnx_norm.optimize(original, take_over_native=take_over)

    expected = exported.norms_in_forward
    assert sum(fused_norms(optimized).values()) == expected, (
        f"fused {dict(fused_norms(optimized))}, norm calls in forward {exported.norm_calls}"
    )
    assert _reported_fusions(report) == expected, (
        f"report: {report.rule_counts}, {len(report.native_taken_over)} taken over"
    )
    assert decomposed_norms(optimized) == [], "decomposed norms left in the graph"
    assert not native_norms(optimized), f"native norms not taken over: {dict(native_norms(optimized))}"
    # What `inspect --explain` lists: an exception of onnx-norm's own is a bug, never a near-miss of the model.
    assert not [m for m in report.near_misses if m.error], report.near_misses
    onnx.checker.check_model(optimized, full_check=True)

    inputs = exported.inputs()
    original_outputs = _run(_session(original), inputs)
    optimized_outputs = _run(_session(optimized, _library_options()), inputs)
    parity = compare_outputs(original_outputs, optimized_outputs, exported.golden(), TOLERANCES[dtype])
    assert parity.passed, parity.reason


def test_norm_calls_count_shared_modules_per_call_and_nested_modules_once() -> None:
    import torch

    class WrapperRMSNorm(torch.nn.Module):  # a norm class (by its name) whose forward calls another norm module
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.LayerNorm(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = torch.nn.LayerNorm(4)
            self.wrapped = WrapperRMSNorm()
            self.unused = torch.nn.RMSNorm(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.wrapped(self.shared(self.shared(x)))

    usage = zoo.count_norm_calls(Net(), {"x": torch.ones(2, 4)})
    assert dict(usage.calls) == {"LayerNorm": 2, "WrapperRMSNorm": 1}
    assert usage.modules == ["shared", "shared", "wrapped"]


def _graph(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto]) -> onnx.ModelProto:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])
    graph = helper.make_graph(nodes, "g", [x], [y], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_detector_finds_a_decomposed_rms_norm_and_ignores_a_plain_mean() -> None:
    from onnx import helper, numpy_helper

    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    eps = numpy_helper.from_array(np.array(1e-6, np.float32), "eps")
    rms = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], name="rms_mean"),
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["y"]),
    ]
    assert decomposed_norms(_graph(rms, [two, eps])) == ["rms_mean"]
    plain = [  # a mean that is subtracted but never reaches a square root (pooling, centring)
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1], name="mean"),
        helper.make_node("Sub", ["x", "m"], ["y"]),
    ]
    assert decomposed_norms(_graph(plain, [])) == []


def test_detector_reads_other_exporters_spellings_and_counts_one_norm_per_square_root() -> None:
    """tf2onnx's GlobalAveragePool mean, paddle2onnx's Identity after every op, and E[x^2] - E[x]^2 (two
    reductions, one norm); a GlobalAveragePool that is only pooled stays unreported."""
    from onnx import TensorProto, helper, numpy_helper

    eps = numpy_helper.from_array(np.array(1e-6, np.float32), "eps")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 8])

    def model(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
        graph = helper.make_graph(nodes, "g", [x], [y], [eps])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

    tf_rms = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("GlobalAveragePool", ["sq"], ["ms"], name="gap"),
        helper.make_node("Identity", ["ms"], ["ms1"]),
        helper.make_node("Identity", ["ms1"], ["ms2"]),
        helper.make_node("Identity", ["ms2"], ["ms3"]),
        helper.make_node("Add", ["ms3", "eps"], ["v"]),
        helper.make_node("Identity", ["v"], ["v1"]),
        helper.make_node("Sqrt", ["v1"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["y"]),
    ]
    assert decomposed_norms(model(tf_rms)) == ["gap"]
    moments = [  # LayerNormalization-17's function body: Var = E[x^2] - E[x]^2
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1], name="mean"),
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["m2"], axes=[-1], name="mean_sq"),
        helper.make_node("Mul", ["m", "m"], ["msq"]),
        helper.make_node("Sub", ["m2", "msq"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["s"]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Div", ["d", "s"], ["y"]),
    ]
    assert len(decomposed_norms(model(moments))) == 1
    pooled = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Sub", ["x", "p"], ["y"])]
    assert decomposed_norms(model(pooled)) == []


def test_two_workers_asking_for_one_export_make_it_once(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test workers share the cache: one that finds an export under way waits for it instead of exporting the
    same model again (a dynamo export takes seconds to a minute), and both get the same export."""
    import concurrent.futures
    import importlib
    import json
    import threading
    import time

    zoo_export_module = importlib.import_module("onnx_norm.zoo.export")  # the package's `export` is the function

    calls: list[str] = []
    started = threading.Event()

    def slow_export(spec, exporter, dtype, directory, root) -> None:
        calls.append(spec.name)
        started.set()
        time.sleep(0.3)  # long enough for the other thread to arrive while the export is under way
        meta = {"norm_calls": {"LayerNorm": 1}, "output_names": ["y"], "dynamic_shapes_ok": True}
        (directory / "meta.json").write_text(json.dumps(meta))

    monkeypatch.setattr(zoo_export_module, "_export_into", slow_export)

    def ask(_: int) -> ZooExport:
        return zoo.export("bert", "dynamo", "fp32", tmp_path)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(ask, 0)
        assert started.wait(10)
        second = pool.submit(ask, 1)
        results = [first.result(), second.result()]
    assert calls == ["bert"]
    assert results[0] == results[1] and results[0].norms_in_forward == 1
    assert not [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith(".bert-")]  # no staging left
