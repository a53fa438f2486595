"""Hugging Face Optimum: optimize the models of an Optimum ONNX export folder, load them with our library.

An export folder (`optimum-cli export onnx --model ... DIR`, or `optimum.exporters.onnx.main_export`) holds one
or more ONNX models (`model.onnx`; `encoder_model.onnx`, `decoder_model.onnx`, ... for encoder-decoders) with their
external data, `config.json`, `generation_config.json` and the tokenizer files. `optimize_folder` writes a copy with
every model rewritten; `from_pretrained` loads it with any `ORTModel...` class, our library registered in the
session options Optimum passes to ONNX Runtime.

Nothing here imports Optimum except `from_pretrained`, so the folder rewrite works where Optimum is not installed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnx_norm.integrations.folder import inside_reason, write_rewritten_folder
from onnx_norm.rewrite import OptimizeReport

logger = logging.getLogger(__name__)


class ExportFolderError(ValueError):
    """The folder holds no ONNX model, or the output cannot be written; the message says why."""


def optimize_folder(source: str | os.PathLike, output: str | os.PathLike, **options: Any) -> dict[str, OptimizeReport]:
    """Writes `output` (a new directory): `source` with every `*.onnx` model in it optimized, the other files
    copied. Returns the report of each model, by file name. `options` are those of `onnx_norm.optimize` (target,
    disable, take_over_native, verify_rewrites), with its defaults."""
    from onnx_norm.rewrite import optimize

    source, output = Path(source), Path(output)
    if not source.is_dir():
        raise ExportFolderError(f"{source}: not a directory")
    models = sorted(source.glob("*.onnx"))
    if not models:
        raise ExportFolderError(f"{source}: no *.onnx model in the folder")
    if output.exists():
        raise ExportFolderError(f"output {output} exists; choose a new directory")
    reason = inside_reason(source, output)
    if reason is not None:
        raise ExportFolderError(reason)
    if not output.parent.is_dir():
        raise ExportFolderError(f"cannot write {output}: directory {output.parent} does not exist")
    reports: dict[str, OptimizeReport] = {}

    def rewrite(model: ir.Model, name: str) -> ir.Model:
        model, reports[name] = optimize(model, **options)
        return model

    write_rewritten_folder(source, output, [path.name for path in models], rewrite)
    return reports


def from_pretrained(model_class: type, folder: str | os.PathLike, **kwargs: Any) -> Any:
    """`model_class.from_pretrained(folder, ...)` (an `ORTModel...` class) with our library registered in the
    session options (given ones are extended, not replaced)."""
    from onnx_norm.library import session_options

    kwargs["session_options"] = session_options(kwargs.get("session_options"))
    return model_class.from_pretrained(folder, **kwargs)
