"""A model folder written with its models rewritten: the one writer behind `genai.optimize_folder` and
`optimum.optimize_folder`.

The new folder is staged in a temporary directory next to the output and moved into place only when complete, so a
failure (a model that does not load, a full disk, an interrupt) leaves no half-written output and no temporary
behind; an existing output is replaced only when asked and only at the end.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import onnx_ir as ir

if TYPE_CHECKING:
    from onnx_norm.model_io import ModelFile

#: Rewrites one model (loaded from the file named second) and returns the model to save in its place.
Rewrite = Callable[[ir.Model, str], ir.Model]
#: Writes further files into the staged folder (a config, a library) once the models are saved.
Finish = Callable[[Path], None]
#: Checks one rewritten model once it is saved: (its file name, the original as read, the staged copy) -> whether
#: it passed; the first that does not stops the writer, and no output is written.
Check = Callable[[str, "ModelFile", Path], bool]


def external_files(model: ir.Model) -> set[str]:
    """The external data files of a model's initializers (main graph and functions): the saved copy writes its own,
    so these are not copied."""
    graphs = [model.graph, *(function.graph for function in model.functions.values())]
    return {
        value.const_value.location
        for graph in graphs
        for value in graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor)
    }


def inside_reason(source: Path, output: Path) -> str | None:
    """Why `output` cannot be written from the folder `source`: it is the folder, or inside it (the copy of the
    folder's other entries would copy the output, and its staging folder, into itself, as deep as the disk lets
    it: a 13 GB model folder filled 60 GB before it failed); None when it can."""
    src, out = source.resolve(), output.resolve()
    if out == src:
        return f"output {output} is the input folder; write the optimized folder elsewhere"
    if out.is_relative_to(src):
        return f"output {output} is inside the input folder {source}; write the optimized folder outside it"
    return None


def write_rewritten_folder(
    source: Path,
    output: Path,
    models: Iterable[str],
    rewrite: Rewrite,
    *,
    finish: Finish | None = None,
    replace: bool = False,
    keep_links: bool = False,
    check: Check | None = None,
) -> bool:
    """Writes `output`: the folder `source` with each model file in `models` loaded, passed through `rewrite` and
    saved, then `finish(staging)` (files it writes are not copied from `source`), then every other file of `source`
    copied (subdirectories too; `keep_links` copies the links inside them as links). `replace` allows an existing
    `output`; callers check their own preconditions first. `check` sees each model right after it is saved, with
    the original as it was read for the rewrite (one model at a time, read once); returns False, writing nothing,
    when a check fails, else True."""
    from onnx_norm import model_io

    reason = inside_reason(source, output)
    if reason is not None:  # the callers say it first, in their own error type
        raise ValueError(reason)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        written: set[str] = set()
        for name in models:
            original = model_io.read_file(source / name)
            model = model_io.load(original)
            written |= {name, *external_files(model)}
            model_io.save(rewrite(model, name), staging / name, shown_as=output / name)
            del model  # the saved copy is what is checked
            if check is not None and not check(name, original, staging / name):
                shutil.rmtree(staging, ignore_errors=True)
                return False
        if finish is not None:
            finish(staging)
        _copy_the_rest(source, staging, written, keep_links=keep_links)
        # mkdtemp makes the staging folder private (0700); the output gets the input folder's permissions.
        staging.chmod(stat.S_IMODE(source.stat().st_mode))
        if replace and output.exists():
            shutil.rmtree(output)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return True


def _copy_the_rest(source: Path, staging: Path, skip: set[str], *, keep_links: bool) -> None:
    """Every entry of `source` that is neither in `skip` nor already written into `staging`."""
    for entry in source.iterdir():
        if entry.name in skip or (staging / entry.name).exists():
            continue
        if entry.is_dir():
            shutil.copytree(entry, staging / entry.name, symlinks=keep_links)
        else:
            shutil.copy2(entry, staging / entry.name)
