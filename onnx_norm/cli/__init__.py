"""The `onnx-norm` command line: one module per subcommand, shared argument groups in `args.py`.

Exit codes (every subcommand): 0 success, 1 a check failed (parity, a missing fusion that was required),
2 usage or input error, 128 + N stopped by signal N with one line on stderr and nothing written: 130 Ctrl-C
(SIGINT), 143 SIGTERM (CI runners cancelling a job, `timeout`), 129 SIGHUP (the terminal closed). The CLI turns
SIGTERM and SIGHUP into what Ctrl-C raises while a command runs (`main` only: importing the library installs no
handler); a signal ignored when the CLI started stays ignored (`nohup` ignores SIGHUP).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

# Each module defines `add_parser(subparsers) -> argparse.ArgumentParser` and sets `func` on it
# with `parser.set_defaults(func=run)`; `run(args) -> int` returns the exit code.
_SUBCOMMANDS = ("inspect", "optimize", "verify", "bench", "demo")


class UsageError(Exception):
    """Bad arguments or unreadable input: reported on one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error format: one line on stderr (argparse prints the usage first), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def versions() -> dict[str, str]:
    """onnx-norm's version and those of the runtime and libraries it ran with (for --version and the reports),
    read from the installed distributions: nothing is imported."""
    from importlib import metadata

    from onnx_norm import __version__

    found = {"onnx-norm": __version__}
    for names in (("onnxruntime-gpu", "onnxruntime"), ("onnx",), ("onnx-ir",)):
        for name in names:
            try:
                found[names[-1]] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def write_json_report(path: Any, data: dict[str, Any], models: dict[str, Any]) -> None:
    """Writes a `--report` file: `data` with a `run` section naming what it describes (the model files by role,
    the command line) and what produced it (onnx-norm, ONNX Runtime, onnx and onnx-ir versions)."""
    from onnx_norm.paths import write_json_atomic

    files = {role: None if path is None else str(path) for role, path in models.items()}
    run = {"models": files, "command": ["onnx-norm", *sys.argv[1:]], "versions": versions()}
    write_json_atomic(path, {**data, "run": run})


def _add_verbosity(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """-v/-q, accepted before and after the subcommand. On a subcommand they default to SUPPRESS, so that a flag
    given before the subcommand is not reset by the subcommand's parser."""
    default = 0 if top else argparse.SUPPRESS
    parser.add_argument("-v", "--verbose", action="count", default=default, help="more log output (-vv for debug)")
    parser.add_argument(
        "-q",
        "--quiet",
        action="count",
        default=default,
        help="errors only: no warnings, progress or tables; inspect still lists the norms, verify prints its "
        "PASSED/FAILED line, bench its measurements, optimize nothing unless --verify fails",
    )


def build_parser(commands: Iterable[str] = _SUBCOMMANDS) -> argparse.ArgumentParser:
    """The whole command line; only the subcommands in `commands` get their flags (building those of `inspect` and
    `optimize` imports the rewrite, for its rule and target names), the others just their name and help line."""
    parser = _Parser(prog="onnx-norm", description="Fuse decomposed LayerNorm/RMSNorm subgraphs in ONNX models.")
    text = ", ".join(f"{name} {version}" for name, version in versions().items())
    parser.add_argument("--version", action="version", version=text)
    _add_verbosity(parser, top=True)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _SUBCOMMANDS:
        module = importlib.import_module(f"onnx_norm.cli.{name}")
        if name in commands:
            _add_verbosity(module.add_parser(subparsers), top=False)
        else:
            subparsers.add_parser(name, help=module.HELP)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand a command line names: its first word that is not an option (the top-level options take no
    value), None for `--version`, `--help` or nothing."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


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


class _LogFormatter(logging.Formatter):
    """One line per record: an exception attached to a record (onnx_ir logs a failed shape inference with its
    traceback) is given as its type and first line; the traceback only with -vv."""

    def __init__(self, tracebacks: bool) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info and record.exc_info[1] is not None and not self.tracebacks:
            err = record.exc_info[1]
            first = (str(err).strip().splitlines() or [""])[0]
            record = logging.makeLogRecord(
                {**record.__dict__, "msg": f"{record.getMessage()} ({type(err).__name__}: {first})", "args": None}
            )
            record.exc_info, record.exc_text = None, None
        return super().format(record)


class _ThirdPartyFilter(logging.Filter):
    """Warnings of other libraries (and Python warnings) only with -v: they are handled or expected (numpy's
    overflow in an fp16 model, a shape inference that stops at a custom op) and would interleave with the tables."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name == "onnx_norm" or record.name.startswith("onnx_norm.")
        return ours or record.levelno >= self.level


def _configure_output(verbose: int, quiet: int = 0) -> None:
    level = logging.ERROR if quiet else {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    handler = logging.StreamHandler()
    handler.setFormatter(_LogFormatter(tracebacks=verbose >= 2))
    handler.addFilter(_ThirdPartyFilter(logging.ERROR if not verbose else logging.DEBUG))
    # A no-op where logging is already configured (an embedding program, pytest): theirs stays in charge.
    logging.basicConfig(level=level, handlers=[handler])
    # numpy's RuntimeWarnings (overflow in an fp16 model) are expected and handled: logged, shown with -v.
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.WARNING if verbose else logging.ERROR)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is as Ctrl-C raises KeyboardInterrupt: the same cleanup runs on
    the way out (staged outputs removed), and `main` reports it the same way, with the signal's name."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: Signals that stop a command as Ctrl-C does (those this platform has).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def _stop_signals() -> Iterator[None]:
    """Within the block, STOP_SIGNALS raise `Stopped`; the handlers before it are restored after. Only from the
    main thread (the only one Python lets install handlers), and not for a signal that is ignored (`nohup`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def stop(signum: int, frame: object) -> None:
        for number in previous:  # the cleanup on the way out is not cut short by a second signal
            signal.signal(number, signal.SIG_IGN)
        raise Stopped(signum)

    for number in STOP_SIGNALS:
        handler = signal.getsignal(number)
        if handler != signal.SIG_IGN:
            previous[number] = signal.SIG_DFL if handler is None else handler
            signal.signal(number, stop)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def main(argv: list[str] | None = None) -> int:
    try:
        with _stop_signals():
            return _main(argv)
    except Stopped as stopped:
        print(f"onnx-norm: stopped by {stopped}; nothing written", file=sys.stderr)
        return 128 + stopped.signum
    except KeyboardInterrupt:
        # Outputs are staged and moved into place only when complete: an interrupt leaves nothing behind.
        print("onnx-norm: interrupted; nothing written", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # Only the named subcommand's flags are built: `onnx-norm --version` or `verify` pays for no rewrite import.
    args = build_parser([_command(argv) or ""]).parse_args(argv)
    _configure_output(args.verbose, args.quiet)
    from onnx_norm.cli import progress

    progress.shown = not args.quiet
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
