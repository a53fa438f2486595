"""Loading and saving models without ever losing or breaking one: external data in every layout, the same-file
guard over data files, inline saves, atomic writes, and the checker on the way in."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from model_builders import layer_norm_model
from onnx import TensorProto, helper
from repo_paths import EXAMPLES

import onnx_norm
from onnx_norm import model_io, paths
from onnx_norm.cli import main

BERT = EXAMPLES / "bert-layernorm-opset13.onnx"
X = np.random.default_rng(3).standard_normal((2, 5, 16)).astype(np.float32)


def _run(path: Path, feeds: dict[str, np.ndarray] | None = None) -> np.ndarray:
    options = onnx_norm.session_options()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds or {"x": X})[0]


def _external(path: Path) -> list[onnx.TensorProto]:
    return model_io.external_tensors(onnx.load(str(path), load_external_data=False))


def _save_external(model: onnx.ModelProto, path: Path, **kwargs) -> None:
    onnx.save(model, path, save_as_external_data=True, size_threshold=0, **kwargs)


def test_the_data_file_an_input_reads_is_never_overwritten(tmp_path: Path, capsys):
    """`mv model.onnx model.orig.onnx` leaves the weights in model.onnx.data; `-o model.onnx` would write there."""
    original = tmp_path / "model.orig.onnx"
    _save_external(layer_norm_model(), original, location="model.onnx.data")
    data = (tmp_path / "model.onnx.data").read_bytes()
    expected = _run(original)
    assert main(["optimize", str(original), "-o", str(tmp_path / "model.onnx")]) == 2
    assert "is the external data file of" in capsys.readouterr().err
    assert (tmp_path / "model.onnx.data").read_bytes() == data
    assert not (tmp_path / "model.onnx").exists()
    np.testing.assert_array_equal(_run(original), expected)
    # The guard follows the output's data file only when one may be written.
    assert main(["optimize", str(original), "-o", str(tmp_path / "model.onnx"), "--external-data", "never"]) == 0
    np.testing.assert_array_equal(_run(original), expected)


def test_external_data_never_writes_every_tensor_inline(tmp_path: Path, capsys):
    source = tmp_path / "in" / "model.onnx"
    source.parent.mkdir()
    _save_external(layer_norm_model(), source, location="weights.bin")
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    code = main(["optimize", str(source), "-o", str(out), "--external-data", "never", "--verify"])
    assert code == 0, capsys.readouterr()
    assert _external(out) == []
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx"]
    moved = tmp_path / "elsewhere.onnx"
    shutil.move(out, moved)
    shutil.rmtree(source.parent)  # nothing may still point at the input's data
    np.testing.assert_allclose(_run(moved), _run_reference(), rtol=1e-5, atol=1e-5)


def _run_reference() -> np.ndarray:
    session = ort.InferenceSession(layer_norm_model().SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": X})[0]


def test_save_without_external_data_inlines_and_leaves_the_model_alone(tmp_path: Path):
    source = tmp_path / "model.onnx"
    _save_external(layer_norm_model(), source, all_tensors_to_one_file=False)
    model = model_io.load(source)
    model_io.save(model, tmp_path / "inline.onnx", external_data=False)
    assert _external(tmp_path / "inline.onnx") == []
    assert all(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values())
    np.testing.assert_array_equal(_run(tmp_path / "inline.onnx"), _run(source))


def test_an_inline_save_above_the_protobuf_limit_is_a_clear_error(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", 64)
    with pytest.raises(model_io.ModelSaveError, match="more than one protobuf can hold"):
        model_io.save(layer_norm_model(), tmp_path / "big.onnx", external_data=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("one_file", [True, False], ids=["one-data-file", "file-per-tensor"])
def test_small_external_tensors_do_not_crash_the_save(tmp_path: Path, capsys, one_file):
    """onnx-ir closed the memory map of a small external tensor under arrays still viewing it (BufferError)."""
    source = tmp_path / "bert.onnx"
    _save_external(onnx.load(BERT), source, all_tensors_to_one_file=one_file, location="bert.onnx.data")
    out = tmp_path / "bert.opt.onnx"
    code = main(["optimize", str(source), "-o", str(out), "--verify", "--shape", "sequence:8"])
    assert code == 0, capsys.readouterr()
    assert _external(out)  # the input used external data: so does the output
    assert (tmp_path / "bert.opt.onnx.data").stat().st_size > 0


def test_external_data_always_puts_the_weights_in_the_data_file(tmp_path: Path, capsys):
    source, out = tmp_path / "small.onnx", tmp_path / "small.opt.onnx"
    onnx.save(layer_norm_model(), source)
    assert main(["optimize", str(source), "-o", str(out), "--external-data", "always"]) == 0
    data = tmp_path / "small.opt.onnx.data"
    assert data.stat().st_size > 0
    proto = onnx.load(str(out), load_external_data=False)
    inline = [t.name for t in proto.graph.initializer if t.data_location != TensorProto.EXTERNAL]
    assert inline == []
    np.testing.assert_allclose(_run(out), _run_reference(), rtol=1e-5, atol=1e-5)


def test_a_rerun_that_writes_no_data_file_removes_the_old_outputs_one(tmp_path: Path, capsys):
    """OUT.data of an earlier run must not linger beside an OUT that no longer reads it (stale weights, wasted
    disk, and a file a later `--external-data auto` run would mistake for the model's)."""
    source, out = tmp_path / "small.onnx", tmp_path / "small.opt.onnx"
    onnx.save(layer_norm_model(), source)
    assert main(["optimize", str(source), "-o", str(out), "--external-data", "always"]) == 0
    assert (tmp_path / "small.opt.onnx.data").is_file()
    assert main(["optimize", str(source), "-o", str(out), "--force"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.onnx", "small.opt.onnx"]
    assert _external(out) == []
    np.testing.assert_allclose(_run(out), _run_reference(), rtol=1e-5, atol=1e-5)


def test_the_model_optimized_over_itself_drops_its_old_data_file(tmp_path: Path, capsys):
    """`optimize m.onnx -o m.onnx --force --external-data never`: the old m.onnx.data was the input's, read
    before it was replaced; the new m.onnx holds every weight, so the data file goes."""
    model = tmp_path / "m.onnx"
    _save_external(layer_norm_model(), model, location="m.onnx.data")
    expected = _run(model)
    assert main(["optimize", str(model), "-o", str(model), "--force", "--external-data", "never"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    np.testing.assert_allclose(_run(model), expected, rtol=1e-5, atol=1e-5)


def test_a_data_file_the_old_output_did_not_read_or_an_input_still_reads_is_kept(tmp_path: Path, capsys):
    source, out = tmp_path / "small.onnx", tmp_path / "small.opt.onnx"
    onnx.save(layer_norm_model(), source)
    unrelated = tmp_path / "small.opt.onnx.data"
    unrelated.write_bytes(b"not the output's")
    onnx.save(layer_norm_model(), out)  # an OUT that reads no data file
    assert main(["optimize", str(source), "-o", str(out), "--force"]) == 0
    assert unrelated.read_bytes() == b"not the output's"
    # The old OUT read it, and so does the input: it stays (the input keeps its weights).
    shared = tmp_path / "shared"
    shared.mkdir()
    original, target = shared / "a.onnx", shared / "b.onnx"
    _save_external(layer_norm_model(), original, location="b.onnx.data")
    shutil.copy(original, target)
    expected = _run(original)
    assert main(["optimize", str(original), "-o", str(target), "--force", "--external-data", "never"]) == 0
    assert (shared / "b.onnx.data").is_file()
    np.testing.assert_array_equal(_run(original), expected)


def test_an_external_save_with_nothing_to_externalize_writes_no_empty_data_file(tmp_path: Path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    model_io.save(model, tmp_path / "m.onnx", external_data=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_save_takes_the_model_proto_that_optimize_returns(tmp_path: Path):
    optimized, _ = onnx_norm.optimize(layer_norm_model())
    assert isinstance(optimized, onnx.ModelProto)
    onnx_norm.save(optimized, tmp_path / "opt.onnx")
    np.testing.assert_allclose(_run(tmp_path / "opt.onnx"), _run_reference(), rtol=1e-5, atol=1e-5)


def test_a_failed_save_leaves_the_previous_output_and_no_debris(tmp_path: Path, monkeypatch):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"the previous model")

    def disk_full(model, path, **kwargs):
        Path(path).write_bytes(b"half a mod")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ir, "save", disk_full)
    with pytest.raises(model_io.ModelSaveError, match="No space left on device"):
        model_io.save(layer_norm_model(), out)
    assert out.read_bytes() == b"the previous model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]


def test_atomic_text_writes_keep_the_old_file_on_failure_and_its_mode(tmp_path: Path, monkeypatch):
    report = tmp_path / "report.json"
    report.write_text("old")
    report.chmod(0o640)
    paths.write_text_atomic(report, "new")
    assert report.read_text() == "new"
    assert report.stat().st_mode & 0o777 == 0o640

    def fail(*args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(paths.os, "replace", fail)
    with pytest.raises(OSError, match="Input/output error"):
        paths.write_text_atomic(report, "newer")
    assert report.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_model_that_parses_but_is_not_valid_is_refused(tmp_path: Path):
    model = layer_norm_model()
    del model.opset_import[:]
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(model_io.ModelLoadError, match=r"bad\.onnx: not a valid ONNX model"):
        onnx_norm.optimize(str(tmp_path / "bad.onnx"))
    with pytest.raises(model_io.ModelLoadError, match="not a valid ONNX model"):
        onnx_norm.optimize(model)


def test_models_that_onnx_runtime_runs_pass_the_check(tmp_path: Path):
    """The check is relaxed where the checker is stricter than ONNX Runtime: ORT's ONNX-domain norm ops and graph
    outputs of unknown rank, in a model with external data (read relative to the model, not the working dir)."""
    graph = helper.make_graph(
        [helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], axis=-1, epsilon=1e-6)],
        "ort_flavoured",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.ones(16, np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    _save_external(model, tmp_path / "ort.onnx")
    loaded = model_io.load(tmp_path / "ort.onnx")
    assert [node.op_type for node in loaded.graph] == ["SimplifiedLayerNormalization"]
    proto = onnx.load(str(tmp_path / "ort.onnx"), load_external_data=False)
    before = proto.SerializeToString()
    model_io.check(proto, "ort.onnx")
    assert proto.SerializeToString() == before  # the check leaves the model as it was
    _run(tmp_path / "ort.onnx")


def _contrib_model(domain: str) -> onnx.ModelProto:
    """A FastGelu of `domain` in a model that imports only the default domain, as ONNX Runtime's transformers
    optimizer writes them."""
    graph = helper.make_graph(
        [helper.make_node("FastGelu", ["x"], ["y"], domain=domain)],
        "contrib",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(X.shape))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_onnx_runtime_domains_used_without_an_import_are_imported(tmp_path: Path):
    model = _contrib_model("com.microsoft")
    onnx.save(model, tmp_path / "contrib.onnx")
    _run(tmp_path / "contrib.onnx")  # ONNX Runtime loads it as it is
    loaded = model_io.load(tmp_path / "contrib.onnx")
    assert loaded.opset_imports == {"": 17, "com.microsoft": 1}
    model_io.save(loaded, tmp_path / "out.onnx")
    onnx.checker.check_model(onnx.load(str(tmp_path / "out.onnx")))  # the written model is valid ONNX
    assert [o.domain for o in model.opset_import] == [""]  # the ModelProto given is not changed


def test_other_domains_used_without_an_import_are_still_refused():
    with pytest.raises(model_io.ModelLoadError, match=r"No opset import for domain 'my\.ops'"):
        model_io.load(_contrib_model("my.ops"))


@pytest.mark.parametrize("external", [True, False])
def test_a_model_file_read_once_serves_the_rewrite_and_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, external: bool
):
    """`read_file` reads the file; `load` and `load_proto` take the ModelFile without reading it again. The rewrite
    of the ir.Model leaves the proto as it was read (its tensors are views of the proto's, inline or external); the
    ir.Model keeps its data files relative to the model's folder while the proto's locations are made absolute for
    sessions."""
    source = tmp_path / "in" / "m.onnx"
    source.parent.mkdir()
    if external:
        _save_external(layer_norm_model(), source, location="m.onnx.data")
    else:
        onnx.save(layer_norm_model(), source)
    read = model_io.read_file(source)
    before = read.proto.SerializeToString()
    monkeypatch.setattr(model_io, "read_proto", lambda *args, **kwargs: pytest.fail("read again"))
    model = model_io.load(read)
    optimized, report = onnx_norm.optimize(model)
    assert report.norms and read.proto.SerializeToString() == before
    tensors = [value.const_value for value in model.graph.initializers.values()]
    kept = {(t.location, Path(t.base_dir)) for t in tensors if isinstance(t, ir.ExternalTensor)}
    assert kept == ({("m.onnx.data", source.parent)} if external else set())
    proto = model_io.load_proto(read, resolve_external=True)
    assert proto is read.proto
    entries = [entry for t in model_io.external_tensors(proto) for entry in t.external_data]
    locations = {entry.value for entry in entries if entry.key == "location"}
    assert locations == ({os.path.abspath(source.parent / "m.onnx.data")} if external else set())
    model_io.save(optimized, tmp_path / "out.onnx")
    np.testing.assert_allclose(_run(tmp_path / "out.onnx"), _run(source), atol=1e-5)
