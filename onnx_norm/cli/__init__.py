"""The `onnx-norm` command line: one module per subcommand, shared argument groups in `args.py`.

Exit codes (every subcommand): 0 success, 1 a check failed (parity, a missing fusion that was required),
2 usage or input error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import NoReturn

# Each module defines `add_parser(subparsers) -> argparse.ArgumentParser` and sets `func` on it
# with `parser.set_defaults(func=run)`; `run(args) -> int` returns the exit code.
_SUBCOMMANDS = ("inspect", "optimize", "verify", "bench", "demo")


class UsageError(Exception):
    """Bad arguments or unreadable input: reported on one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error format: one line on stderr (argparse prints the usage first), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="onnx-norm", description="Fuse decomposed LayerNorm/RMSNorm subgraphs in ONNX models.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _SUBCOMMANDS:
        importlib.import_module(f"onnx_norm.cli.{name}").add_parser(subparsers)
    return parser


#: Library errors that mean bad input, a bad output path or a machine that cannot do what was asked: one line
#: and exit 2. (module, class) pairs, looked up only in modules already imported: an error of a module that was
#: never imported cannot have been raised.
_EXPECTED_ERRORS = (
    ("onnx_norm.inputs", "InputError"),
    ("onnx_norm.model_io", "ModelLoadError"),
    ("onnx_norm.model_io", "ModelSaveError"),
    ("onnx_norm.paths", "OutputError"),
    ("onnx_norm.sessions", "SessionError"),
)


def expected_error(err: BaseException) -> str | None:
    """The one-line message for an expected failure, None for a bug (which keeps its traceback)."""
    for module_name, class_name in _EXPECTED_ERRORS:
        module = sys.modules.get(module_name)
        if module is not None and isinstance(err, getattr(module, class_name)):
            return " ".join(str(err).split())
    if isinstance(err, MemoryError):
        return "out of memory; give smaller inputs with --shape"
    if isinstance(err, OSError):  # the disk filled up, a file vanished or became unreadable while we ran
        where = f"{err.filename}: " if err.filename else ""
        return f"{where}{err.strerror or err}"
    return None


def _configure_output(verbose: int) -> None:
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # numpy's RuntimeWarnings (overflow in an fp16 model, NaN in a comparison) are expected and handled: they go
    # to the log, shown with -v, instead of interleaving with the tables.
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.WARNING if verbose else logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_output(args.verbose)
    try:
        return int(args.func(args))
    except UsageError as err:
        message: str | None = str(err)
    except Exception as err:
        message = expected_error(err)
        if message is None:
            raise
    print(f"onnx-norm {args.command}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
