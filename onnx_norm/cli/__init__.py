"""The `onnx-norm` command line: one module per subcommand, shared argument groups in `args.py`.

Exit codes (every subcommand): 0 success, 1 a check failed (parity, a missing fusion that was required),
2 usage or input error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Each module defines `add_parser(subparsers) -> argparse.ArgumentParser` and sets `func` on it
# with `parser.set_defaults(func=run)`; `run(args) -> int` returns the exit code.
_SUBCOMMANDS = ("inspect", "optimize", "verify", "bench", "demo")


class UsageError(Exception):
    """Bad arguments or unreadable input: reported on one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-norm", description="Fuse decomposed LayerNorm/RMSNorm subgraphs in ONNX models."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _SUBCOMMANDS:
        importlib.import_module(f"onnx_norm.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except UsageError as err:
        print(f"onnx-norm {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
