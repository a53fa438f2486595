"""Fused norms at export time (onnx_norm.integrations.torch_export): the dynamo translation table and the
TorchScript symbolics give, op for op, what `optimize` makes of the plain export, and run like the torch module."""

from __future__ import annotations

import collections
import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from onnx_norm.library import library_available, session_options
from onnx_norm.ops.schema import DOMAIN, NormAttributes
from onnx_norm.rewrite import optimize

torch = pytest.importorskip("torch")
from onnx_norm.integrations import torch_export  # noqa: E402

HIDDEN = 16


class Block(torch.nn.Module):
    """Pre-norm residual block: norm(x) without a residual, then two residual Adds each feeding a norm, one
    of them also read afterwards (the Skip op's Sum output), and a broadcasting Add that must not be folded."""

    def __init__(self, norm: type) -> None:
        super().__init__()
        self.n1, self.n2, self.n3, self.n4 = (norm(HIDDEN, eps=1e-6) for _ in range(4))
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        with torch.no_grad():
            for n in (self.n1, self.n2, self.n3, self.n4):
                n.weight.uniform_(0.5, 1.5)
                if getattr(n, "bias", None) is not None:
                    n.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        h = x + self.proj(self.n1(x))
        h = h + self.proj(self.n2(h))
        y = self.n3(h)
        # A residual of another shape (broadcast over the rows) is no Skip op's input.
        return self.n4(y + self.proj(y).mean(1, keepdim=True)), h


def _block(norm: type) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Block(norm).eval(), torch.randn(2, 5, HIDDEN)


def _our_nodes(model: ir.Model) -> list[tuple[str, int, dict]]:
    """Our nodes in graph order: op, number of inputs and outputs, attributes with defaults filled in (float32)."""
    defaults = NormAttributes().as_dict()
    nodes = []
    for node in model.graph:
        if node.domain != DOMAIN:
            continue
        attrs = {**defaults, **{k: a.value for k, a in node.attributes.items()}}
        attrs["epsilon"] = float(np.float32(attrs["epsilon"]))
        nodes.append((node.op_type, len(node.inputs), len(node.outputs), attrs))
    return nodes


def _op_counts(model: ir.Model) -> collections.Counter:
    return collections.Counter((node.domain, node.op_type) for node in model.graph)


def _run(model: ir.Model | onnx.ModelProto, x: torch.Tensor, *, library: bool) -> list[np.ndarray]:
    proto = ir.serde.serialize_model(model) if isinstance(model, ir.Model) else model
    options = session_options() if library else ort.SessionOptions()
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})


def _assert_runs_like_torch(model: ir.Model, module: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        expected = [t.numpy() for t in module(x)]
    # With the library: our kernels; without it: the model-local function bodies.
    for library in (True, False) if library_available() else (False,):
        for got, want in zip(_run(model, x, library=library), expected, strict=True):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def _dynamo(module: torch.nn.Module, x: torch.Tensor, **kwargs) -> ir.Model:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(module, (x,), dynamo=True, verbose=False, **kwargs).model


def _torchscript(module: torch.nn.Module, x: torch.Tensor, path: Path, opset: int) -> ir.Model:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=opset, input_names=["x"])
    return ir.serde.deserialize_model(onnx.load(str(path)))


def test_dynamo_rms_norm_equals_optimized_plain_export(tmp_path: Path) -> None:
    module, x = _block(torch.nn.RMSNorm)
    expected, _ = optimize(_dynamo(module, x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch_export.export(module, (x,), tmp_path / "model.onnx")
    assert _our_nodes(got) == _our_nodes(expected)
    assert _op_counts(got) == _op_counts(expected)
    ops = [op for op, *_ in _our_nodes(got)]
    # norm(x); two residual Adds folded, both sums kept as Sum outputs (read by the next residual Add and by the
    # second graph output); the broadcasting Add not folded.
    assert ops == ["RMSNorm", "SkipRMSNorm", "SkipRMSNorm", "RMSNorm"]
    assert [n_outputs for _, _, n_outputs, _ in _our_nodes(got)] == [1, 2, 2, 1]
    assert not any(node.domain == DOMAIN for f in got.functions.values() for node in f.graph)
    assert {f.name for f in got.functions.values()} == {"RMSNorm", "SkipRMSNorm"}
    _assert_runs_like_torch(ir.serde.deserialize_model(onnx.load(str(tmp_path / "model.onnx"))), module, x)


def test_torchscript_layer_norm_equals_optimized_plain_export(tmp_path: Path) -> None:
    # Opset 14: the plain TorchScript export writes LayerNorm decomposed, which `optimize` fuses (with residuals).
    module, x = _block(torch.nn.LayerNorm)
    expected, _ = optimize(_torchscript(module, x, tmp_path / "plain.onnx", 14))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch_export.export(module, (x,), tmp_path / "model.onnx", dynamo=False, opset_version=14)
    assert _our_nodes(got) == _our_nodes(expected)
    assert _op_counts(got) == _op_counts(expected)
    assert [op for op, *_ in _our_nodes(got)] == ["LayerNorm", "SkipLayerNorm", "SkipLayerNorm", "LayerNorm"]
    _assert_runs_like_torch(got, module, x)


def test_dynamo_layer_norm_equals_the_torchscript_route(tmp_path: Path) -> None:
    # The plain dynamo export writes native LayerNormalization (nothing for `optimize` to fuse without
    # --take-over-native, which does not fold residual Adds into it): the translation gives the same norms as
    # `optimize` on the decomposed TorchScript export instead.
    module, x = _block(torch.nn.LayerNorm)
    expected, _ = optimize(_torchscript(module, x, tmp_path / "plain.onnx", 14))
    program = torch.onnx.export(
        module, (x,), dynamo=True, verbose=False, custom_translation_table=torch_export.translation_table()
    )
    assert [op for op, *_ in _our_nodes(program.model)] == ["LayerNorm", "LayerNorm", "LayerNorm", "LayerNorm"]
    torch_export.finalize(program)
    assert _our_nodes(program.model) == _our_nodes(expected)
    _assert_runs_like_torch(program.model, module, x)


def test_torchscript_exports_rms_norm_below_opset_23(tmp_path: Path) -> None:
    module, x = _block(torch.nn.RMSNorm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # torch 2.13 has a symbolic for opset 23 only; below, its lookup fails with "min() arg is an empty sequence".
        with pytest.raises(ValueError, match="empty sequence"):
            torch.onnx.export(module, (x,), str(tmp_path / "plain.onnx"), dynamo=False, opset_version=17)
        got = torch_export.export(module, (x,), tmp_path / "model.onnx", dynamo=False, opset_version=17)
    expected, _ = optimize(_dynamo(module, x))
    assert _our_nodes(got) == _our_nodes(expected)
    _assert_runs_like_torch(got, module, x)


def test_symbolics_are_unregistered_after_export(tmp_path: Path) -> None:
    module, x = _block(torch.nn.RMSNorm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_export.export(module, (x,), tmp_path / "model.onnx", dynamo=False, opset_version=17)
        with pytest.raises(ValueError, match="empty sequence"):
            torch.onnx.export(module, (x,), str(tmp_path / "plain.onnx"), dynamo=False, opset_version=17)


def test_export_without_any_norm_says_why(tmp_path: Path, caplog) -> None:
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    with caplog.at_level(logging.INFO, logger="onnx_norm.integrations.torch_export"):
        torch_export.export(module, (torch.randn(2, 8),), tmp_path / "plain.onnx")
    ours = [r for r in caplog.records if r.name == "onnx_norm.integrations.torch_export"]
    warnings = [r.getMessage() for r in ours if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("no norm fused: the model has no aten.rms_norm")
