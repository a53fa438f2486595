"""The op records (onnx_norm/ops/): every record's float64 reference agrees with its model-local function body run by
ONNX Runtime (no library registered), from the record alone; the readers of the native-op table see the records'
native ops; and an op's identifiers stay in its own files (the GroupNorm and modulated ops as the proof)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from repo_paths import REPO

from onnx_norm import model_io
from onnx_norm.ops import functions
from onnx_norm.ops.numerics import np_dtype
from onnx_norm.ops.schema import DOMAIN, OPS, OPSET_VERSION, NormAttributes, OpSignature, native_ops, op_for
from onnx_norm.rewrite import evaluate, native, targets
from onnx_norm.zoo import detect

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
X_SHAPE = (2, 4, 3, 5)
PACKAGE = REPO / "onnx_norm"
#: About one unit in the last place of Y's type (two for float16, where an output cast can tie the other way).
TOLERANCE = {F32: 3e-5, F16: 4e-3}


def _example(record: OpSignature, x_type: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every input of the record, shaped by `record.input_shapes` for an X of X_SHAPE (an offset on X exercises the
    mean subtraction; Scale around 1)."""
    shapes = {"X": X_SHAPE, **record.input_shapes(X_SHAPE, record.example)}
    loc = {"X": 3.0, "Scale": 1.0}
    return {
        name: (rng.standard_normal(shapes[name]) + loc.get(name, 0.0)).astype(np.float32).astype(np_dtype(x_type))
        for name in record.inputs
    }


def _model(record: OpSignature, feeds: dict[str, np.ndarray], x_type: int) -> onnx.ModelProto:
    """One node of the op with every input and output, and its model-local functions attached."""
    node = helper.make_node(
        record.name,
        list(record.inputs),
        list(record.outputs),
        domain=DOMAIN,
        name="op",
        **record.example.as_dict(),
    )
    inputs = [helper.make_tensor_value_info(name, x_type, feeds[name].shape) for name in record.inputs]
    types = {"Y": x_type, "Sum": x_type}  # the statistics are float32
    outputs = [helper.make_tensor_value_info(name, types.get(name, F32), None) for name in record.outputs]
    graph = helper.make_graph([node], "g", inputs, outputs)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=opsets, ir_version=10))
    functions.attach_functions(model)
    return ir.serde.serialize_model(model)


@pytest.mark.parametrize("x_type", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(OPS))
def test_reference_agrees_with_function_body(name: str, x_type: int) -> None:
    record = OPS[name]
    feeds = _example(record, x_type, np.random.default_rng(len(name)))
    session = ort.InferenceSession(
        _model(record, feeds, x_type).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got = session.run(None, feeds)
    want = record.reference(*(feeds[n] for n in record.inputs), **record.example.as_dict())
    assert len(got) == len(want) == len(record.outputs)
    for output, g, w in zip(record.outputs, got, want, strict=True):
        assert g.shape == w.shape, output
        tol = TOLERANCE[x_type] if output in ("Y", "Sum") else TOLERANCE[F32]
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol, err_msg=output)


def test_the_example_exercises_the_attributes_an_op_adds() -> None:
    """An op with attributes of its own sets them away from their defaults in its example, so the test above
    runs them."""
    for record in OPS.values():
        defaults = record.attributes().as_dict()
        shared = {field.name for field in dataclasses.fields(NormAttributes)}
        own = {k: v for k, v in record.example.as_dict().items() if k not in shared}
        assert all(v != defaults[k] for k, v in own.items()), record.name


def test_records_are_found_by_kind() -> None:
    for record in OPS.values():
        assert record.kind, record.name
        assert op_for(record.kind, record.skip) is record
    assert op_for("no such kind") is None


def test_the_native_op_readers_read_the_records() -> None:
    """The take-over, the evaluator, the targets, the loader's checker and the zoo detector list exactly the
    records' native ops."""
    taken_over = {(d, n.op_type) for _, n in native_ops() for d in n.take_over}
    assert taken_over and taken_over == detect.NATIVE_NORM_OPS
    assert {op if not d else f"{d}::{op}" for d, op in taken_over} == native.NATIVE_OP_NAMES
    assert set(evaluate.NORM_OPS) == {n.op_type for op, n in native_ops() if n.take_over and not op.skip}
    contrib_in_onnx_domain = {n.op_type for _, n in native_ops() if not n.single_type and n.domain == ""}
    assert contrib_in_onnx_domain == model_io.ORT_ONNX_DOMAIN_OPS
    for target in (targets.ONNX, targets.ORT):
        emitted = {n.op_type for _, n in native_ops() if target.name in n.targets and n.take_over}
        assert {op for _, op in target.native_ops} == emitted


# --------------------------------------------------------------------------------------------- footprint

#: Identifiers of one op: they appear under onnx_norm/ only in the op's own files, and in the registration lines
#: of the two registries (the op's import and its entry).
_FAMILIES_IMPORT = (
    "from onnx_norm.rewrite.families import gated_norm, group_norm, l2_norm, layer_norm, modulated_norm, rms_norm"
)
FOOTPRINTS = {
    "GroupNorm": (
        # Sigmoid is the proof's own (rewrite/evaluate.py), and SiLU no op's own word: GroupNorm fuses it as its
        # activation, GatedRMSNorm as its gate.
        re.compile(r"GroupNorm|group_norm|GROUP_NORM|num_groups|InstanceNormalization|ACTIVATIONS|\bgrouped\b"),
        {"ops/group_norm.py", "rewrite/families/group_norm.py"},
        {
            "ops/schema.py": ["from onnx_norm.ops.group_norm import GROUP_NORM", "GROUP_NORM,"],
            "rewrite/families/__init__.py": [
                _FAMILIES_IMPORT,
                "group_norm.FAMILY,",
            ],
        },
    ),
    "GatedRMSNorm": (
        re.compile(r"GatedRMSNorm|gated_norm|GATED_RMS|gated_rms|norm_before_gate|GatedNorm"),
        {"ops/gated_norm.py", "rewrite/families/gated_norm.py"},
        {
            "ops/schema.py": ["from onnx_norm.ops.gated_norm import GATED_RMS_NORM", "GATED_RMS_NORM,"],
            "rewrite/families/__init__.py": [_FAMILIES_IMPORT, "gated_norm.FAMILY,"],
        },
    ),
    "modulated": (
        re.compile(r"modulat|ModScale|ModShift|adaln", re.I),
        {"ops/modulated.py", "rewrite/families/modulated_norm.py"},
        {
            "ops/schema.py": ["from onnx_norm.ops.modulated import MODULATED_OPS", "*MODULATED_OPS.values(),"],
            "rewrite/families/__init__.py": [
                _FAMILIES_IMPORT,
                "*modulated_norm.FAMILIES,",
            ],
        },
    ),
    "L2Norm": (
        re.compile(r"L2Norm|l2_norm|L2_NORM|LpNormalization|LP_NORMALIZATION"),
        {"ops/l2_norm.py", "rewrite/families/l2_norm.py"},
        {
            "ops/schema.py": ["from onnx_norm.ops.l2_norm import L2_NORM", "L2_NORM,"],
            "rewrite/families/__init__.py": [_FAMILIES_IMPORT, "l2_norm.FAMILY,"],
        },
    ),
}


def _mentions(pattern: re.Pattern[str], package: Path = PACKAGE) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        lines = [line.strip() for line in path.read_text().splitlines() if pattern.search(line)]
        if lines:
            found[path.relative_to(package).as_posix()] = lines
    return found


@pytest.mark.parametrize("op", list(FOOTPRINTS))
def test_an_op_lives_in_its_own_files(op: str) -> None:
    pattern, own_files, registrations = FOOTPRINTS[op]
    found = _mentions(pattern)
    assert own_files <= set(found), "the pattern no longer finds the op's own files"
    elsewhere = {path: lines for path, lines in found.items() if path not in own_files}
    assert elsewhere == registrations


def test_the_footprint_check_finds_a_stray_mention(tmp_path: Path) -> None:
    (tmp_path / "shared.py").write_text('"""Shared code; GroupNorm is one example."""\n')
    (tmp_path / "other.py").write_text("x = 1\n")
    found = _mentions(FOOTPRINTS["GroupNorm"][0], tmp_path)
    assert found == {"shared.py": ['"""Shared code; GroupNorm is one example."""']}
