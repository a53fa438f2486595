"""The C++ op list against the Python op records: the table the built library registers (each op's own source file
defines its row, custom_ops/src/common/op_registry.h; register.cc registers them and describes them in
OnnxNormDescribeOps) must name the ops, domain, opset, inputs (and which are optional), outputs, attributes and
element types of onnx_norm/ops/schema.py, so that the two cannot drift."""

from __future__ import annotations

import ctypes
import dataclasses
import json
from typing import Any

import pytest

import onnx_norm
from onnx_norm.ops import schema


@pytest.fixture(scope="module")
def described() -> dict[str, Any]:
    library = ctypes.CDLL(onnx_norm.get_library_path())
    describe = library.OnnxNormDescribeOps
    describe.restype = ctypes.c_char_p
    return json.loads(describe())


def test_the_library_registers_exactly_the_python_ops(described: dict[str, Any]) -> None:
    assert described["domain"] == schema.DOMAIN
    assert described["opset"] == schema.OPSET_VERSION
    # In name order: the rows come from the ops' own files, whose link order nothing fixes.
    assert [op["name"] for op in described["ops"]] == sorted(schema.OPS)
    for op in described["ops"]:
        assert "CPUExecutionProvider" in op["providers"], op["name"]


@pytest.mark.parametrize("name", list(schema.OPS))
def test_each_op_has_the_python_signature(described: dict[str, Any], name: str) -> None:
    record = schema.OPS[name]
    op = next(op for op in described["ops"] if op["name"] == name)
    assert tuple(op["inputs"]) == record.inputs
    assert frozenset(op["optional_inputs"]) == record.optional_inputs
    assert tuple(op["outputs"]) == record.outputs
    assert tuple(op["attributes"]) == record.attribute_names


def test_attributes_and_element_types_are_the_python_ones(described: dict[str, Any]) -> None:
    assert described["attributes"] == [field.name for field in dataclasses.fields(schema.NormAttributes)]
    assert sorted(described["types"]) == sorted(schema.FLOAT_TYPES)
