"""Argument groups shared by the subcommands (Polygraphy's shape): model and output paths, model inputs, runtime,
tolerances, bench sessions; each owns its flags and their parsing into the API's run options (`onnx_norm.options`:
InputOptions, RuntimeOptions, CompareOptions, MeasureOptions), or keyword arguments where the API has no options
object (paths, target, report)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from onnx_norm import defaults
from onnx_norm.cli import UsageError

if TYPE_CHECKING:
    from onnx_norm.options import CompareOptions, InputOptions, MeasureOptions, RuntimeOptions

#: Width of tables written to a file or a pipe (CI logs, README excerpts), where rich would assume 80 columns.
PIPE_WIDTH = 140


def console(*, quiet: bool = False) -> Console:
    """Console for the CLI's tables: the terminal's width, or PIPE_WIDTH when not writing to a terminal; `quiet`
    (-q) prints nothing."""
    out = Console(quiet=quiet)
    return out if out.is_terminal else Console(width=PIPE_WIDTH, quiet=quiet)


class ArgGroup:
    """A group of flags that owns both its flags and their parsing (Polygraphy's shape): `add` registers the flags
    on a parser, `parse` turns the parsed flags into the options of the API call they configure (an options
    object, or keyword arguments), validated (UsageError, exit 2, before any work). Flag defaults are the API's
    defaults (`onnx_norm.defaults`), so that a command line without flags and a call without arguments do the same
    thing."""

    title = ""

    def add(self, parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
        group = parser.add_argument_group(self.title)
        self.add_flags(group)
        return group

    def add_flags(self, group: argparse._ArgumentGroup) -> None:
        raise NotImplementedError

    def parse(self, args: argparse.Namespace) -> Any:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Output:
    """An output file flag: `--report PATH` and its kind."""

    flag: str
    help: str
    metavar: str = "PATH"

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


class PathArgs(ArgGroup):
    """The model files a command reads (positional) and the files it writes (`--report`, ...): `parse` checks,
    before any work, that every model is a file and every output can be written without clobbering an input."""

    def __init__(self, models: Sequence[tuple[str, str]], outputs: Sequence[Output] = (), *, optional: str = ""):
        self.models = models  # (name, help); `optional` names the one that may be left out
        self.outputs = outputs
        self.optional = optional

    def add(self, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for name, help_text in self.models:
            parser.add_argument(name, nargs="?" if name == self.optional else None, help=help_text)
        for output in self.outputs:
            parser.add_argument(output.flag, type=Path, metavar=output.metavar, help=output.help)
        return parser

    def parse(self, args: argparse.Namespace) -> dict[str, Any]:
        """{name: Path or None} of every model and output, checked."""
        models = {name: getattr(args, name) for name, _ in self.models}
        for name, path in models.items():
            if path is not None:
                check_model_path(path, f"{name} model")
        outputs = {output.dest: getattr(args, output.dest) for output in self.outputs}
        given = [path for path in models.values() if path is not None]
        pairs = [(output.flag, outputs[output.dest]) for output in self.outputs]
        check_outputs(pairs, given, input_data=getattr(args, "inputs", ()))
        return {**{name: None if path is None else Path(path) for name, path in models.items()}, **outputs}


class InputArgs(ArgGroup):
    """Model inputs: data files or generated samples of given shapes -> InputOptions."""

    title = "model inputs"

    def __init__(self, *, samples: bool = True, shape_help: str | None = None) -> None:
        self.samples = samples
        self.shape_help = shape_help

    def add_flags(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--inputs",
            nargs="+",
            action="extend",
            default=[],
            metavar="FILE",
            help="input data instead of random inputs: each FILE.npz is one sample (keys are input names); "
            "NAME:FILE.npy files together make one sample (a bare FILE.npy for a single-input model)",
        )
        add_shape_flag(group, self.shape_help)
        group.add_argument(
            "--input",
            dest="input_values",  # `input` is optimize's model path
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="set one input in every sample (repeatable): a value (sr=16000, flag=true) or a comma list for a "
            "1-D input (ids=1,2,3); dtype from the model; with --inputs it replaces that input of each file",
        )
        if self.samples:
            group.add_argument(
                "--samples",
                type=int,
                default=defaults.SAMPLES,
                help=f"number of generated input samples (default: {defaults.SAMPLES})",
            )
        group.add_argument(
            "--seed", type=int, default=defaults.SEED, help=f"seed of the generated inputs (default: {defaults.SEED})"
        )

    def parse(self, args: argparse.Namespace) -> InputOptions:
        from onnx_norm.options import InputOptions

        samples = {"samples": args.samples} if self.samples else {}
        given = values(args) or None
        with input_errors():
            return InputOptions(list(args.inputs), shapes(args) or None, seed=args.seed, values=given, **samples)


def add_shape_flag(group: argparse._ActionsContainer, help_text: str | None = None) -> None:
    group.add_argument(
        "--shape",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME:DIMS",
        help=help_text
        or "shape of an input (input_ids:1,128) or value of a symbolic dim (sequence:512) for generated inputs; "
        "unset dims default to 1 (batch) and 128 (others)",
    )


class RuntimeArgs(ArgGroup):
    """Where the models run -> RuntimeOptions (provider, threads, device_id)."""

    title = "runtime"

    def add_flags(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--provider",
            choices=defaults.PROVIDERS,
            default=defaults.PROVIDER,
            help=f"ONNX Runtime execution provider for both models (default: {defaults.PROVIDER}); a CUDA run that "
            "ORT moved to the CPU is refused",
        )
        group.add_argument(
            "--threads", type=int, default=None, help="intra-op threads (default: ONNX Runtime's choice)"
        )
        group.add_argument(
            "--device-id", type=int, default=defaults.DEVICE_ID, help=f"CUDA device (default: {defaults.DEVICE_ID})"
        )

    def parse(self, args: argparse.Namespace) -> RuntimeOptions:
        from onnx_norm.options import RuntimeOptions

        check_positive(args.threads, "--threads")
        check_positive(args.device_id, "--device-id", zero_ok=True)
        return RuntimeOptions(args.provider, args.threads, args.device_id)

    @staticmethod
    def flags(args: argparse.Namespace) -> list[str]:
        """The flags that reproduce these settings on another subcommand's command line."""
        flags = ["--provider", args.provider]
        if args.threads is not None:
            flags += ["--threads", str(args.threads)]
        if args.provider == "cuda":
            flags += ["--device-id", str(args.device_id)]
        return flags


class CudaGraphArgs(ArgGroup):
    """ONNX Runtime's CUDA graphs -> {"cuda_graph": bool}, a MeasureOptions field (`onnx-norm bench`); needs
    RuntimeArgs' `--provider cuda`."""

    title = "CUDA graphs"

    def add_flags(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--cuda-graph",
            action="store_true",
            default=defaults.CUDA_GRAPH,
            help="run every session as a CUDA graph (ORT's enable_cuda_graph; needs --provider cuda): outputs bound "
            "to preallocated device memory, captured on the first runs, replayed when timed. If ORT cannot capture "
            "the original without optimizations, that variant is reported as 'CUDA graph not possible: ...' and the "
            "rest measured; if it cannot capture the original or the optimized model, exit 2 with ORT's reason",
        )

    def parse(self, args: argparse.Namespace) -> dict[str, Any]:
        if args.cuda_graph and args.provider != "cuda":
            raise UsageError(
                f"--cuda-graph needs --provider cuda (CUDA graphs are a CUDA feature), not {args.provider}"
            )
        return {"cuda_graph": args.cuda_graph}


class ToleranceArgs(ArgGroup):
    """How outputs are compared -> CompareOptions (verify(), and `optimize --verify`); the tolerances are checked by
    `parity.check_options` with the rest of verify()'s options."""

    title = "comparison"

    def add_flags(self, group: argparse._ArgumentGroup) -> None:
        add_tolerance_flags(group)
        group.add_argument(
            "--check-error-stat",
            nargs="+",
            metavar="[OUTPUT:]STAT",
            help=f"statistic compared with the tolerances: {', '.join(defaults.STATS)} (default: elementwise)",
        )
        group.add_argument(
            "--error-quantile",
            type=float,
            default=defaults.ERROR_QUANTILE,
            help="quantile for --check-error-stat quantile",
        )
        self._add_choices(group)

    @staticmethod
    def _add_choices(group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--golden",
            choices=defaults.GOLDEN_METHODS,
            default=defaults.GOLDEN,
            help="float64 evaluation of the original: an upcast copy in ONNX Runtime, onnx's ReferenceEvaluator, "
            "or none (default: auto, ORT then the reference evaluator)",
        )
        group.add_argument(
            "--original-opt-level",
            choices=defaults.OPT_LEVELS,
            default=defaults.ORIGINAL_OPTIMIZATION,
            help="ONNX Runtime graph optimizations for the original model (default: all, as users run it)",
        )
        group.add_argument(
            "--allow-nonfinite",
            action="store_true",
            help="pass an output that is NaN/Inf everywhere in both models, or NaN/Inf where the other model is finite "
            "(by default both fail; the report names the rows)",
        )
        group.add_argument(
            "--segments",
            default="auto",
            metavar="auto|N|off",
            help="run the models segment by segment, one segment's weights at a time: auto (default) when the "
            "whole models would not fit the memory available, N segments, or off",
        )
        group.add_argument(
            "--per-node",
            action="store_true",
            help="also compare every fused norm with the subgraph it replaced, to name the norm that diverged",
        )

    def parse(self, args: argparse.Namespace) -> CompareOptions:
        from onnx_norm.options import CompareOptions

        with input_errors():
            return CompareOptions(
                atol=per_output_values(args.atol, "--atol"),
                rtol=per_output_values(args.rtol, "--rtol"),
                check_error_stat=per_output_values(args.check_error_stat, "--check-error-stat", str),
                error_quantile=args.error_quantile,
                golden=args.golden,
                original_optimization=args.original_opt_level,
                allow_nonfinite=args.allow_nonfinite,
                per_node=args.per_node,
                segments=_segments(args.segments),
            )


def add_tolerance_flags(group: argparse._ActionsContainer, note: str = "") -> None:
    """`--atol` and `--rtol` (verify's, and bench's parity check's: `note` says what they are there)."""
    per_output = "[OUTPUT:]VALUE"
    group.add_argument(
        "--atol",
        nargs="+",
        metavar=per_output,
        help=f"absolute tolerance{note}, for all outputs or per output (default by dtype: fp32 1e-4, fp16 1e-2, "
        "bf16 5e-2)",
    )
    group.add_argument("--rtol", nargs="+", metavar=per_output, help=f"relative tolerance{note} (defaults as --atol)")


def _segments(text: str) -> int | str:
    """--segments: auto, off, or a count (validated by CompareOptions)."""
    if text in ("auto", "off"):
        return text
    try:
        return int(text)
    except ValueError:
        from onnx_norm.errors import InputError

        raise InputError(f"--segments {text!r}: expected auto, off or a number of segments") from None


class TargetArgs(ArgGroup):
    """What a rewrite emits -> target and opset (`inspect`, `optimize`): the choices are the rewrite's registry
    (`onnx_norm.rewrite.TARGETS`), the default `defaults.TARGET` (`optimize()`'s, tests/cli/test_cli_args.py checks);
    `--opset N` raises the model's default opset to N before the rewrite (`optimize(opset=N)`)."""

    def __init__(self, help_text: str) -> None:
        self.help_text = help_text

    def add(self, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        from onnx_norm.rewrite import TARGETS, targets

        default = defaults.TARGET
        described = "; ".join(f"{name}: {targets.get(name).help}" for name in TARGETS)
        parser.add_argument(
            "--target", choices=TARGETS, default=default, help=f"{self.help_text} (default: {default}). {described}"
        )
        parser.add_argument(
            "--opset",
            type=opset_number,
            default=None,
            metavar="N",
            help="first raise the model's default opset to N with onnx's version converter (never lowered): "
            "--target onnx writes ONNX's norm ops only from the opsets that define them (17 to 23, docs/targets.md); "
            "--verify then checks the result against the unconverted model",
        )
        return parser

    def parse(self, args: argparse.Namespace) -> dict[str, Any]:
        return {"target": args.target, "opset": args.opset}


def opset_number(text: str) -> int:
    """`--opset N`: an integer the installed onnx knows (`opset_pass.check_opset`), else argparse's one line."""
    from onnx_norm.rewrite.opset_pass import check_opset

    try:
        return check_opset(int(text))
    except ValueError as err:
        message = str(err) if text.strip().lstrip("+-").isdigit() else f"not an opset number: {text!r}"
        raise argparse.ArgumentTypeError(message) from None


class RewriteReportArgs(ArgGroup):
    """What a rewrite reports -> explain (`inspect`), and the report file (`inspect`, `optimize`)."""

    def add(self, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--explain", action="store_true", help="also list near-misses with the reason for each")
        parser.add_argument("--report", type=Path, metavar="PATH", help="write the report as JSON to PATH")
        return parser

    def parse(self, args: argparse.Namespace) -> dict[str, Any]:
        return {"explain": args.explain}


class BenchSessionArgs(ArgGroup):
    """The bench's rounds and sessions -> MeasureOptions (`onnx-norm bench`, and the bench step of `onnx-norm demo`,
    which times millisecond models and so takes more rounds by default). With `variants`, also what is measured:
    `--sweep`, `--no-noopt`, `--profile` (bench's own flags; the demo runs bench's command line)."""

    title = "measurement"

    def __init__(
        self,
        *,
        title: str = "measurement",
        warmup: int = defaults.WARMUP,
        repeat: int = defaults.REPEAT,
        variants: bool = False,
    ):
        self.title = title
        self.warmup = warmup
        self.repeat = repeat
        self.variants = variants

    def add_flags(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--warmup", type=int, default=self.warmup, help=f"unrecorded rounds before timing (default: {self.warmup})"
        )
        group.add_argument(
            "--repeat", type=int, default=self.repeat, help=f"timed rounds per variant (default: {self.repeat})"
        )
        sessions = defaults.SESSIONS_PER_VARIANT
        group.add_argument(
            "--sessions",
            type=int,
            default=sessions,
            metavar="N",
            help="sessions per variant, used in turn: averages out the few percent by which sessions of one model "
            f"differ on a CPU (default: {sessions}; 1 for models too large to hold {sessions} times)",
        )
        if self.variants:
            self._add_variant_flags(group)

    @staticmethod
    def _add_variant_flags(group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--sweep",
            metavar="DIM:V1,V2,...",
            help="one measurement per value of a symbolic dim, e.g. sequence:64,128,256,512 (plotted by --plot)",
        )
        group.add_argument("--no-noopt", action="store_true", help="skip the original with ORT optimizations off")
        group.add_argument(
            "--profile", action="store_true", help="split kernel time into norm nodes and the rest with ORT's profiler"
        )

    def parse(self, args: argparse.Namespace) -> MeasureOptions:
        from onnx_norm.options import MeasureOptions

        check_positive(args.warmup, "--warmup", zero_ok=True)
        check_positive(args.repeat, "--repeat")
        check_positive(args.sessions, "--sessions")
        variants = {}
        if self.variants:
            variants = {"sweep": parse_sweep(args.sweep), "include_unoptimized": not args.no_noopt}
            variants["profile"] = args.profile
        with input_errors():
            return MeasureOptions(args.warmup, args.repeat, args.sessions, **variants)


def parse_sweep(text: str | None) -> tuple[str, list[int]] | None:
    """`--sweep DIM:V1,V2,...` -> (dim, values)."""
    if not text:
        return None
    match = re.fullmatch(r"([^:]+):([0-9,\s]+)", text)
    if match is None:
        raise UsageError(f"--sweep {text!r}: expected DIM:V1,V2,... (for example sequence:64,128,256)")
    values = [int(v) for v in match.group(2).split(",") if v.strip()]
    if not values or any(v <= 0 for v in values):
        raise UsageError(f"--sweep {text!r}: values must be positive integers")
    return match.group(1), values


def shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    from onnx_norm.inputs import InputError, parse_shapes

    try:
        return parse_shapes(args.shape)
    except InputError as err:
        raise UsageError(str(err)) from None


def values(args: argparse.Namespace) -> dict[str, Any]:
    """The `--input NAME=VALUE` items, parsed (UsageError for a malformed one)."""
    from onnx_norm.input_values import parse_values
    from onnx_norm.inputs import InputError

    try:
        return dict(parse_values(getattr(args, "input_values", None) or ()))
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
