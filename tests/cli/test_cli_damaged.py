"""Damaged external data (issue 31): a 0-byte, truncated or missing `.data` file, an offset past its end or below
zero, a length that is not the tensor's. Every command fails at load, before anything reads the data: exit 2, one
line on stderr naming the model, the data file and the tensor, no traceback, no warning before it, nothing written.
The Python API's load raises the library's load error. Tensors in Constant nodes and in subgraphs are checked too,
and a location ONNX Runtime refuses (absolute, or outside the model's folder) is called what it is."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from cli_support import onnx_norm_command
from model_builders import HIDDEN, layer_norm_model, snapshot
from onnx import TensorProto, helper, numpy_helper

import onnx_norm
from onnx_norm import model_io
from onnx_norm.cli import main
from onnx_norm.inputs import InputError

DATA = "m.onnx.data"


def _save_external(model: onnx.ModelProto, path: Path) -> None:
    """Every tensor into DATA, those of node attributes (a Constant's) too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, location=DATA, size_threshold=0, convert_attribute=True)


def _set_entry(path: Path, tensor_name: str, key: str, value: str) -> None:
    """Sets the external_data entry `key` of the tensor named `tensor_name` (initializer, attribute or subgraph)."""
    proto = onnx.load(str(path), load_external_data=False)
    tensors = [tensor for tensor in model_io.external_tensors(proto) if tensor.name == tensor_name]
    assert len(tensors) == 1
    entries = {entry.key: entry for entry in tensors[0].external_data}
    if key in entries:
        entries[key].value = value
    else:
        tensors[0].external_data.add(key=key, value=value)
    onnx.save(proto, str(path))


def _empty(model: Path) -> str:
    (model.parent / DATA).write_bytes(b"")
    return "'m.onnx.data' holds 0 bytes (an empty file), 'two' needs bytes 0 to 4"  # 'two' is the first tensor


def _truncated(model: Path) -> str:
    data = model.parent / DATA
    data.write_bytes(data.read_bytes()[:68])
    return "'m.onnx.data' holds 68 bytes, 'gamma' needs bytes 8 to 72"


def _missing(model: Path) -> str:
    (model.parent / DATA).unlink()
    return "'m.onnx.data' of 'two' is missing"


def _offset_past_end(model: Path) -> str:
    _set_entry(model, "gamma", "offset", "1000000")
    return "'m.onnx.data' holds 136 bytes, 'gamma' needs bytes 1000000 to 1000064"


def _negative_offset(model: Path) -> str:
    _set_entry(model, "gamma", "offset", "-8")
    return "'gamma' in 'm.onnx.data' has offset '-8'; it must be a byte count >= 0"


def _wrong_length(model: Path) -> str:
    _set_entry(model, "gamma", "length", "68")  # ONNX Runtime: "external data size mismatch"
    return "'gamma' in 'm.onnx.data' has length 68, but its type and shape take 64 bytes"


def _no_length_and_short(model: Path) -> str:
    """Without a length the tensor takes what its type and shape say, as ONNX Runtime and onnx-ir read it."""
    proto = onnx.load(str(model), load_external_data=False)
    for tensor in model_io.external_tensors(proto):
        kept = [entry for entry in tensor.external_data if entry.key != "length"]
        del tensor.external_data[:]
        tensor.external_data.extend(kept)
    onnx.save(proto, str(model))
    data = model.parent / DATA
    data.write_bytes(data.read_bytes()[:100])
    return "'m.onnx.data' holds 100 bytes, 'beta' needs bytes 72 to 136"


DAMAGES: dict[str, Callable[[Path], str]] = {
    "empty": _empty,
    "truncated": _truncated,
    "missing": _missing,
    "offset-past-end": _offset_past_end,
    "negative-offset": _negative_offset,
    "wrong-length": _wrong_length,
    "no-length-short": _no_length_and_short,
}

# argv from (damaged model, a good model, its good optimized version, an output path)
COMMANDS: dict[str, Callable[[Path, Path, Path, Path], list[str]]] = {
    "inspect": lambda bad, good, opt, out: ["inspect", str(bad)],
    "optimize": lambda bad, good, opt, out: ["optimize", str(bad), "-o", str(out)],
    "optimize-verify": lambda bad, good, opt, out: ["optimize", str(bad), "-o", str(out), "--verify"],
    "verify-original": lambda bad, good, opt, out: ["verify", str(bad), str(opt)],
    "verify-optimized": lambda bad, good, opt, out: ["verify", str(good), str(bad)],
    "bench": lambda bad, good, opt, out: ["bench", str(bad), "--repeat", "1", "--warmup", "0"],
    "bench-optimized": lambda bad, good, opt, out: ["bench", str(good), str(bad), "--repeat", "1", "--warmup", "0"],
}


@pytest.fixture
def good(tmp_path: Path) -> tuple[Path, Path]:
    """An undamaged model with external data, and its optimized version (inline)."""
    model = tmp_path / "good" / "m.onnx"
    _save_external(layer_norm_model(), model)
    optimized = tmp_path / "good" / "m.opt.onnx"
    onnx.save(onnx_norm.optimize(layer_norm_model())[0], str(optimized))
    return model, optimized


def _damaged(root: Path, damage: str) -> tuple[Path, str]:
    model = root / "bad" / "m.onnx"
    _save_external(layer_norm_model(), model)
    return model, DAMAGES[damage](model)


def _assert_one_line(code: int, stderr: str, stdout: str, command: str, model: Path, expected: str) -> None:
    assert code == 2, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr  # no WARNING line before it, no traceback
    assert lines[0].startswith(f"onnx-norm {command}: error: {model}: cannot read its external data: "), lines[0]
    assert expected in lines[0], lines[0]
    assert "Traceback" not in stderr + stdout


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_data_fails_at_load_in_one_line(tmp_path: Path, good, capfd, damage: str, command: str) -> None:
    model, expected = _damaged(tmp_path, damage)
    before = snapshot(tmp_path)
    argv = COMMANDS[command](model, *good, tmp_path / "bad" / "out.onnx")
    code = main(argv)
    captured = capfd.readouterr()  # file descriptors: an ONNX Runtime log line would show here
    _assert_one_line(code, captured.err, captured.out, argv[0], model, expected)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(("damage", "command"), list(zip(DAMAGES, COMMANDS, strict=True)))
def test_damaged_data_as_a_user_types_it(tmp_path: Path, good, damage: str, command: str) -> None:
    """The installed `onnx-norm` in a process of its own, output piped as in CI: each damage with one command."""
    model, expected = _damaged(tmp_path, damage)
    before = snapshot(tmp_path)
    argv = COMMANDS[command](model, *good, tmp_path / "bad" / "out.onnx")
    done = subprocess.run([*onnx_norm_command(), *argv], capture_output=True, text=True, timeout=300, check=False)
    _assert_one_line(done.returncode, done.stderr, done.stdout, argv[0], model, expected)
    assert done.stdout == ""
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_the_api_raises_the_load_error(tmp_path: Path, damage: str, monkeypatch) -> None:
    model, expected = _damaged(tmp_path, damage)
    with pytest.raises(model_io.ModelLoadError, match="cannot read its external data") as raised:
        model_io.load(model)
    assert expected in str(raised.value)
    with pytest.raises(model_io.ModelLoadError, match="cannot read its external data"):
        onnx_norm.optimize(str(model))
    with pytest.raises(InputError, match="cannot read its external data"):
        onnx_norm.verify(str(model), str(model))
    # A ModelProto read without its data: its locations are relative to the working directory.
    monkeypatch.chdir(model.parent)
    with pytest.raises(model_io.ModelLoadError, match="the ModelProto: cannot read its external data"):
        onnx_norm.optimize(onnx.load(str(model), load_external_data=False))


def test_an_ir_model_with_damaged_data_raises_the_load_error(tmp_path: Path) -> None:
    """onnx-ir reads no data when it loads: a damaged file is found by onnx-norm's load, not by the rewrite's
    constant folding halfway through (`ValueError: cannot mmap an empty file`)."""
    model = tmp_path / "m.onnx"
    _save_external(layer_norm_model(), model)
    loaded = ir.load(str(model))
    (tmp_path / DATA).write_bytes(b"")
    with pytest.raises(model_io.ModelLoadError, match=r"'m\.onnx\.data' holds 0 bytes"):
        onnx_norm.optimize(loaded)


def _constant_and_subgraph_model() -> onnx.ModelProto:
    """The LayerNorm with its scale in a Constant node, and an If whose branches hold initializers of their own."""
    model = layer_norm_model()
    graph = model.graph
    gamma = next(tensor for tensor in graph.initializer if tensor.name == "gamma")
    graph.initializer.remove(gamma)
    graph.node.insert(0, helper.make_node("Constant", [], ["gamma"], value=gamma, name="gamma_const"))

    def branch(name: str, value: float) -> onnx.GraphProto:
        bias = numpy_helper.from_array(np.full(HIDDEN, value, np.float32), f"{name}_bias")
        out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [HIDDEN])
        return helper.make_graph([helper.make_node("Identity", [bias.name], [out.name])], name, [], [out], [bias])

    graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    graph.node.append(
        helper.make_node(
            "If", ["flag"], ["bias"], then_branch=branch("then", 1.0), else_branch=branch("else", 0.0), name="if"
        )
    )
    graph.node.append(helper.make_node("Add", ["y", "bias"], ["z"], name="add_bias"))
    graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "sequence", HIDDEN]))
    return model


@pytest.mark.parametrize(
    ("tensor", "label"),
    [
        ("gamma", "'gamma' (attribute 'value' of Constant node 'gamma_const')"),
        ("then_bias", "'then_bias' (in the 'then_branch' subgraph of If node 'if')"),
    ],
)
def test_constant_and_subgraph_tensors_are_checked(tmp_path: Path, capfd, tensor: str, label: str) -> None:
    model = tmp_path / "m.onnx"
    _save_external(_constant_and_subgraph_model(), model)
    assert main(["inspect", str(model)]) == 0  # undamaged, it loads
    capfd.readouterr()
    _set_entry(model, tensor, "offset", "4096")
    before = snapshot(tmp_path)
    for argv in (["inspect", str(model)], ["optimize", str(model), "-o", str(tmp_path / "o.onnx")]):
        code = main(argv)
        captured = capfd.readouterr()
        _assert_one_line(code, captured.err, captured.out, argv[0], model, f"{label} needs bytes 4096 to")
    code = main(["verify", str(model), str(model)])
    captured = capfd.readouterr()
    _assert_one_line(code, captured.err, captured.out, "verify", model, f"{label} needs bytes 4096 to")
    assert snapshot(tmp_path) == before


def _relocated(tmp_path: Path, location: str) -> Path:
    """A model in tmp_path/models/sub whose tensors all name `location` (the data file is there)."""
    source = tmp_path / "models" / "m.onnx"
    _save_external(layer_norm_model(), source)
    model = tmp_path / "models" / "sub" / "m.onnx"
    model.parent.mkdir()
    proto = onnx.load(str(source), load_external_data=False)
    for tensor in model_io.external_tensors(proto):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(proto, str(model))
    return model


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("../m.onnx.data", "'../m.onnx.data' of 'two' is outside the model's folder ("),
        ("{root}/models/m.onnx.data", "'{root}/models/m.onnx.data' of 'two' is an absolute path"),
    ],
    ids=["parent-folder", "absolute"],
)
def test_a_location_onnx_runtime_refuses_is_called_what_it_is(tmp_path: Path, capfd, location, expected) -> None:
    model = _relocated(tmp_path, location.format(root=tmp_path))
    for argv in (["inspect", str(model)], ["verify", str(model), str(model)], ["bench", str(model)]):
        code = main(argv)
        captured = capfd.readouterr()
        _assert_one_line(code, captured.err, captured.out, argv[0], model, expected.format(root=tmp_path))
        assert "symbolic link" not in captured.err
        assert "which ONNX Runtime and onnx refuse" in captured.err
