"""Files a command writes: checks of output paths, atomic text and JSON writes.

A model is more than its `.onnx` file: its weights may live in external data files named inside it
(`model_io.model_files`). The CLI checks every path it will write before doing any work, and refuses to write over
any file an input model reads (the model or one of its data files) unless forced, so that no run can destroy the
model it was given.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from onnx_norm.model_io import model_files


class OutputError(ValueError):
    """An output path that cannot or must not be written: reported before any work is done."""


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same resolved path, or hard links to one inode."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_writable_file(path: str | os.PathLike, what: str) -> Path:
    """Raises OutputError unless a file can be created or replaced at `path`: its directory exists and is
    writable, and `path` is not a directory. Probes by creating (and removing) a temporary file, because
    permission bits do not tell (a read-only mount, or root)."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a directory; give a file path")
    directory = path.parent
    if not directory.exists():
        raise OutputError(f"cannot write {what} {path}: directory {directory} does not exist")
    if not directory.is_dir():
        raise OutputError(f"cannot write {what} {path}: {directory} is not a directory")
    _probe(directory, f"cannot write {what} {path}")
    return path


def check_writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Raises OutputError unless `path` is a writable directory or can be created as one."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path} is a file, not a directory")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"cannot create {what} {path}: {existing} is not a directory")
    _probe(existing, f"cannot write {what} {path}")
    return path


def _probe(directory: Path, message: str) -> None:
    try:
        handle, name = tempfile.mkstemp(prefix=".onnx-norm-probe-", dir=directory)
    except OSError as err:
        raise OutputError(f"{message}: {err.strerror or err}") from None
    os.close(handle)
    with contextlib.suppress(OSError):
        os.unlink(name)


def check_outputs(
    outputs: Iterable[tuple[str, Path]],
    inputs: Iterable[Path],
    *,
    force: bool = False,
    force_flag: str = "--force",
    data: Iterable[Path] = (),
) -> None:
    """Raises OutputError when two outputs are one file, or an output is a file an input model reads (the model or
    one of its external data files) or an input data file (`data`), and `force` is not set. `outputs` are
    (what, path) pairs."""
    outputs = list(outputs)
    read = [(model, file) for model in inputs for file in model_files(model)]
    read += [(None, Path(file)) for file in data]
    for index, (what, path) in enumerate(outputs):
        for other_what, other in outputs[:index]:
            if same_file(path, other):
                raise OutputError(f"{what} and {other_what} are the same file {path}")
        if force:
            continue
        for model, file in read:
            if same_file(path, file):
                if model is None:
                    whose = "an input data file"
                else:
                    whose = "the input model" if file == model else f"the external data file of {model}"
                hint = f"; pass {force_flag} to overwrite it" if force_flag else ""
                raise OutputError(f"{what} {path} is {whose}{hint}")


@contextlib.contextmanager
def staged_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path next to `path` (same suffix, so writers that go by it pick the same format) and,
    when the block succeeds, renames it into place: a reader never sees half a file, and a failed write leaves
    the old file as it was and no temporary behind (its OSError names `path`)."""
    path = Path(path)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent or Path("."))
    os.close(handle)
    staged = Path(name)
    try:
        yield staged
        os.chmod(staged, _file_mode(path))
        os.replace(staged, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        if isinstance(err, OSError):  # a write into `staged` names it, or no file: the user knows `path`
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to a temporary file next to `path` and renames it into place (see staged_file)."""
    with staged_file(path) as staged:
        staged.write_text(text)


def _file_mode(path: Path) -> int:
    """The mode a new file gets (mkstemp makes it private): the replaced file's, else the umask's default."""
    with contextlib.suppress(OSError):
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def json_safe(value: Any) -> Any:
    """`value` with what JSON cannot hold made writable: NaN/Inf as the strings "nan"/"inf" (JSON has no
    Infinity/NaN), numpy scalars as Python numbers, tuples as lists."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Writes `data` (made JSON-safe) as indented JSON, atomically (see write_text_atomic)."""
    write_text_atomic(path, json.dumps(json_safe(data), indent=2) + "\n")
