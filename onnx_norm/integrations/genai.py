"""ONNX Runtime GenAI model folders: optimize every model a `genai_config.json` names, register our library.

A GenAI folder holds `genai_config.json`, the ONNX model(s) it names (`model.decoder.filename`, and for multimodal
models `model.embedding`, `model.vision`, ...), their external data, and the tokenizer files. `optimize_folder`
writes a new folder with the same files, each named model rewritten, and, where a rewritten model uses our ops,
`"custom_ops_library": "libonnx_norm_ops.so"` in that model's `session_options`: GenAI (checked with 0.18) registers a
library named there with the session. GenAI only loads such a library from inside the model folder, the working
directory or an execution provider's directory (it resolves the path and rejects anything else; an absolute path to
site-packages is refused with "custom_ops_library path is not within an allowed directory"), so the library is put
into the folder: hard-linked where the folder is on the same file system as the installed library (no copy), copied
where it is not. A symbolic link would resolve to site-packages and be rejected.

The models GenAI's model builder writes already carry `SimplifiedLayerNormalization` and
`SkipSimplifiedLayerNormalization`: it is `take_over_native` that moves them onto our kernels.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from onnx_norm.integrations.folder import inside_reason, write_rewritten_folder
from onnx_norm.ops.schema import DOMAIN
from onnx_norm.rewrite import OptimizeReport

if TYPE_CHECKING:
    import onnx

    from onnx_norm.model_io import ModelFile

logger = logging.getLogger(__name__)

CONFIG_NAME = "genai_config.json"
#: The session-options key GenAI reads the custom-op library from (src/config.cpp, `custom_ops_library`).
LIBRARY_KEY = "custom_ops_library"


class GenAIFolderError(ValueError):
    """The folder is not a GenAI model folder we can read, or the output cannot be written; the message says why."""


@dataclasses.dataclass
class FolderReport:
    """One report per rewritten model, by its section in genai_config.json (`decoder`, `vision`, ...)."""

    models: dict[str, OptimizeReport] = dataclasses.field(default_factory=dict)
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # section -> model file name
    library: str | None = None  # the library's file name in the folder, when placed there and registered
    library_linked: bool = False  # hard-linked to the installed library (else copied)
    failed_check: str | None = None  # the section whose check failed (`optimize_folder(check=)`): nothing written


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_NAME
    if not folder.is_dir():
        raise GenAIFolderError(f"{folder}: not a directory")
    if not path.is_file():
        raise GenAIFolderError(
            f"{folder}: is a directory with no {CONFIG_NAME}; not an ONNX Runtime GenAI model folder"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GenAIFolderError(f"{path}: not readable JSON ({err})") from err
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise GenAIFolderError(f"{path}: no 'model' section")
    return config


def _place_library(library: Path, target: Path) -> bool:
    """The library at `target`: a hard link (True) where the file system allows one, else a copy (False)."""
    try:
        os.link(library, target)
        return True
    except OSError:  # another file system, or links not allowed: the 50 MB copy it is
        shutil.copy2(library, target)
        return False


#: The symbolic dims of the model builder's decoders and the lengths `--verify` gives them unless told otherwise:
#: attention needs total = past + new tokens (GroupQueryAttention refuses anything else).
DECODER_LENGTHS = {"sequence_length": 8, "past_sequence_length": 16, "total_sequence_length": 24}


def verify_shapes(folder: str | os.PathLike, section: str, model: onnx.ModelProto | None = None) -> dict[str, int]:
    """Symbolic dims of a GenAI model that random inputs must get right, read from the folder: the decoder's
    lengths (DECODER_LENGTHS, consistent with each other) and the KV cache's head size (`kv_cache_dim` in the
    builder's models; `head_size` in genai_config.json). Only dims the model's inputs use are returned. `model` is
    the section's model when already read (else its file's structure is read)."""
    import onnx

    folder = Path(folder)
    config = _read_config(folder)
    settings = config["model"].get(section) or {}
    if not isinstance(settings.get("filename"), str):
        return {}
    if model is None:
        model = onnx.load(str(folder / settings["filename"]), load_external_data=False)
    found: dict[str, int] = {}
    past_key = str((settings.get("inputs") or {}).get("past_key_names", "past_key_values.%d.key")).replace("%d", "0")
    for value in model.graph.input:
        dims = [dim.dim_param for dim in value.type.tensor_type.shape.dim]
        found |= {dim: DECODER_LENGTHS[dim] for dim in dims if dim in DECODER_LENGTHS}
        head_size = settings.get("head_size")
        if value.name == past_key and len(dims) == 4 and dims[3] and isinstance(head_size, int):
            found[dims[3]] = head_size
    return found


def model_sections(config: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, section) of every section of `model` that names an ONNX file (`filename`)."""
    for name, section in config["model"].items():
        if isinstance(section, dict) and isinstance(section.get("filename"), str):
            yield name, section


def optimize_folder(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    overwrite: bool = False,
    check: Callable[[str, ModelFile, Path], bool] | None = None,
    **options: Any,
) -> FolderReport:
    """Writes the optimized copy of the GenAI folder `source` to `output` (a new directory; an existing one only
    with `overwrite`). Written next to `output` first and moved into place at the end. `options` are those of
    `onnx_norm.optimize` (target, disable, take_over_native, verify_rewrites), with its defaults. `check(section,
    original, staged)` sees each rewritten model once it is staged (the CLI's parity gate, with the original as the
    rewrite read it); the first that fails is `report.failed_check`, and nothing is written."""
    from onnx_norm.library import LIBRARY_NAME, get_library_path
    from onnx_norm.rewrite import optimize

    source, output = Path(source), Path(output)
    config = _read_config(source)
    reason = inside_reason(source, output)
    if reason is not None:
        raise GenAIFolderError(reason)
    if output.exists() and not overwrite:
        raise GenAIFolderError(f"output {output} exists; pass --force to replace it")
    if not output.parent.is_dir():
        raise GenAIFolderError(f"cannot write {output}: directory {output.parent} does not exist")
    sections = list(model_sections(config))
    if not sections:
        raise GenAIFolderError(f"{source / CONFIG_NAME}: names no ONNX model (no model.*.filename)")
    report = FolderReport()
    files = {section["filename"]: name for name, section in sections}

    def rewrite(model: ir.Model, file: str) -> ir.Model:
        name = files[file]
        model, report.models[name] = optimize(model, **options)
        report.files[name] = file
        if any(node.domain == DOMAIN for node in ir.traversal.RecursiveGraphIterator(model.graph)):
            config["model"][name].setdefault("session_options", {})[LIBRARY_KEY] = LIBRARY_NAME
            report.library = LIBRARY_NAME
        return model

    def finish(staging: Path) -> None:
        if report.library:
            report.library_linked = _place_library(get_library_path(), staging / LIBRARY_NAME)
        (staging / CONFIG_NAME).write_text(json.dumps(config, indent=4) + "\n")

    def checked(file: str, original: ModelFile, staged: Path) -> bool:
        if check is None or check(files[file], original, staged):
            return True
        report.failed_check = files[file]
        return False

    write_rewritten_folder(
        source, output, files, rewrite, finish=finish, replace=overwrite, keep_links=True, check=checked
    )
    return report
