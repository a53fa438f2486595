"""Inputs that reach a model's real path (onnx_norm.inputs, onnx_norm.input_values): dims read as ONNX Runtime
reads them (`-1` free, 0 fixed), values the graph compares its inputs with or branches on, and `--input NAME=VALUE`.

The CLI stories run `onnx-norm` as a subprocess, as a user types it; the table of bad `--input` values runs `main`
in this process (one process start each would prove nothing more). Models are a few nodes, `--samples 1`.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import cli
from onnx import TensorProto, helper, numpy_helper

from onnx_norm import inputs, parity
from onnx_norm.cli import main
from onnx_norm.errors import InputError
from onnx_norm.input_values import graph_rules, normalize_values, parse_values
from onnx_norm.options import InputOptions
from onnx_norm.sessions import SessionError

WIDTH = 16
OPSET = [helper.make_opsetid("", 17)]


def _model(nodes, graph_inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", graph_inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=OPSET, ir_version=10)


def _layer_norm(x: str, y: str) -> list[onnx.NodeProto]:
    """A decomposed LayerNorm over the last axis, without affine (constants `p2`, `eps`)."""
    return [
        helper.make_node("ReduceMean", [x], ["mean"], axes=[-1]),
        helper.make_node("Sub", [x, "mean"], ["centred"]),
        helper.make_node("Pow", ["centred", "p2"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Div", ["centred", "std"], [y]),
    ]


def _norm_constants() -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.float32(2.0), "p2"), numpy_helper.from_array(np.float32(1e-5), "eps")]


def conv_model(first_dim: int) -> onnx.ModelProto:
    """An OCR classifier's head: x float[FIRST, 3, ?, 16] (FIRST -1 as the real one stores its batch, or 0), a
    Conv, then a decomposed LayerNorm over the last axis."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]), *_layer_norm("conv", "y")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [first_dim, 3, "", WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [first_dim, 4, None, WIDTH])
    return _model(nodes, [x], [y], [weight, *_norm_constants()])


def vad_model() -> onnx.ModelProto:
    """Silero-VAD-like: a scalar int64 `sr`; `If(sr == 8000 or sr == 16000)` takes the real path (x * 2, then a
    decomposed LayerNorm); the else-branch reshapes x to [7, -1], which fails at run time for every length but
    multiples of 7 (the default 128 included)."""
    then_branch = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["doubled"])],
        "then",
        [],
        [helper.make_tensor_value_info("doubled", TensorProto.FLOAT, [1, "length"])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Reshape", ["x", "bad_shape"], ["reshaped"])],
        "else",
        [],
        [helper.make_tensor_value_info("reshaped", TensorProto.FLOAT, [1, "length"])],
    )
    nodes = [
        helper.make_node("Equal", ["sr", "rate_8k"], ["is_8k"]),
        helper.make_node("Equal", ["sr", "rate_16k"], ["is_16k"]),
        helper.make_node("Or", ["is_8k", "is_16k"], ["known_rate"]),
        helper.make_node("If", ["known_rate"], ["h"], then_branch=then_branch, else_branch=else_branch),
        *_layer_norm("h", "y"),
    ]
    constants = [
        numpy_helper.from_array(np.array(8000, np.int64), "rate_8k"),
        numpy_helper.from_array(np.array(16000, np.int64), "rate_16k"),
        numpy_helper.from_array(np.float32(2.0), "two"),
        numpy_helper.from_array(np.array([7, -1], np.int64), "bad_shape"),
        *_norm_constants(),
    ]
    graph_inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "length"]),
        helper.make_tensor_value_info("sr", TensorProto.INT64, []),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "length"])]
    return _model(nodes, graph_inputs, outputs, constants)


def reshape_by_input_model() -> onnx.ModelProto:
    """x float[1, 16] reshaped to [k]: a scalar int64 `k` that feeds no Gather and no comparison; only k=16 runs."""
    nodes = [
        helper.make_node("Unsqueeze", ["k", "axis0"], ["new_shape"]),
        helper.make_node("Reshape", ["x", "new_shape"], ["y"]),
    ]
    graph_inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH]),
        helper.make_tensor_value_info("k", TensorProto.INT64, []),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [WIDTH])]
    return _model(nodes, graph_inputs, outputs, [numpy_helper.from_array(np.array([0], np.int64), "axis0")])


def _one_line_error(result: subprocess.CompletedProcess, *, warnings: int = 0) -> str:
    """The error line of an exit 2, after `warnings` warning lines (and no traceback)."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == warnings + 1 and all(line.startswith("WARNING") for line in lines[:-1]), result.stderr
    return lines[-1]


# ---------------------------------------------------------------------------------------- dims as ORT reads them


def test_negative_dims_are_free_and_zero_dims_are_fixed_as_onnx_runtime_reads_them():
    assert inputs.input_specs(conv_model(-1))[0].shape == (None, 3, None, WIDTH)
    assert inputs.input_specs(conv_model(0))[0].shape == (0, 3, None, WIDTH)
    (sample,) = inputs.generate(conv_model(-1))
    assert sample["x"].shape == (inputs.DEFAULT_BATCH, 3, inputs.DEFAULT_DIM, WIDTH)
    (sample,) = inputs.generate(conv_model(-1), shapes={"x": (2, 3, 8, WIDTH)})
    assert sample["x"].shape == (2, 3, 8, WIDTH)
    assert inputs.guessed_dims(conv_model(-1)) == {"x[0]": 1, "x[2]": inputs.DEFAULT_DIM}
    # Data given for such a dim may have any size there; a fixed dim still must match.
    specs = inputs.input_specs(conv_model(-1))
    inputs.validate(specs, {"x": np.zeros((5, 3, 2, WIDTH), np.float32)})
    with pytest.raises(InputError, match="dim 3 must be 16"):
        inputs.validate(specs, {"x": np.zeros((5, 3, 2, 8), np.float32)})
    with pytest.raises(InputError, match=r"fixed to 0 in the model.*only with an empty input"):
        inputs.generate(conv_model(0), shapes={"x": (1, 3, 8, WIDTH)})


def test_dim_params_that_name_nothing_are_unnamed():
    """Paddle declares every unknown dim `?` (`x: float[-1,3,?,?]`): two of them are not one symbol."""
    model = conv_model(-1)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param = "?"
    dims[3].dim_param = "?"
    assert inputs.input_specs(model)[0].shape == (None, 3, None, None)
    (sample,) = inputs.generate(model, shapes={"x": (1, 3, 8, WIDTH)})
    assert sample["x"].shape == (1, 3, 8, WIDTH)
    inputs.validate(inputs.input_specs(model), {"x": np.zeros((1, 3, 8, 4), np.float32)})


def test_a_batch_dim_stored_as_minus_one_verifies_and_benches_with_and_without_shape(tmp_path: Path):
    model = tmp_path / "cls.onnx"
    onnx.save(conv_model(-1), model)
    assert cli("verify", model, model, "--samples", "1").returncode == 0
    report = tmp_path / "parity.json"
    done = cli("verify", model, model, "--samples", "1", "--shape", "x:1,3,8,16", "--report", report)
    assert done.returncode == 0, done.stderr
    assert json.loads(report.read_text())["shapes"] == {"x": [1, 3, 8, WIDTH]}
    bench_report = tmp_path / "bench.json"
    flags = ["--warmup", "0", "--repeat", "1", "--sessions", "1", "--shape", "x:2,3,8,16", "--report", bench_report]
    done = cli("bench", model, *flags)
    assert done.returncode == 0, done.stderr
    assert json.loads(bench_report.read_text())["points"][0]["shapes"] == {"x": [2, 3, 8, WIDTH]}


def test_a_dim_fixed_to_zero_runs_empty_with_a_warning_and_refuses_another_size(tmp_path: Path):
    """ONNX Runtime accepts only 0 at such a dim, so verify runs the model as ORT does and says nothing was
    compared; asking for another size is one line naming the dim."""
    model = tmp_path / "zero.onnx"
    onnx.save(conv_model(0), model)
    done = cli("verify", model, model, "--samples", "1")
    assert done.returncode == 0, done.stderr
    assert "'y' [0, 4, 128, 16] hold no values on these inputs: nothing of them was compared" in done.stdout
    error = _one_line_error(cli("verify", model, model, "--samples", "1", "--shape", "x:1,3,8,16"))
    assert "dim 0 is fixed to 0 in the model, got 1" in error


def test_a_scalar_input_is_fed_as_a_scalar():
    """The bench binds its inputs as OrtValues: a scalar `sr` must stay rank 0 (numpy's ascontiguousarray makes it
    [1], which ONNX Runtime's bound run does not check)."""
    from onnx_norm.sessions import to_ortvalue

    assert to_ortvalue(np.array(16000, np.int64)).shape() == []
    assert to_ortvalue(np.zeros((2, 3), np.float32)[:, ::2]).shape() == [2, 2]


# ---------------------------------------------------------------------------------------- values from the graph


def _rules(nodes, graph_inputs, initializers=()) -> dict[str, tuple[object, str]]:
    model = _model(nodes, graph_inputs, [helper.make_tensor_value_info("out", TensorProto.BOOL, None)], initializers)
    return {name: (rule.value, rule.why) for name, rule in graph_rules(model, inputs.input_specs(model)).items()}


def _scalar(name: str, elem_type: int = TensorProto.INT64, shape=()) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def test_the_largest_equality_constant_is_chosen_through_casts_and_constant_nodes():
    nodes = [
        helper.make_node("Constant", [], ["c8k"], value_int=8000),
        helper.make_node("Constant", [], ["c16k"], value=numpy_helper.from_array(np.array([16000.0], np.float32))),
        helper.make_node("Equal", ["sr", "c8k"], ["a"]),
        helper.make_node("Cast", ["sr"], ["sr_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["sr_f", "axes"], ["sr_u"]),
        helper.make_node("Equal", ["c16k", "sr_u"], ["b"]),  # the constant first: either operand
        helper.make_node("Less", ["sr", "limit"], ["c"]),
        helper.make_node("Or", ["a", "b"], ["out"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array([0], np.int64), "axes"),
        numpy_helper.from_array(np.array(48000, np.int64), "limit"),
    ]
    rules = _rules(nodes, [_scalar("sr")], initializers)
    # Equality constants win over the ordered one (48000), the largest of them is taken; all three are named.
    assert rules == {"sr": (16000, "compared with 8000, 16000, 48000 in the graph")}


def test_ordered_comparisons_conditions_and_subgraphs_give_values():
    then_branch = helper.make_graph(
        [helper.make_node("GreaterOrEqual", ["step", "four"], ["late"])],  # names the outer-scope `step`
        "then",
        [],
        [helper.make_tensor_value_info("late", TensorProto.BOOL, [])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["flag"], ["same"])], "else", [], [_scalar("same", TensorProto.BOOL)]
    )
    nodes = [
        helper.make_node("If", ["flag"], ["out"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Cast", ["use_cache"], ["use_cache_b"], to=TensorProto.BOOL),
        helper.make_node("Where", ["use_cache_b", "step", "step"], ["picked"]),
        helper.make_node("Greater", ["temperature", "half"], ["hot"]),
        helper.make_node("Equal", ["rate", "rate_bad"], ["odd"]),
    ]
    graph_inputs = [
        _scalar("flag", TensorProto.BOOL),
        _scalar("step"),
        _scalar("use_cache", TensorProto.INT32, [1]),
        _scalar("temperature", TensorProto.FLOAT),
        _scalar("rate", TensorProto.UINT8),
    ]
    initializers = [
        numpy_helper.from_array(np.array(4, np.int64), "four"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(np.array(300, np.int64), "rate_bad"),  # no uint8 value: skipped
    ]
    assert _rules(nodes, graph_inputs, initializers) == {
        "flag": (True, "the condition of a If: its true branch"),
        "step": (4, "compared with 4 in the graph"),
        "use_cache": (1, "the condition of a Where: its true branch"),
        "temperature": (0.5, "compared with 0.5 in the graph"),
    }


def test_graph_values_apply_to_one_element_inputs_and_a_table_still_bounds_its_ids():
    """A tensor compared elementwise computes both outcomes, so it stays random; an id that indexes a table (and is
    compared with a pad id) stays inside the table."""
    nodes = [
        helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
        helper.make_node("Gather", ["table", "ids"], ["emb"]),
        helper.make_node("Equal", ["codes", "pad"], ["out"]),
        helper.make_node("Equal", ["sr", "rate"], ["ok"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array(0, np.int64), "pad"),
        numpy_helper.from_array(np.array(16000, np.int64), "rate"),
        numpy_helper.from_array(np.zeros((30, 4), np.float32), "table"),
    ]
    graph_inputs = [_scalar("ids", shape=["batch", 64]), _scalar("codes", shape=[1, 64]), _scalar("sr", shape=[1])]
    model = _model(nodes, graph_inputs, [helper.make_tensor_value_info("out", TensorProto.BOOL, None)], initializers)
    (sample,) = inputs.generate(model)
    assert sample["sr"].tolist() == [16000]
    assert sample["ids"].min() >= 0 and sample["ids"].max() < 30 and len(np.unique(sample["ids"])) > 5
    assert len(np.unique(sample["codes"])) > 5  # random, not all the constant 0


def test_a_graph_value_makes_the_real_path_run_where_every_random_draw_fails(tmp_path: Path):
    model = tmp_path / "vad.onnx"
    onnx.save(vad_model(), model)
    for sr in range(16):  # the integer fallback draws from [0, 16): each of them takes the failing branch
        with pytest.raises(SessionError, match="Reshape"):
            parity.verify(model, model, samples=1, values={"sr": sr})
    report = parity.verify(model, model, samples=1)
    assert report.passed
    assert report.input_values == {"sr": {"value": 16000, "why": "compared with 8000, 16000 in the graph"}}
    assert report.inputs_line == "inputs: sr=16000 (compared with 8000, 16000 in the graph)"


# ---------------------------------------------------------------------------------------- --input NAME=VALUE


def test_cli_verify_and_optimize_use_the_graph_value_and_list_it(tmp_path: Path):
    model, optimized, report = tmp_path / "vad.onnx", tmp_path / "vad.opt.onnx", tmp_path / "parity.json"
    onnx.save(vad_model(), model)
    done = cli("optimize", model, "-o", optimized, "--verify", "--samples", "1", "--verify-report", report)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "inputs: sr=16000 (compared with 8000, 16000 in the graph)" in done.stdout
    data = json.loads(report.read_text())
    assert data["input_values"] == {"sr": {"value": 16000, "why": "compared with 8000, 16000 in the graph"}}
    assert any(node.op_type == "LayerNorm" for node in onnx.load(optimized).graph.node)  # a real twin
    done = cli("verify", model, optimized, "--samples", "1", "--input", "sr=8000", "--report", report)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "inputs: sr=8000 (given)" in done.stdout
    assert json.loads(report.read_text())["input_values"] == {"sr": {"value": 8000, "why": "given"}}
    error = _one_line_error(cli("verify", model, model, "--input", "nosuch=1"))
    assert "'nosuch' is not an input of the model" in error


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nosuch=1", "--input nosuch=1: 'nosuch' is not an input of the model (inputs: x: "),
        ("sr=abc", "--input 'sr=abc': 'abc' is not a number or true/false"),
        ("sr=1,2", "--input sr=1,2: 'sr' is a scalar; give one value"),
        ("sr=0.5", "--input sr=0.5: 0.5 is not a int64 value"),
        ("sr", "--input 'sr': expected NAME=VALUE"),
        ("x=1,2,3", "--input x=1,2,3: 'x' is not 1-D; a comma list sets a 1-D input"),
    ],
)
def test_bad_input_values_are_one_line_exit_2(tmp_path: Path, capfd, value, message):
    model = tmp_path / "vad.onnx"
    onnx.save(vad_model(), model)
    for command in ("verify", "bench"):
        argv = [command, str(model), str(model), "--input", value]
        assert main(argv + (["--samples", "1"] if command == "verify" else ["--repeat", "1"])) == 2
        err = capfd.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err, err


def test_a_failure_on_a_random_value_names_the_input_to_set(tmp_path: Path, caplog, capfd):
    model = tmp_path / "reshape.onnx"
    onnx.save(reshape_by_input_model(), model)
    with caplog.at_level(logging.WARNING, logger="onnx_norm.inputs"):
        (sample,) = inputs.generate(onnx.load(model))
    assert "integer input 'k' feeds no Gather or comparison" in caplog.text and "--input k=VALUE" in caplog.text
    drawn = int(sample["k"])
    error = _one_line_error(cli("verify", model, model, "--samples", "1"), warnings=1)
    assert f"(generated inputs: k={drawn} was drawn at random; set it with --input k=VALUE)" in error
    assert cli("verify", model, model, "--samples", "1", "--input", "k=16").returncode == 0
    # bench says the same of the value it timed with.
    assert main(["bench", str(model), str(model), "--warmup", "0", "--repeat", "1", "--sessions", "1"]) == 2
    assert f"k={drawn} was drawn at random; set it with --input k=VALUE" in capfd.readouterr().err
    # A value the user set is not offered as the culprit.
    with pytest.raises(SessionError) as raised:
        parity.verify(model, model, samples=1, values={"k": 5})
    assert "--input" not in str(raised.value)


def test_values_parse_normalise_and_fit_the_declaration():
    assert parse_values(["sr=16000", "ids=1,2,3", "one=5,", "flag=True", "t=0.5"]) == {
        "sr": 16000,
        "ids": (1, 2, 3),
        "one": (5,),
        "flag": True,
        "t": 0.5,
    }
    with pytest.raises(InputError, match="set twice"):
        parse_values(["sr=1", "sr=2"])
    with pytest.raises(InputError, match="data files go to --inputs"):
        parse_values(["sample.npz"])
    assert normalize_values({"a": np.int64(3), "b": np.array([1, 2]), "c": [True], "d": np.array(2.5)}) == {
        "a": 3,
        "b": (1, 2),
        "c": (True,),
        "d": 2.5,
    }
    for bad in ({"a": "16000"}, {"a": [[1, 2]]}, {"a": []}, {1: 2}):
        with pytest.raises(InputError, match="values"):
            InputOptions(values=bad)
    assert InputOptions(values={"sr": np.int32(8000)}).values == {"sr": 8000}


def _ids_model() -> onnx.ModelProto:
    """ids and mask int64[sequence], sr int64[], flag bool[1]: y = Gather(table, ids) * mask, plus the rest."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"]),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["emb", "mask_f"], ["y"]),
        helper.make_node("Identity", ["sr"], ["sr_out"]),
        helper.make_node("Identity", ["flag"], ["flag_out"]),
    ]
    graph_inputs = [
        _scalar("ids", shape=["sequence"]),
        _scalar("mask", shape=["sequence"]),
        _scalar("sr"),
        _scalar("flag", TensorProto.BOOL, [1]),
    ]
    outputs = [
        helper.make_tensor_value_info(name, elem, None)
        for name, elem in (("y", TensorProto.FLOAT), ("sr_out", TensorProto.INT64), ("flag_out", TensorProto.BOOL))
    ]
    return _model(nodes, graph_inputs, outputs, [numpy_helper.from_array(np.arange(9, dtype=np.float32), "table")])


def test_given_values_set_inputs_in_generated_and_loaded_samples(tmp_path: Path):
    model = _ids_model()
    values = {"ids": (4, 5, 6), "sr": 8000, "flag": True}
    first, second = inputs.generate(model, samples=2, values=values)
    for sample in (first, second):
        assert sample["ids"].tolist() == [4, 5, 6] and sample["ids"].dtype == np.int64
        assert sample["mask"].shape == (3,)  # the list fixed `sequence` for every input that names it
        assert sample["sr"].shape == () and int(sample["sr"]) == 8000
        assert sample["flag"].tolist() == [True]  # one value fills a [1] input
    with pytest.raises(InputError, match=r"--input ids=4,5,6 gives shape \[3\], --shape ids gives \[4\]"):
        inputs.generate(model, values=values, shapes={"ids": (4,)})
    with pytest.raises(InputError, match="--input flag=2: 2 is not a bool value"):
        inputs.generate(model, values={"flag": 2})
    # With files, a value replaces that input in every file's sample (one value filling the array loaded).
    np.savez(tmp_path / "a.npz", ids=np.zeros(2, np.int64), mask=np.ones(2, np.int64), sr=np.array(1), flag=[False])
    (loaded,) = inputs.prepare(model, files=[tmp_path / "a.npz"], values={"sr": 16000, "flag": True})
    assert int(loaded["sr"]) == 16000 and loaded["flag"].tolist() == [True] and loaded["ids"].tolist() == [0, 0]
    with pytest.raises(InputError, match="'sequence' is 2 in input 'mask' but 3 in input 'ids'"):
        inputs.prepare(model, files=[tmp_path / "a.npz"], values={"ids": [1, 2, 3]})
    notes = inputs.input_notes(model, first, values=values)
    assert notes["ids"] == {"value": [4, 5, 6], "why": "given"}
    assert inputs.notes_line(notes) == "inputs: ids=4,5,6 (given); sr=8000 (given); flag=true (given)"
