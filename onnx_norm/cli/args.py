"""Argument groups shared by the subcommands (Polygraphy-style): model inputs, runtime, tolerances, report."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from onnx_norm.cli import UsageError

#: Width of tables written to a file or a pipe (CI logs, README excerpts), where rich would assume 80 columns.
PIPE_WIDTH = 140


def console() -> Console:
    """Console for the CLI's tables: the terminal's width, or PIPE_WIDTH when not writing to a terminal."""
    out = Console()
    return out if out.is_terminal else Console(width=PIPE_WIDTH)


def add_input_args(parser: argparse.ArgumentParser, *, samples: bool = True) -> None:
    group = parser.add_argument_group("model inputs")
    group.add_argument(
        "--inputs",
        nargs="+",
        action="extend",
        default=[],
        metavar="FILE",
        help="input data instead of random inputs: each FILE.npz is one sample (keys are input names); "
        "NAME:FILE.npy files together make one sample (a bare FILE.npy for a single-input model)",
    )
    group.add_argument(
        "--shape",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME:DIMS",
        help="shape of an input (input_ids:1,128) or value of a symbolic dim (sequence:512) for generated inputs; "
        "unset dims default to 1 (batch) and 128 (others)",
    )
    if samples:
        group.add_argument("--samples", type=int, default=2, help="number of generated input samples (default: 2)")
    group.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default: 0)")


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("runtime")
    group.add_argument(
        "--provider",
        choices=("cpu", "cuda"),
        default="cpu",
        help="ONNX Runtime execution provider for both models (default: cpu); a CUDA run that ORT moved to the "
        "CPU is refused",
    )
    group.add_argument("--threads", type=int, default=None, help="intra-op threads (default: ONNX Runtime's choice)")
    group.add_argument("--device-id", type=int, default=0, help="CUDA device (default: 0)")


def add_timing_args(group: argparse._ActionsContainer, *, warmup: int, repeat: int) -> None:
    """The bench's rounds and sessions (`onnx-norm bench`, and the bench step of `onnx-norm demo`)."""
    group.add_argument(
        "--warmup", type=int, default=warmup, help=f"unrecorded rounds before timing (default: {warmup})"
    )
    group.add_argument("--repeat", type=int, default=repeat, help=f"timed rounds per variant (default: {repeat})")
    group.add_argument(
        "--sessions",
        type=int,
        default=3,
        metavar="N",
        help="sessions per variant, used in turn: averages out the few percent by which sessions of one model "
        "differ on a CPU (default: 3; 1 for models too large to hold three times)",
    )


def check_timing(args: argparse.Namespace) -> None:
    check_positive(args.warmup, "--warmup", zero_ok=True)
    check_positive(args.repeat, "--repeat")
    check_positive(args.sessions, "--sessions")
    check_positive(args.threads, "--threads")


def add_report_args(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--report", type=Path, metavar="PATH", help=f"write the {what} as JSON to PATH")


def shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    from onnx_norm.inputs import InputError, parse_shapes

    try:
        return parse_shapes(args.shape)
    except InputError as err:
        raise UsageError(str(err)) from None


def check_model_path(path: Path | str, what: str = "model") -> Path:
    """An input model must be a file (its content is checked when it is loaded)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory, not an ONNX model")
    if not path.is_file():
        raise UsageError(f"{what} not found: {path}")
    return path


def check_outputs(
    outputs: Sequence[tuple[str, Path | str | None]],
    inputs: Sequence[Path | str],
    *,
    force: bool = False,
    force_flag: str = "",
    files: Sequence[tuple[str, Path]] = (),
    input_data: Sequence[str] = (),
) -> None:
    """Before any work: every output file (`(flag, path)`, None when not asked) can be written, no two are one
    file, and none is a file an input model reads (the model or its external data) or an `--inputs` file
    (`NAME:FILE` or `FILE`) unless `force`. `files` are further files written beside an output (its external data),
    checked for clashes only."""
    from onnx_norm.paths import OutputError, check_outputs, check_writable_file

    given = [(flag, Path(path)) for flag, path in outputs if path is not None]
    data = [Path(item.partition(":")[2] if ":" in item and not Path(item).exists() else item) for item in input_data]
    try:
        for flag, path in given:
            check_writable_file(path, flag)
        check_outputs([*given, *files], [Path(p) for p in inputs], force=force, force_flag=force_flag, data=data)
    except OutputError as err:
        raise UsageError(str(err)) from None


def check_positive(value: int | None, flag: str, *, zero_ok: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not zero_ok):
        raise UsageError(f"{flag} must be {'>= 0' if zero_ok else '> 0'}, got {value}")


def per_output_values(values: Sequence[str] | None, flag: str, convert: Any = float) -> Any:
    """Parses Polygraphy-style `--atol 1e-3 logits:1e-2`: a bare value for all outputs, NAME:VALUE overrides.
    Returns None, a single value, or a mapping with "*" for the default."""
    if not values:
        return None
    mapping: dict[str, Any] = {}
    for item in values:
        name, sep, text = item.rpartition(":")
        key = name if sep else "*"
        try:
            mapping[key] = convert(text)
        except ValueError:
            raise UsageError(f"{flag} {item!r}: {text!r} is not a valid value") from None
    if set(mapping) == {"*"}:
        return mapping["*"]
    return mapping


def command_line(argv: Sequence[str] | None = None) -> str:
    return "onnx-norm " + shlex.join(sys.argv[1:] if argv is None else argv)


@contextlib.contextmanager
def input_errors() -> Iterator[None]:
    """Turns input and session errors of the library into UsageError (exit 2, one line, no traceback)."""
    from onnx_norm.inputs import InputError
    from onnx_norm.model_io import ModelLoadError, ModelSaveError
    from onnx_norm.paths import OutputError
    from onnx_norm.sessions import SessionError

    try:
        yield
    except (InputError, SessionError, ModelLoadError, ModelSaveError, OutputError) as err:
        raise UsageError(str(err)) from None
