"""The parity gate's verdict table (onnx_norm/parity/verdict.py), row by row, the reverse pairs included, and the
tolerance of an output chosen by the narrowest float type on its path (onnx_norm/parity/precision.py); then the
same cases through the CLI, as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import cli
from model_builders import HIDDEN, layer_norm_model
from onnx import TensorProto, helper, numpy_helper

import onnx_norm
from onnx_norm import parity
from onnx_norm.parity import precision

RNG = np.random.default_rng(7)
EXACT = RNG.standard_normal((4, 8))
TOL = parity.Tolerance(1e-4, 1e-4)
ALLOW = parity.Tolerance(1e-4, 1e-4, allow_nonfinite=True)


def _compare(actual, expected, golden=None, tolerance=TOL, **kwargs) -> parity.Comparison:
    return parity.compare("y", [np.asarray(actual)], [np.asarray(expected)], tolerance, golden, **kwargs)


def _nan_rows(values: np.ndarray, rows: list[int]) -> np.ndarray:
    out = values.copy()
    out[rows] = np.nan
    return out


# ------------------------------------------------------------------------------------------- the rows, in order


def test_layout_row_fails_on_shape_or_type():
    f32 = EXACT.astype(np.float32)
    assert _compare(f32.T.copy(), f32).row == "layout"
    result = _compare(f32.astype(np.float16), f32)
    assert (result.row, result.passed) == ("layout", False)


def test_all_nonfinite_row_fails_unless_allowed():
    nan = np.full((2, 3), np.nan, np.float32)
    assert (_compare(nan, nan).row, _compare(nan, nan).passed) == ("all-nonfinite", False)
    assert _compare(nan, nan, tolerance=ALLOW).passed


def test_less_accurate_row_fails_even_within_tolerance_of_the_original():
    original = EXACT.astype(np.float32)
    optimized = (EXACT + 3e-5).astype(np.float32)  # within atol of the original, 3e-5 farther from exact
    result = _compare(optimized, original, [EXACT])
    assert (result.row, result.passed) == ("less-accurate", False)
    # The reverse pair: the more exact one passes.
    assert _compare(original, optimized, [EXACT]).passed


@pytest.mark.parametrize("golden_nan", [True, False], ids=["exact-nan", "no-exact"])
def test_a_finite_model_where_the_original_is_nan_fails(golden_nan: bool):
    """A LayerNorm with epsilon 0 on constant rows: the original and the exact result are NaN there; a model that
    is finite there differs, however close its other values (the issue's false pass)."""
    original = _nan_rows(EXACT, [1]).astype(np.float32)
    optimized = EXACT.astype(np.float32)
    golden = [_nan_rows(EXACT, [1])] if golden_nan else None
    result = _compare(optimized, original, golden)
    assert (result.row, result.passed) == ("nonfinite-pattern", False)
    assert "NaN" in result.verdict and "sample 0 row [1]" in result.verdict
    assert result.metrics.nonfinite_mismatched == 8 and result.metrics.nonfinite_repaired == 0
    # The reverse pair: NaN where the original is finite.
    reverse = _compare(original, optimized, [EXACT] if golden_nan else None)
    assert not reverse.passed and "NaN" in reverse.message


def test_a_differing_pattern_passes_when_allowed_and_names_the_rows():
    original = _nan_rows(EXACT, [0, 2]).astype(np.float32)
    result = _compare(EXACT.astype(np.float32), original, [_nan_rows(EXACT, [0, 2])], tolerance=ALLOW)
    assert result.passed and result.row == "tolerance"
    assert "allowed" in result.verdict and "sample 0 row [0], sample 0 row [2]" in result.verdict
    assert [r["row"] for r in result.metrics.nonfinite_rows] == [[0], [2]]


def test_finite_where_the_original_overflowed_and_the_exact_result_is_finite_is_a_repair():
    original = EXACT.astype(np.float32)
    original[3, 5] = np.inf  # an fp16 sum of squares that overflowed
    optimized = EXACT.astype(np.float32)
    result = _compare(optimized, original, [EXACT])
    assert result.passed and result.metrics.nonfinite_repaired == 1 and result.metrics.nonfinite_mismatched == 0
    assert "repaired" in result.message and "original 1 Inf" in result.message
    # Finite but wrong is no repair.
    wrong = optimized.copy()
    wrong[3, 5] += 1.0
    assert _compare(wrong, original, [EXACT]).row == "nonfinite-pattern"


def test_tolerance_envelope_and_differs_rows():
    original = EXACT.astype(np.float32)
    assert _compare(original.copy(), original, [EXACT]).row == "tolerance"
    # 1e-3 from the original, but the original is itself 2e-3 from exact and the optimized value lies between.
    original_off = (EXACT + 2e-3).astype(np.float32)
    closer = (EXACT + 1e-3).astype(np.float32)
    result = _compare(closer, original_off, [EXACT])
    assert (result.row, result.passed, result.verdict) == (
        "envelope",
        True,
        "closer to the exact result than the original",
    )
    # The reverse pair is farther from exact than its original beyond the margin.
    assert _compare(original_off, closer, [EXACT]).row == "less-accurate"
    # Without the float64 result the same pair cannot be excused.
    assert (_compare(closer, original_off).row, _compare(closer, original_off).passed) == ("differs", False)


#: One case per row of the table, the row it must land on, and whether it passes.
ROW_CASES = {
    "layout": lambda: (EXACT.astype(np.float32).T.copy(), EXACT.astype(np.float32)),
    "all-nonfinite": lambda: (np.full(3, np.nan), np.full(3, np.nan)),
    "less-accurate": lambda: ((EXACT + 3e-5).astype(np.float32), EXACT.astype(np.float32), [EXACT]),
    "nonfinite-pattern": lambda: (EXACT, _nan_rows(EXACT, [1]), [_nan_rows(EXACT, [1])]),
    "tolerance": lambda: (EXACT, EXACT.copy(), [EXACT]),
    "envelope": lambda: (EXACT + 1e-3, EXACT + 2e-3, [EXACT]),
    "differs": lambda: (EXACT + 1e-3, EXACT),
}


def test_the_cases_cover_every_row_of_the_table():
    assert tuple(ROW_CASES) == parity.ROW_KEYS


@pytest.mark.parametrize("row", list(ROW_CASES))
def test_each_row_decides_its_case(row: str):
    result = _compare(*ROW_CASES[row]())
    assert result.row == row
    table = {r.key: r for r in parity.VERDICT_TABLE}
    assert result.passed is (table[row].passes == "yes"), result.verdict


# ---------------------------------------------------------------------------- the type an output is computed in


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name: str, elem: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, [2, 4])


def test_the_narrowest_type_on_each_outputs_path():
    half = numpy_helper.from_array(np.ones(4, np.float16), "w16")
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
        helper.make_node("Mul", ["x16", "w16"], ["m16"]),
        helper.make_node("Cast", ["m16"], ["y_half"], to=TensorProto.FLOAT),
        # A float16 weight widened at once: computed in float32.
        helper.make_node("Cast", ["w16"], ["w32"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "w32"], ["y_full"]),
    ]
    outs = [_vi("y_half", TensorProto.FLOAT), _vi("y_full", TensorProto.FLOAT)]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT)], outs, [half])
    paths = precision.narrowest_on_path(model, ["y_half", "y_full"])
    assert paths == {"y_half": np.dtype(np.float16), "y_full": np.dtype(np.float32)}
    assert precision.narrower(paths["y_half"], np.dtype(np.float32)) == np.dtype(np.float16)
    assert precision.narrower(paths["y_full"], np.dtype(np.float32)) is None


def test_a_subgraph_on_the_path_counts_with_the_outer_values_it_reads():
    branch = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["b16"], to=TensorProto.BFLOAT16),
            helper.make_node("Cast", ["b16"], ["out"], to=TensorProto.FLOAT),
        ],
        "then",
        [],
        [_vi("out", TensorProto.FLOAT)],
    )
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["out2"])], "else", [], [_vi("out2", 1)])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True))),
        helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other),
    ]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT)], [_vi("y", TensorProto.FLOAT)])
    assert precision.narrowest_on_path(model, ["y"])["y"] == np.dtype("bfloat16")


def test_a_float32_output_computed_in_float16_is_judged_by_float16():
    """The Mamba2 false alarm: closer to float64 than the original, yet 1e-3 from it at a float32 output."""
    exact = RNG.standard_normal((64, 64)) * 4
    original = exact.astype(np.float16).astype(np.float32)  # rounded in float16 once...
    optimized = (exact + 5e-4 * np.sign(exact)).astype(np.float16).astype(np.float32)  # ...and another way
    as_fp32 = _compare(optimized, original, [exact])
    assert not as_fp32.passed
    spec = parity.ToleranceSpec()
    tolerance = spec.for_output("y", np.dtype(np.float32), np.dtype(np.float16))
    assert (tolerance.atol, tolerance.rtol) == parity.DEFAULT_TOLERANCES["float16"]
    as_fp16 = _compare(optimized, original, [exact], tolerance, compute_dtype=np.dtype(np.float16))
    assert as_fp16.passed and as_fp16.computed_in == "float16"
    assert "judged as float16" in as_fp16.message


# ------------------------------------------------------------------------------------------------- the CLI


def _zero_eps(model: onnx.ModelProto) -> onnx.ModelProto:
    for init in model.graph.initializer:
        if init.name == "eps":
            init.CopyFrom(numpy_helper.from_array(np.array(0.0, np.float32), "eps"))
    return model


def _finite_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with its NaN outputs replaced by 0: identical wherever the original is finite."""
    graph = model.graph
    graph.node[-1].output[0] = "y_raw"
    graph.initializer.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero"))
    graph.node.extend(
        [
            helper.make_node("IsNaN", ["y_raw"], ["is_nan"], name="is_nan"),
            helper.make_node("Where", ["is_nan", "zero", "y_raw"], ["y"], name="where"),
        ]
    )
    return model


@pytest.fixture(scope="module")
def eps_models(tmp_path_factory) -> dict[str, Path]:
    """The epsilon-0 LayerNorm (NaN on constant rows), its finite twin, and constant-row inputs."""
    root = tmp_path_factory.mktemp("eps")
    files = {"nan": root / "eps0.onnx", "finite": root / "eps.onnx", "inputs": root / "rows.npz"}
    onnx.save(_zero_eps(layer_norm_model()), files["nan"])
    onnx.save(_finite_twin(_zero_eps(layer_norm_model())), files["finite"])
    x = np.random.default_rng(3).standard_normal((1, 8, HIDDEN)).astype(np.float32)
    x[0, [2, 5]] = 0.5  # constant rows: variance 0, and 0/0 with epsilon 0
    np.savez(files["inputs"], x=x)
    return files


def test_cli_a_model_finite_where_the_original_is_nan_fails(eps_models, tmp_path):
    report = tmp_path / "report.json"
    run = cli("verify", eps_models["nan"], eps_models["finite"], "--inputs", eps_models["inputs"], "--report", report)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "NaN" in run.stdout and "FAILED" in run.stdout
    output = json.loads(report.read_text())["outputs"][0]
    assert output["row"] == "nonfinite-pattern" and not output["passed"]
    # The reverse pair fails too.
    reverse = cli("verify", eps_models["finite"], eps_models["nan"], "--inputs", eps_models["inputs"])
    assert reverse.returncode == 1 and "NaN" in reverse.stdout


def test_cli_allow_nonfinite_accepts_it_and_names_the_rows(eps_models):
    flags = ["--inputs", eps_models["inputs"], "--allow-nonfinite"]
    run = cli("verify", eps_models["nan"], eps_models["finite"], *flags)
    assert run.returncode == 0, run.stdout + run.stderr
    text = " ".join(run.stdout.split())
    assert "allowed" in text and "sample 0 row [0, 2]" in text and "row [0, 5]" in text


def test_cli_the_nan_model_optimized_passes_with_its_nan_rows(eps_models, tmp_path):
    """The rewrite keeps epsilon 0, so the optimized model is NaN on the same rows: a pass, and the text says NaN."""
    optimized = tmp_path / "eps0.opt.onnx"
    assert cli("optimize", eps_models["nan"], "-o", optimized).returncode == 0
    run = cli("verify", eps_models["nan"], optimized, "--inputs", eps_models["inputs"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "NaN/Inf in both at the same places" in " ".join(run.stdout.split())


def _fp16_norm_fp32_output() -> onnx.ModelProto:
    """An fp16 LayerNorm chain (as an fp16 export writes it) ahead of a Cast to a float32 output."""
    model = layer_norm_model()
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    graph = model.graph
    graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    graph.node[-1].output[0] = "y16"
    graph.node.append(helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT, name="to_fp32"))
    return model


def test_cli_an_fp16_model_with_an_fp32_output_is_judged_as_fp16(tmp_path):
    original, optimized, report = tmp_path / "m.onnx", tmp_path / "m.opt.onnx", tmp_path / "r.json"
    onnx.save(_fp16_norm_fp32_output(), original)
    onnx.save(onnx_norm.optimize(_fp16_norm_fp32_output())[0], optimized)
    run = cli("verify", original, optimized, "--shape", "sequence:64", "--report", report)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "judged as float16" in " ".join(run.stdout.split())
    output = json.loads(report.read_text())["outputs"][0]
    assert output["computed_in"] == "float16"
    assert (output["tolerance"]["atol"], output["tolerance"]["rtol"]) == parity.DEFAULT_TOLERANCES["float16"]
    # Without the float64 result only the tolerance can pass it: float32's (1e-4) failed this model, as it failed
    # the Mamba2 export whose fp16 output was cast to fp32.
    alone = cli("verify", original, optimized, "--shape", "sequence:64", "--golden", "none")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    explicit = cli(
        "verify", original, optimized, "--shape", "sequence:64", "--golden", "none", "--atol", "1e-4", "--rtol", "1e-4"
    )
    assert explicit.returncode == 1 and "atol=0.0001" in explicit.stdout  # a value given is the value used
