"""The run options (onnx_norm/options.py): one typed object per concern, built once, accepted by verify() and
bench(); keyword arguments still work and mean the same."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from model_builders import HIDDEN, layer_norm_model
from test_bench import _ln_models

import onnx_norm
from onnx_norm import bench, parity
from onnx_norm.inputs import InputError
from onnx_norm.options import (
    BenchKwargs,
    BenchOptions,
    CompareOptions,
    InputOptions,
    MeasureOptions,
    RuntimeOptions,
    VerifyKwargs,
    VerifyOptions,
)


def test_the_keyword_names_are_the_fields_of_the_groups():
    assert set(VerifyOptions().flat()) == set(VerifyKwargs.__annotations__)
    # bench generates one sample per point: `samples` is no option of it.
    assert set(BenchOptions().flat()) == set(BenchKwargs.__annotations__)
    assert "samples" not in BenchKwargs.__annotations__


def test_keyword_options_build_the_object_and_override_a_given_one():
    options = VerifyOptions.build(None, samples=3, atol=1e-3, threads=1)
    assert options == VerifyOptions(InputOptions(samples=3), RuntimeOptions(threads=1), CompareOptions(atol=1e-3))
    overridden = VerifyOptions.build(options, per_node=True, samples=1)
    assert overridden.compare == CompareOptions(atol=1e-3, per_node=True)
    assert overridden.input.samples == 1 and overridden.runtime.threads == 1
    assert VerifyOptions.build(options) is options  # nothing to apply: the same object


def test_an_unknown_keyword_is_a_type_error_naming_the_call():
    with pytest.raises(TypeError, match=r"verify\(\) got an unexpected keyword argument 'sample'"):
        parity.verify("a.onnx", "b.onnx", sample=3)
    with pytest.raises(TypeError, match=r"bench\(\) got an unexpected keyword argument 'samples'"):
        bench.bench("a.onnx", samples=3)
    with pytest.raises(TypeError, match=r"verify\(\) got an unexpected keyword argument 'call'"):
        parity.verify("a.onnx", "b.onnx", call="verify")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: InputOptions(samples=0), "samples must be an integer >= 1, got 0"),
        (lambda: InputOptions(seed=True), "seed must be an integer >= 0, got True"),
        (lambda: InputOptions(input_files="x.npz"), "input_files must be a list of paths, not one path"),
        (lambda: InputOptions(shapes={"sequence": -1}), "dims must not be negative"),
        (lambda: RuntimeOptions(provider="tpu"), "provider 'tpu' is not one of cpu, cuda"),
        (lambda: RuntimeOptions(threads=0), "threads must be an integer >= 1, got 0"),
        (lambda: CompareOptions(golden="exact"), "golden 'exact' is not one of auto, ort, reference, none"),
        (lambda: MeasureOptions(repeat=0), "need --warmup >= 0 and --repeat >= 1, got 5 and 0"),
    ],
)
def test_each_group_validates_its_values_when_made(make, message):
    with pytest.raises(InputError) as raised:
        make()
    assert message in str(raised.value)


def test_numpy_integers_are_integers():
    assert InputOptions(samples=np.int64(3), seed=np.int32(1)).samples == 3


def test_cuda_graphs_on_the_cpu_provider_are_refused_by_the_bench_options():
    with pytest.raises(ValueError, match="cuda_graph=True needs provider='cuda'"):
        BenchOptions(measure=MeasureOptions(cuda_graph=True))


def test_verify_takes_the_options_object_and_computes_what_the_keywords_compute(tmp_path):
    original, optimized = tmp_path / "ln.onnx", tmp_path / "ln.opt.onnx"
    onnx_norm.save(layer_norm_model(), original)
    onnx_norm.save(onnx_norm.optimize(layer_norm_model())[0], optimized)
    options = onnx_norm.VerifyOptions(onnx_norm.InputOptions(shapes={"sequence": 4}, samples=1, seed=3))
    by_object = parity.verify(original, optimized, options)
    by_keywords = parity.verify(original, optimized, shapes={"sequence": [4]}, samples=1, seed=3)
    assert by_object.passed and by_object.shapes == by_keywords.shapes == {"x": [1, 4, HIDDEN]}
    assert by_object.seed == 3 and by_object.samples == 1
    assert by_object.outputs[0].metrics.max_abs == by_keywords.outputs[0].metrics.max_abs
    # A keyword on top of the object overrides its field; the object itself is left as it was.
    assert parity.verify(original, optimized, options, samples=2).samples == 2
    assert options.input.samples == 1


def test_bench_takes_the_options_object():
    original, optimized = _ln_models()
    measure = MeasureOptions(warmup=0, repeat=2, sessions_per_variant=1, include_unoptimized=False)
    options = BenchOptions(InputOptions(shapes={"sequence": 8}), RuntimeOptions(threads=1), measure)
    report = bench.bench(original, optimized, options)
    assert report.repeat == 2 and report.sessions_per_variant == 1 and report.threads == 1
    assert report.points[0].shapes["x"][:2] == [1, 8]
    assert set(report.points[0].latency) == {"original", "optimized"}
    again = bench.bench(
        original, optimized, dataclasses.replace(options, measure=dataclasses.replace(measure, repeat=1))
    )
    assert again.repeat == 1
