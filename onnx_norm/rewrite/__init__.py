"""Find decomposed LayerNorm/RMSNorm subgraphs and replace them with fused ops.

Data flows one way: load (model_io), match (match.py and the family recognisers in families/, skip.py), prove
(prove.py), rewrite (driver.py with the rules of rules.py and the targets' emitters, targets.py), save. `optimize`
does all of it; `inspect` is the same run on a copy, reporting what would be fused and why the near-misses were
not. `FuseNormsPass` is the same as an onnx-ir pass, for pipelines.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import TypeVar

import onnx
import onnx_ir as ir

from onnx_norm import model_io
from onnx_norm.rewrite.opset_pass import OpsetError
from onnx_norm.rewrite.passes import FuseNormsPass
from onnx_norm.rewrite.report import NearMissRecord, NormRecord, OptimizeReport
from onnx_norm.rewrite.rules import RULE_NAMES
from onnx_norm.rewrite.spec import NormSpec
from onnx_norm.rewrite.targets import TARGETS

__all__ = [
    "RULE_NAMES",
    "TARGETS",
    "FuseNormsPass",
    "NearMissRecord",
    "NormRecord",
    "NormSpec",
    "OpsetError",
    "OptimizeReport",
    "inspect",
    "optimize",
]

logger = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", str, onnx.ModelProto, ir.Model)


def optimize(
    model: ModelT,
    *,
    target: str = "onnx-norm",
    disable: Iterable[str] = (),
    take_over_native: bool = False,
    verify_rewrites: bool = True,
    opset: int | None = None,
) -> tuple[ModelT, OptimizeReport]:
    """Fuses the norms of `model`; returns the rewritten model, of the same kind, and a report.

    `model` is a path (the result is an `ir.Model` loaded from it; save it with `onnx_norm.model_io.save`; a
    `model_io.ModelFile` is taken as its path, without reading the file again), an `onnx.ModelProto` (a new
    ModelProto is returned, the argument is not modified) or an `onnx_ir.Model` (rewritten in place and returned).
    `disable` names rules to skip (`RULE_NAMES`); `verify_rewrites=False` skips the proof of each candidate (faster,
    not safer). `opset` first raises the model's default-domain opset to it with onnx's version converter (`--target
    onnx` writes ONNX's norm ops only from the opsets that define them, 17 to 23: docs/targets.md); never lowered: a
    model above it, or one the converter cannot convert, is an `OpsetError` (`report.opset_raised` says from which
    opset it was raised). Verify the result against the original model: that checks the conversion too.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    fuse = FuseNormsPass(
        target, disable=disable, take_over_native=take_over_native, verify_rewrites=verify_rewrites, opset=opset
    )
    ir_model = model_io.load(model)
    fuse(ir_model)
    return model_io.like(model, ir_model), fuse.report  # type: ignore[return-value]


def inspect(
    model: str | onnx.ModelProto | ir.Model,
    *,
    target: str = "onnx-norm",
    explain: bool | None = None,
    opset: int | None = None,
) -> OptimizeReport:
    """A dry run: what `optimize` would fuse, and every near-miss with its reason (`report.near_misses`);
    `opset` as `optimize`'s (the conversion is run on a copy).

    The model is not modified. `explain` is deprecated and has no effect: the near-misses are always in the
    report, and what to print is the caller's choice (the CLI prints them with `--explain`).
    """
    if explain is not None:
        warnings.warn(
            "inspect(explain=...) has no effect (the near-misses are always in the report) and will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
    fuse = FuseNormsPass(target, opset=opset)
    ir_model = model_io.load(model)
    if isinstance(model, ir.Model):
        ir_model = model_io.clone(ir_model)
    fuse(ir_model)
    report = fuse.report
    report.dry_run = True
    return report
