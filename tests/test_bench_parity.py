"""bench compares the same computation or nothing: the interface check (onnx_norm.correspond) and the parity check on
the first input sample (onnx_norm.bench_check) run in bench() itself, so that `onnx-norm bench` and
`onnx_norm.bench.bench()` refuse the same pairs with the same line, before anything is timed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import cli
from onnx import TensorProto, helper, numpy_helper
from test_bench import HIDDEN, _ln_models

from onnx_norm import bench, bench_check, sessions
from onnx_norm.errors import InputError
from onnx_norm.options import ParityCheckOptions

FAST = ["--warmup", "0", "--repeat", "1", "--sessions", "1", "--shape", "sequence:4"]
FAST_API = {"warmup": 0, "repeat": 1, "sessions_per_variant": 1, "shapes": {"sequence": 4}}


def _other_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph, inputs and outputs with another scale: a different computation that correspond cannot see."""
    other = onnx.ModelProto()
    other.CopyFrom(model)
    gamma = next(t for t in other.graph.initializer if t.name == "gamma")
    gamma.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(gamma), "gamma"))
    return other


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """A decomposed RMSNorm (a.onnx) and the same model with the scale negated (b.onnx)."""
    original, _ = _ln_models()
    onnx.save(original, tmp_path / "a.onnx")
    onnx.save(_other_weights(original), tmp_path / "b.onnx")
    return tmp_path / "a.onnx", tmp_path / "b.onnx"


def test_the_cli_refuses_a_pair_that_computes_something_else_before_timing(pair: tuple[Path, Path], tmp_path):
    a, b = pair
    report = tmp_path / "bench.json"
    done = cli("bench", a, b, *FAST, "--report", report)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith(
        f"onnx-norm bench: error: the optimized model ({b}) does not compute what the original model ({a}) does: "
        "output 'y' on the first input sample: max abs "
    )
    # Every one of the 1 x 4 x 16 elements has its sign flipped: all out of fp32's default tolerance.
    assert re.search(r"max abs [0-9.e+-]+, 64/64 elements out of atol=0\.0001 rtol=0\.0001", lines[0])
    assert "--no-parity-check" in lines[0]
    assert "speedup" not in done.stdout and not report.exists()


def test_no_parity_check_times_the_pair_and_the_report_says_it_was_skipped(pair: tuple[Path, Path], tmp_path):
    a, b = pair
    report = tmp_path / "bench.json"
    done = cli("bench", a, b, *FAST, "--no-parity-check", "--report", report)
    assert done.returncode == 0, done.stderr
    assert "parity check skipped: --no-parity-check" in done.stdout and "speedup" in done.stdout
    data = json.loads(report.read_text())
    assert data["parity_check"] == {"outputs": [], "skipped": "--no-parity-check (parity_check=False)", "passed": None}
    assert data["points"][0]["latency"]["optimized"]["runs"] == 1


def test_atol_and_rtol_set_the_checks_tolerance(pair: tuple[Path, Path], tmp_path):
    a, b = pair
    report = tmp_path / "bench.json"
    done = cli("bench", a, b, *FAST, "--atol", "100", "--report", report)
    assert done.returncode == 0, done.stderr
    (output,) = json.loads(report.read_text())["parity_check"]["outputs"]
    assert (output["name"], output["passed"], output["by"], output["atol"]) == ("y", True, "tolerance", 100.0)
    refused = cli("bench", a, b, *FAST, "--atol", "100", "--no-parity-check")
    assert refused.returncode == 2
    assert "--atol/--rtol (atol, rtol) are the parity check's tolerances" in refused.stderr
    assert (
        cli("bench", a, b, *FAST, "--atol", "z:1")
        .stderr.strip()
        .endswith("atol names 'z', which is not an output of the model (outputs: y)")
    )
    bad = cli("bench", a, b, "--rtol", "-1")
    assert (bad.returncode, bad.stderr) == (2, "onnx-norm bench: error: rtol -1.0 must be a finite value >= 0\n")


def test_an_original_and_its_optimized_model_pass_the_check_and_are_measured(tmp_path: Path):
    original, _ = _ln_models()
    a, optimized = tmp_path / "a.onnx", tmp_path / "a.opt.onnx"
    onnx.save(original, a)
    assert cli("optimize", a, "-o", optimized).returncode == 0
    report = tmp_path / "bench.json"
    done = cli("bench", a, optimized, *FAST, "--report", report)
    assert done.returncode == 0, done.stderr
    assert "parity check on the first input sample: y within atol=0.0001 rtol=0.0001" in done.stdout
    data = json.loads(report.read_text())
    assert data["parity_check"]["passed"] is True
    (output,) = data["parity_check"]["outputs"]
    assert output["by"] == "tolerance" and output["mismatched"] == 0 and output["total"] == 4 * HIDDEN
    assert output["max_abs"] <= 1e-4 and data["points"][0]["latency"]["optimized"]["runs"] == 1


def test_the_api_refuses_an_interface_mismatch_with_the_clis_line(tmp_path: Path):
    original, optimized = _ln_models()
    optimized.graph.output[0].name = "z"
    optimized.graph.node[-1].output[0] = "z"
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(original, a)
    onnx.save(optimized, b)
    with pytest.raises(InputError) as refused:
        bench.bench(str(a), str(b), **FAST_API)
    message = str(refused.value)
    assert message == (
        "a.onnx and b.onnx are not the same model: different outputs: the original's 'y' (fp32, rank 3) missing "
        "from the optimized model; the optimized model's 'z' (fp32, rank 3) not in the original"
    )
    done = cli("bench", str(a), str(b), *FAST)
    assert (done.returncode, done.stderr) == (2, f"onnx-norm bench: error: {message}\n")
    # In memory the models are named by their roles; a parity check does not run on such a pair either.
    with pytest.raises(InputError, match=r"^the original model and the optimized model are not the same model: "):
        bench.bench(original, optimized, parity_check=False, **FAST_API)


def test_the_api_refuses_a_different_computation_unless_told_not_to_check(monkeypatch):
    original, _ = _ln_models()
    other = _other_weights(original)
    with pytest.raises(InputError, match=r"^the optimized model does not compute what the original model does: "):
        bench.bench(original, other, **FAST_API)
    made = []
    real = bench.create_session

    def counting(*args, **kwargs):
        made.append(kwargs.get("label"))
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "create_session", counting)
    unchecked = bench.bench(original, other, parity_check=False, **FAST_API)
    assert unchecked.parity_check.passed is None and unchecked.points[0].latency
    without = len(made)
    checked = bench.bench(original, _ln_models()[1], **FAST_API)
    assert checked.parity_check.passed is True
    assert len(made) == 2 * without  # the check ran on the sessions the bench times: none of its own


def _underflowing_pair() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """An original that loses its values to fp16 underflow (x * 1e-9 cast to fp16 is 0 for |x| < 29: a norm's x^2 in
    fp16 does this to small activations) and a model computing the same in fp32, exact where the original is not."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence", HIDDEN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "sequence", HIDDEN])
    scales = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("down", 1e-9), ("up", 1e9))]
    half = [
        helper.make_node("Mul", ["x", "down"], ["small"]),
        helper.make_node("Cast", ["small"], ["small16"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["small16"], ["back"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["back", "up"], ["y"]),
    ]
    full = [helper.make_node("Mul", ["x", "down"], ["small"]), helper.make_node("Mul", ["small", "up"], ["y"])]
    opset = [helper.make_opsetid("", 17)]
    return tuple(
        helper.make_model(helper.make_graph(nodes, "g", [x], [y], scales), opset_imports=opset, ir_version=10)
        for nodes in (half, full)
    )


def test_an_optimized_model_more_exact_than_its_original_is_not_refused():
    """Both cheap tests fail (the original is all zeros), the float64 result says the original is the wrong one."""
    original, exact = _underflowing_pair()
    report = bench.bench(original, exact, include_unoptimized=False, **FAST_API)
    (output,) = report.parity_check.outputs
    assert output.passed and output.by == "float64"
    assert output.mismatched == output.total == 4 * HIDDEN and output.relative_rms == np.inf
    assert "the original's" in output.verdict and "within the original's own error" in output.verdict
    with pytest.raises(InputError, match="beyond the original's own error"):  # and the other way round, refused
        bench.bench(exact, original, include_unoptimized=False, **FAST_API)


def _check(optimized: dict, original: dict, exact: dict | None = None, **tolerances) -> list[bench_check.OutputCheck]:
    spec = bench_check.tolerances(ParityCheckOptions(True, tolerances.get("atol"), tolerances.get("rtol")))
    provider = None if exact is None else (lambda: (exact, ""))
    return bench_check.check_outputs(optimized, original, spec, provider)


def test_rounding_noise_passes_the_looser_test_and_a_different_output_does_not():
    rng = np.random.default_rng(0)
    expected = rng.standard_normal((8, 64)).astype(np.float32)
    noisy = expected.astype(np.float16).astype(np.float32)  # fp16 rounding, beyond fp32's 1e-4 tolerance
    (check,) = _check({"y": noisy}, {"y": expected})
    assert check.passed and check.by == "looser" and check.mismatched > 0 and check.relative_rms < 1e-3
    (strict,) = _check({"y": noisy}, {"y": expected}, atol=1e-6)  # a tolerance given decides alone
    assert not strict.passed and strict.verdict == "differs from the original"
    (scaled,) = _check({"y": 2 * expected}, {"y": expected})  # the cosine similarity would call this the same
    assert not scaled.passed and scaled.cosine == pytest.approx(1.0) and scaled.relative_rms == pytest.approx(1.0)
    summary = bench_check.ParityCheck([check]).summary
    assert summary.startswith("parity check on the first input sample: y within the looser normwise test (relative")
    assert "relative RMS difference 1 (> 0.05 allowed)" in scaled.verdict


def test_nan_inf_only_in_the_original_is_left_out_and_only_in_the_optimized_model_fails():
    expected = np.linspace(-1, 1, 32, dtype=np.float32)
    overflowed = expected.copy()
    overflowed[:4] = np.inf
    (check,) = _check({"y": expected}, {"y": overflowed})
    assert check.passed and check.by == "looser" and "4 NaN/Inf of the original left out" in check.verdict
    (broken,) = _check({"y": overflowed}, {"y": expected})
    assert not broken.passed and broken.verdict == "4 NaN/Inf where the original is finite"
    (both,) = _check({"y": np.full(4, np.nan, np.float32)}, {"y": np.full(4, np.nan, np.float32)})
    assert both.passed and both.by == "nothing to compare"


def test_integer_outputs_may_differ_in_one_percent_of_their_elements():
    tokens = np.arange(1000, dtype=np.int64)
    flipped = tokens.copy()
    flipped[:10] += 1
    (near_tie,) = _check({"ids": flipped}, {"ids": tokens})
    assert near_tie.passed and near_tie.by == "looser"
    flipped[:11] += 1
    (other,) = _check({"ids": flipped}, {"ids": tokens})
    assert not other.passed and other.verdict == "1.1% of the elements differ (> 1% allowed)"


def test_the_float64_result_decides_only_what_the_cheap_tests_could_not():
    exact = np.linspace(0.5, 1.5, 64)
    original = np.zeros(64, np.float32)  # lost to underflow
    called = []

    def provider():
        called.append(True)
        return {"y": exact}, ""

    spec = bench_check.tolerances(ParityCheckOptions())
    (check,) = bench_check.check_outputs({"y": exact.astype(np.float32)}, {"y": original}, spec, provider)
    assert check.passed and check.by == "float64" and called == [True]
    (other,) = bench_check.check_outputs({"y": -exact.astype(np.float32)}, {"y": original}, spec, provider)
    assert not other.passed and "beyond the original's own error" in other.verdict
    called.clear()
    bench_check.check_outputs({"y": original + 1e-6}, {"y": original}, spec, provider)
    assert called == []  # passed by the tolerance: no float64 evaluation
    (unknown,) = bench_check.check_outputs({"y": -exact}, {"y": exact}, spec, lambda: (None, "it does not fit"))
    assert not unknown.passed and unknown.verdict.endswith("; no float64 result: it does not fit")


def test_a_large_output_is_compared_on_a_strided_subset(monkeypatch):
    monkeypatch.setattr(bench_check, "CHECKED_ELEMENTS", 100)
    expected = np.arange(1000, dtype=np.float32)
    (check,) = _check({"y": expected.copy()}, {"y": expected})
    assert check.passed and check.total == 100
    # The float64 result (of the full size) is strided alike: the same elements are compared.
    (exact,) = _check({"y": expected.copy()}, {"y": np.zeros(1000, np.float32)}, {"y": expected.astype(np.float64)})
    assert exact.passed and exact.by == "float64" and exact.total == 100


def test_the_check_reads_the_outputs_a_cuda_graph_runner_bound():
    """A graph runner's outputs are its preallocated OrtValues (here on the CPU, as a CUDA graph needs a GPU)."""
    original, _ = _ln_models()
    session = sessions.create_session(original, sessions.RuntimeConfig())
    feeds = {"x": np.ones((1, 2, HIDDEN), np.float32)}
    outputs = sessions.preallocate_outputs(session, feeds, "cpu")
    runner = sessions.Runner(session, feeds, sessions.RuntimeConfig(), outputs=outputs)
    read = bench._outputs_of(runner)
    np.testing.assert_array_equal(read["y"], sessions.run_model(session, feeds)["y"])
    assert set(read) == {"y"} and not np.all(read["y"] == 0)
