"""Input generation and loading for parity and bench (onnx_norm.inputs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_norm import inputs, model_io

VOCAB = 37
POSITIONS = 24


def _embedding_model(*, position_table: bool = False) -> onnx.ModelProto:
    """ids -> Cast -> Unsqueeze -> Squeeze -> Gather(table[VOCAB, 8]); mask and position ids as graph inputs."""
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Unsqueeze", ["ids32", "axes0"], ["ids_u"]),
        helper.make_node("Squeeze", ["ids_u", "axes0"], ["ids_s"]),
        helper.make_node("Gather", ["table", "ids_s"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "axes_last"], ["mask_u"]),
        helper.make_node("Mul", ["emb", "mask_u"], ["masked"]),
        helper.make_node("Add", ["masked", "hidden"], ["y"]),
    ]
    initializers = [
        numpy_helper.from_array(np.zeros((VOCAB, 8), np.float32), "table"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes_last"),
    ]
    graph_inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("hidden", TensorProto.FLOAT16, ["batch", "sequence", 8]),
    ]
    if position_table:
        nodes.append(helper.make_node("Gather", ["embeddings.position_embeddings.weight", "position_ids"], ["pos"]))
        initializers.append(
            numpy_helper.from_array(np.zeros((POSITIONS, 8), np.float32), "embeddings.position_embeddings.weight")
        )
        graph_inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "embedding", graph_inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_ids_stay_inside_the_table_they_index_through_casts_and_reshapes():
    model = _embedding_model()
    assert inputs.gather_bounds(model) == {"input_ids": VOCAB}
    (sample,) = inputs.generate(model, shapes={"input_ids": (4, 300)})
    ids = sample["input_ids"]
    assert ids.dtype == np.int64
    assert ids.shape == (4, 300)
    assert ids.min() >= 0
    assert ids.max() < VOCAB
    assert len(np.unique(ids)) > VOCAB // 2  # spread over the table, not a constant


def test_masks_are_zero_one_with_a_full_first_row_and_floats_are_standard_normal():
    (sample,) = inputs.generate(model_io.load_proto(_embedding_model()), shapes={"batch": [6], "sequence": [512]})
    mask = sample["attention_mask"]
    assert set(np.unique(mask)) <= {0, 1}
    assert mask[0].all()
    assert mask[:, 0].all()
    for row in mask:  # padding is a tail: ones then zeros
        valid = int(row.sum())
        assert row[:valid].all()
        assert not row[valid:].any()
    hidden = sample["hidden"]
    assert hidden.dtype == np.float16
    assert hidden.shape == (6, 512, 8)
    assert abs(float(hidden.astype(np.float64).mean())) < 0.05
    assert 0.95 < float(hidden.astype(np.float64).std()) < 1.05


def test_symbolic_dims_agree_across_inputs_and_take_defaults():
    model = _embedding_model()
    (sample,) = inputs.generate(model)
    assert sample["input_ids"].shape == (inputs.DEFAULT_BATCH, inputs.DEFAULT_DIM)
    assert sample["attention_mask"].shape == sample["input_ids"].shape
    assert sample["hidden"].shape == (inputs.DEFAULT_BATCH, inputs.DEFAULT_DIM, 8)
    # One input's full shape fixes the symbols every other input uses.
    (sample,) = inputs.generate(model, shapes={"input_ids": (2, 17)})
    assert sample["attention_mask"].shape == (2, 17)
    assert sample["hidden"].shape == (2, 17, 8)


def test_position_ids_count_up_and_the_position_table_caps_the_default_length():
    model = _embedding_model(position_table=True)
    assert inputs.position_limit(model) == POSITIONS
    (sample,) = inputs.generate(model)
    assert sample["input_ids"].shape == (1, POSITIONS)
    np.testing.assert_array_equal(sample["position_ids"][0], np.arange(POSITIONS))


def test_dim_expressions_of_exporters_are_evaluated():
    specs = [
        inputs.InputSpec("ids", TensorProto.INT64, ("batch", "sequence_length")),
        inputs.InputSpec("mask", TensorProto.INT64, ("batch", "past_sequence_length + sequence_length")),
        inputs.InputSpec("past", TensorProto.FLOAT, ("batch", 4, "past_sequence_length", 8)),
    ]
    shapes = inputs.resolve_shapes(specs, {"sequence_length": [5], "past_sequence_length": [7]})
    assert shapes == {"ids": (1, 5), "mask": (1, 12), "past": (1, 4, 7, 8)}
    # A symbol that appears only inside an expression can be set too.
    only_in_expression = [inputs.InputSpec("mask", TensorProto.INT64, ("batch", "past_sequence_length + 1"))]
    assert inputs.resolve_shapes(only_in_expression, {"past_sequence_length": [3]}) == {"mask": (1, 4)}
    assert inputs.resolve_shapes(only_in_expression) == {"mask": (1, inputs.DEFAULT_PAST + 1)}


def test_generation_is_seeded():
    model = _embedding_model()
    first = inputs.generate(model, samples=2, seed=3)
    again = inputs.generate(model, samples=2, seed=3)
    other = inputs.generate(model, samples=2, seed=4)
    for a, b in zip(first, again, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(first[0]["hidden"], first[1]["hidden"])  # samples differ from each other
    assert not np.array_equal(first[0]["hidden"], other[0]["hidden"])


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["input_ids"], "expected NAME:D0,D1"),
        (["input_ids:1,x2"], "must be integers"),
        (["input_ids:1,-3"], "must not be negative"),
    ],
)
def test_parse_shapes_rejects_malformed_items(items, message):
    with pytest.raises(inputs.InputError, match=message):
        inputs.parse_shapes(items)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"nonexistent": (1, 2)}, "neither an input nor a symbolic dim"),
        ({"hidden": (1, 4)}, "rank 2 given"),
        ({"hidden": (1, 4, 9)}, "dim 2 is fixed to 8"),
        ({"sequence": (3, 4)}, "takes one value"),
        ({"input_ids": (1, 4), "attention_mask": (1, 5)}, "sequence is 4 elsewhere"),
    ],
)
def test_shape_overrides_that_do_not_fit_the_model_are_refused(shapes, message):
    with pytest.raises(inputs.InputError, match=message):
        inputs.generate(_embedding_model(), shapes=shapes)


def _sample(batch: int = 1, seq: int = 4) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.zeros((batch, seq), np.int64),
        "attention_mask": np.ones((batch, seq), np.int64),
        "hidden": np.zeros((batch, seq, 8), np.float16),
    }


def test_npz_and_named_npy_files_load_as_samples(tmp_path: Path):
    model = _embedding_model()
    np.savez(tmp_path / "a.npz", **_sample(seq=3))
    np.savez(tmp_path / "b.npz", **_sample(seq=5))
    for name, array in _sample(seq=6).items():
        np.save(tmp_path / f"{name}.npy", array)
    files = [tmp_path / "a.npz", tmp_path / "b.npz", *(f"{n}:{tmp_path / n}.npy" for n in _sample())]
    samples = inputs.load(model, files)
    assert [s["input_ids"].shape[1] for s in samples] == [3, 5, 6]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(input_idz=s.pop("input_ids")), "'input_idz' not an input of the model"),
        (lambda s: s.pop("hidden"), "missing input"),
        (lambda s: s.update(hidden=s["hidden"].astype(np.float32)), "dtype float32, the model expects"),
        (lambda s: s.update(hidden=s["hidden"][..., :4]), "dim 2 must be 8"),
        (lambda s: s.update(hidden=s["hidden"][0]), "rank 2"),
        (lambda s: s.update(attention_mask=s["attention_mask"][:, :2]), "'sequence' is 2 in input"),
    ],
)
def test_loaded_inputs_are_validated_with_a_clear_message(tmp_path: Path, change, message):
    sample = _sample()
    change(sample)
    np.savez(tmp_path / "bad.npz", **sample)
    with pytest.raises(inputs.InputError, match=message):
        inputs.load(_embedding_model(), [tmp_path / "bad.npz"])


def test_unreadable_or_ambiguous_files_are_input_errors(tmp_path: Path):
    model = _embedding_model()
    with pytest.raises(inputs.InputError, match="not found"):
        inputs.load(model, [tmp_path / "missing.npz"])
    (tmp_path / "junk.npz").write_bytes(b"not numpy")
    with pytest.raises(inputs.InputError, match="cannot read"):
        inputs.load(model, [tmp_path / "junk.npz"])
    np.save(tmp_path / "x.npy", np.zeros(3))
    with pytest.raises(inputs.InputError, match="name its input"):
        inputs.load(model, [tmp_path / "x.npy"])
    with pytest.raises(inputs.InputError, match=r"missing\.onnx: no such file"):
        model_io.load_proto(tmp_path / "missing.onnx")
