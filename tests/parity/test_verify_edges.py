"""The parity gate at its edges: NaN/Inf, bfloat16 models on the CPU, option validation shared by the API and the
CLI, runtime errors that name the model and the guessed dims, and what the console shows (no ORT log lines or
numpy warnings, --take-over-native's decisions, demo's exact bench command)."""

from __future__ import annotations

import math
import shlex
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from model_builders import HIDDEN, bf16_layer_norm, layer_norm_model
from onnx import TensorProto, helper, numpy_helper

import onnx_norm
from onnx_norm import parity
from onnx_norm.cli import build_parser, main
from onnx_norm.inputs import InputError
from onnx_norm.sessions import SessionError


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ln")
    original, optimized = root / "ln.onnx", root / "ln.opt.onnx"
    onnx.save(layer_norm_model(), original)
    onnx.save(onnx_norm.optimize(layer_norm_model())[0], optimized)
    return original, optimized


def _x(rows: int = 4) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((1, rows, HIDDEN)).astype(np.float32)


# ---------------------------------------------------------------------------------------------- NaN and Inf


@pytest.mark.parametrize("special", [np.nan, np.inf], ids=["nan", "inf"])
def test_nonfinite_inputs_are_counted_and_only_the_finite_elements_decide(models, special):
    original, optimized = models
    x = _x()
    x[0, 1, 3] = special  # poisons row 1 of the LayerNorm output in both models
    report = parity.verify(original, optimized, inputs=[{"x": x}])
    (output,) = report.outputs
    assert report.passed
    assert output.metrics.nonfinite_matched == HIDDEN
    assert output.metrics.total == 4 * HIDDEN
    assert f"{HIDDEN}/{4 * HIDDEN} NaN/Inf in both at the same places" in output.message
    assert report.warnings == ["sample 0: input 'x' holds 1 NaN/Inf value(s)"]
    # The statistics are over the finite elements: a wrong finite value still fails.
    broken = onnx_norm.optimize(layer_norm_model())[0]
    for node in broken.graph.node:
        for attr in node.attribute:
            if attr.name == "epsilon":
                attr.f = 0.5
    assert not parity.verify(original, broken, inputs=[{"x": x}]).passed


def test_an_output_that_is_entirely_nonfinite_fails_unless_allowed(models, capsys, tmp_path):
    original, optimized = models
    x = np.full((1, 4, HIDDEN), np.nan, np.float32)
    report = parity.verify(original, optimized, inputs=[{"x": x}])
    (output,) = report.outputs
    assert not report.passed
    assert "every element is NaN/Inf in both models (64/64)" in output.verdict
    assert math.isnan(output.metrics.cosine) and math.isnan(output.metrics.max_abs)  # not "0 and 1.000000"
    assert parity.verify(original, optimized, inputs=[{"x": x}], allow_nonfinite=True).passed
    np.save(tmp_path / "nan.npy", x)
    # The original fails the same check against itself: not the optimized model's failure (exit 2, one line).
    assert main(["verify", str(original), str(optimized), "--inputs", str(tmp_path / "nan.npy")]) == 2
    assert "the original model does not reproduce itself" in capsys.readouterr().err
    flags = ["--inputs", str(tmp_path / "nan.npy"), "--allow-nonfinite"]
    assert main(["verify", str(original), str(optimized), *flags]) == 0


def test_comparing_extreme_values_raises_no_numpy_warning():
    actual = [np.array([1e300, np.inf, np.nan, 3.0, -np.inf, 0.0])]
    expected = [np.array([-1e300, np.inf, 1.0, 3.0, np.inf, 0.0])]
    golden = [np.array([1e300, 1.0, 1.0, 3.0, 1.0, 0.0])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for stat in parity.STATS:
            result = parity.compare("y", actual, expected, parity.Tolerance(1e-3, 1e-3, stat), golden)
            assert not result.passed


# ---------------------------------------------------------------------------------------------- bfloat16


@pytest.mark.parametrize("native", [False, True], ids=["decomposed", "native"])
def test_bf16_models_are_verified_on_the_cpu(tmp_path: Path, capsys, native):
    source, out = tmp_path / "ln16.onnx", tmp_path / "ln16.opt.onnx"
    onnx.save(bf16_layer_norm(native=native), source)
    flags = ["--take-over-native"] if native else []
    code = main(["optimize", str(source), "-o", str(out), "--verify", "--shape", "sequence:8", *flags])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "PASSED | Output: 'y'" in printed
    report = parity.verify(source, out, shapes={"sequence": 8}, samples=2)
    assert report.passed and report.outputs[0].dtype == "bfloat16"
    assert report.outputs[0].tolerance.atol == 5e-2  # the README's bf16 default
    onnx.save(bf16_layer_norm(native=native, gamma_scale=1.5), tmp_path / "wrong.onnx")
    assert not parity.verify(source, tmp_path / "wrong.onnx", shapes={"sequence": 8}).passed


# ---------------------------------------------------------------------------------------------- validation


BAD_OPTIONS = [
    ({"atol": -1.0}, "atol -1.0 must be a finite value >= 0"),
    ({"rtol": {"y": float("nan")}}, "rtol y:nan must be a finite value >= 0"),
    ({"atol": {"typo": 1e-3}}, "atol names 'typo', which is not an output of the model (outputs: y)"),
    ({"check_error_stat": "median"}, "check_error_stat 'median' is not a statistic"),
    ({"golden": "bogus"}, "golden 'bogus' is not one of auto, ort, reference, none"),
    ({"samples": 0}, "samples must be an integer >= 1, got 0"),
    ({"error_quantile": 2.0}, "error_quantile must be in [0, 1], got 2.0"),
    ({"provider": "tpu"}, "provider 'tpu' is not one of cpu, cuda"),
    ({"shapes": {"sequence": -8}}, "dims must not be negative"),
    ({"shapes": {"sequence": "8"}}, "expected an int or a sequence of ints"),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS, ids=[m.split()[0] for _, m in BAD_OPTIONS])
def test_the_api_validates_every_option(models, options, message):
    with pytest.raises(InputError) as raised:
        parity.verify(*models, **options)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("flags", "options"),
    [
        (["--atol", "-1"], {"atol": -1.0}),
        (["--atol", "typo:1e-3"], {"atol": {"typo": 1e-3}}),
        (["--rtol", "y:nan"], {"rtol": {"y": float("nan")}}),
        (["--check-error-stat", "median"], {"check_error_stat": "median"}),
        (["--samples", "0"], {"samples": 0}),
    ],
)
def test_the_cli_and_the_api_reject_the_same_values_with_the_same_message(models, capsys, flags, options):
    with pytest.raises(InputError) as raised:
        parity.verify(*models, **options)
    assert main(["verify", *map(str, models), *flags]) == 2
    assert capsys.readouterr().err == f"onnx-norm verify: error: {raised.value}\n"


def test_a_symbolic_dim_is_given_as_an_int_or_a_list(models):
    as_int = parity.verify(*models, shapes={"sequence": 8})
    as_list = parity.verify(*models, shapes={"sequence": [8]})
    assert as_int.shapes == as_list.shapes == {"x": [1, 8, HIDDEN]}
    assert as_int.outputs[0].metrics.max_abs == as_list.outputs[0].metrics.max_abs


# ---------------------------------------------------------------------------------------------- runtime errors


def _reshape_model(path: Path) -> None:
    """Runs only when sequence is 4 (a constant Reshape): the default guess of 128 fails in ONNX Runtime."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, HIDDEN])],
        [numpy_helper.from_array(np.array([1, 4, HIDDEN], np.int64), "shape")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def test_a_guessed_dim_that_fails_names_the_model_and_suggests_shape(tmp_path: Path, capfd):
    path = tmp_path / "fixed.onnx"
    _reshape_model(path)
    with pytest.raises(SessionError) as raised:
        parity.verify(path, path)
    message = str(raised.value)
    assert f"failed to run the original model ({path}) on inputs x [1, 128, {HIDDEN}]" in message
    assert "guessed dims: sequence=128; give the model's real sizes with --shape NAME:VALUE" in message
    for command in (["verify", str(path), str(path)], ["bench", str(path), "--repeat", "1", "--warmup", "0"]):
        assert main(command) == 2
        err = capfd.readouterr().err  # file descriptors: ONNX Runtime logs there, in colour
        assert len(err.splitlines()) == 1, err
        assert "--shape NAME:VALUE" in err and "\x1b[" not in err
    assert main(["verify", str(path), str(path), "--shape", "sequence:4"]) == 0


# ---------------------------------------------------------------------------------------------- console


def test_take_over_native_shows_what_it_converted_and_why_it_left_the_rest(tmp_path: Path, capsys):
    source = tmp_path / "native.onnx"
    onnx.save(bf16_layer_norm(native=True), source)
    assert main(["optimize", str(source), "-o", str(tmp_path / "a.onnx"), "--take-over-native"]) == 0
    out = capsys.readouterr().out
    assert "--take-over-native: 1 of 1 native norm(s) converted" in out
    assert "ai.onnx::LayerNormalization" in out and "onnx_norm::LayerNorm" in out
    target = ["--take-over-native", "--target", "onnx"]
    assert main(["optimize", str(source), "-o", str(tmp_path / "b.onnx"), *target]) == 0
    out = capsys.readouterr().out
    assert "--take-over-native: 0 of 1 native norm(s) converted" in out
    assert "already an op of the" in out


def test_demo_echoes_the_exact_bench_command_it_runs(tmp_path: Path, capsys, monkeypatch):
    import onnx_norm.cli.bench as bench_cli

    ran: list = []
    real = bench_cli.bench_and_print

    def recording(original, optimized, options, console, *, title):
        ran.append(options)
        return real(original, optimized, options, console, title=title)

    monkeypatch.setattr(bench_cli, "bench_and_print", recording)
    argv = ["demo", "--model", "llama-rmsnorm-fp32", "--warmup", "0", "--repeat", "1", "--sessions", "1"]
    assert main([*argv, "--threads", "1", "--shape", "sequence:8", "--out", str(tmp_path)]) == 0
    echoed = [line[2:] for line in capsys.readouterr().out.splitlines() if line.startswith("$ onnx-norm bench ")]
    assert len(echoed) == 1 == len(ran)
    parsed = build_parser().parse_args(shlex.split(echoed[0])[1:])
    assert bench_cli.bench_options(parsed) == ran[0]
    assert ran[0].runtime.threads == 1


def test_a_golden_evaluation_that_fails_at_run_time_leaves_the_models_compared_with_each_other(models, monkeypatch):
    real = parity.golden.run_model

    def golden_fails(session, feeds, names=None, *, label="the model"):
        if label == "the float64 copy":
            raise SessionError("ONNX Runtime failed to run the float64 copy: out of memory")
        return real(session, feeds, names, label=label)

    monkeypatch.setattr(parity.golden, "run_model", golden_fails)
    report = parity.verify(*models, shapes={"sequence": 8})
    assert report.passed and report.golden == "none"
    assert "the float64 golden evaluation failed; compared with the original only" in report.warnings
