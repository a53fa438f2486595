"""The run options of `verify()` and `bench()`, one typed object per concern, built once (from keyword arguments or
from the CLI's flag groups, `onnx_norm.cli.args`) and passed down whole instead of a list of parameters.

- `InputOptions`: the inputs (data files, shapes, samples, seed, values set outright);
- `RuntimeOptions`: where the models run (provider, threads, CUDA device);
- `CompareOptions`: how outputs are compared (tolerances, statistic, float64 golden, ORT optimization levels);
- `MeasureOptions`: how the bench times (rounds, sessions, sweep, profile, CUDA graphs);
- `ParityCheckOptions`: the bench's check that both models compute the same thing, before it times them;
- `VerifyOptions` and `BenchOptions` group them for one call.

Every group validates its values when it is made (InputError naming the option, as the CLI's exit 2 line says
it); tolerances are validated by `onnx_norm.parity.ToleranceSpec`. Defaults are `onnx_norm.defaults`'.

`verify()` and `bench()` still take the options as keyword arguments (`verify(a, b, samples=3, atol=1e-3)`): the
names are the fields of the groups, `VerifyKwargs`/`BenchKwargs` type them, and `VerifyOptions.build` turns them
into the object (on top of a given one, so `verify(a, b, options, per_node=False)` overrides one field).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypedDict, TypeVar

from onnx_norm import defaults
from onnx_norm.defaults import GOLDEN_METHODS, OPT_LEVELS, PROVIDERS, GoldenMethod, OptLevel, Provider, Stat
from onnx_norm.errors import InputError

__all__ = ["BenchKwargs", "BenchOptions", "CompareOptions", "InputOptions", "MeasureOptions", "RuntimeOptions"]
__all__ += ["ParityCheckOptions", "VerifyKwargs", "VerifyOptions"]

PerOutput = float | Mapping[str, float] | None
Shapes = Mapping[str, int | Sequence[int]]
#: Inputs set outright: one value (a scalar input, or every element of a larger one) or a 1-D list, by input name.
Values = Mapping[str, int | float | bool | Sequence[int | float | bool]]


def _check_count(value: Any, name: str, *, minimum: int) -> None:
    """An integer option (numpy's integers too, an option read from an array) of at least `minimum`."""
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if isinstance(value, bool) or number is None or number < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise InputError(f"{name} {value!r} is not one of {', '.join(choices)}")


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """The inputs a run generates or reads: `input_files` (each .npz one sample, or NAME:FILE.npy files together),
    `shapes` (an input's dims or a symbolic dim's value, `{"sequence": 8}`), `samples` and their `seed`, and
    `values`: inputs set outright in every sample, generated or read (`{"sr": 16000}`, `{"ids": [1, 2, 3]}`; the
    CLI's `--input NAME=VALUE`), their dtype the model's. The shapes and values are kept normalised
    (`{"sequence": (8,)}`, `{"ids": (1, 2, 3)}`); values are checked against the model when it is run."""

    input_files: Sequence[str | Path] = ()
    shapes: Shapes | None = None
    samples: int = defaults.SAMPLES
    seed: int = defaults.SEED
    values: Values | None = None

    def __post_init__(self) -> None:
        from onnx_norm.input_values import normalize_values
        from onnx_norm.inputs import normalize_shapes

        if isinstance(self.input_files, (str, Path)):
            raise InputError("input_files must be a list of paths, not one path")
        _check_count(self.samples, "samples", minimum=1)
        _check_count(self.seed, "seed", minimum=0)
        object.__setattr__(self, "input_files", tuple(self.input_files))
        object.__setattr__(self, "shapes", normalize_shapes(self.shapes))
        object.__setattr__(self, "values", normalize_values(self.values))

    @property
    def generated(self) -> bool:
        """Whether the inputs are generated (no data files): a failed run then hints at `--shape` and `--input`."""
        return not self.input_files


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    """Where both models run: ONNX Runtime's execution `provider`, intra-op `threads` (None: ORT's choice) and
    the CUDA `device_id`."""

    provider: Provider = defaults.PROVIDER
    threads: int | None = None
    device_id: int = defaults.DEVICE_ID

    def __post_init__(self) -> None:
        if self.threads is not None:
            _check_count(self.threads, "threads", minimum=1)
        _check_count(self.device_id, "device_id", minimum=0)
        _check_choice("provider", self.provider, PROVIDERS)


@dataclasses.dataclass(frozen=True)
class CompareOptions:
    """How the parity gate compares outputs (the docstring of onnx_norm.parity): tolerances (one value or
    {output: value}, "*" for the rest), the statistic compared, the float64 `golden` method, ORT's optimization
    levels for each model, whether all-NaN/Inf outputs pass, `per_node` (compare every fused norm too) and
    `segments`: "auto" (segment by segment when the whole models would not fit the memory available), "off", or
    how many segments (onnx_norm/parity/segments.py)."""

    atol: PerOutput = None
    rtol: PerOutput = None
    check_error_stat: Stat | Mapping[str, Stat] | None = None
    error_quantile: float = defaults.ERROR_QUANTILE
    golden: GoldenMethod = defaults.GOLDEN
    original_optimization: OptLevel = defaults.ORIGINAL_OPTIMIZATION
    optimized_optimization: OptLevel = "all"
    per_node: bool = False
    allow_nonfinite: bool = False
    segments: int | str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.segments, str):
            _check_choice("segments", self.segments, ("auto", "off"))
        else:
            _check_count(self.segments, "segments", minimum=1)
        _check_choice("golden", self.golden, GOLDEN_METHODS)
        _check_choice("original_optimization", self.original_optimization, OPT_LEVELS)
        _check_choice("optimized_optimization", self.optimized_optimization, OPT_LEVELS)


@dataclasses.dataclass(frozen=True)
class MeasureOptions:
    """How the bench times: `warmup` unrecorded and `repeat` timed rounds, `sessions_per_variant` used in turn,
    an optional `sweep` (a symbolic dim and its values, one point each), the original without ORT optimizations
    (`include_unoptimized`), ORT's profiler (`profile`) and CUDA graphs (`cuda_graph`, CUDA provider only)."""

    warmup: int = defaults.WARMUP
    repeat: int = defaults.REPEAT
    sessions_per_variant: int = defaults.SESSIONS_PER_VARIANT
    sweep: tuple[str, Sequence[int]] | None = None
    include_unoptimized: bool = True
    profile: bool = False
    cuda_graph: bool = defaults.CUDA_GRAPH

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeat < 1:
            raise InputError(f"need --warmup >= 0 and --repeat >= 1, got {self.warmup} and {self.repeat}")
        if self.sessions_per_variant < 1:
            raise InputError(f"need --sessions >= 1, got {self.sessions_per_variant}")


@dataclasses.dataclass(frozen=True)
class ParityCheckOptions:
    """bench's check, before timing, that the optimized model computes what the original does
    (`onnx_norm.bench_check`): on unless `parity_check` is False; `atol`/`rtol` (one value or {output: value}, "*"
    for the rest) replace its tolerance for the outputs they name (validated by `onnx_norm.parity.ToleranceSpec`)."""

    parity_check: bool = True
    atol: PerOutput = None
    rtol: PerOutput = None

    def __post_init__(self) -> None:
        if not self.parity_check and (self.atol is not None or self.rtol is not None):
            raise InputError(
                "--atol/--rtol (atol, rtol) are the parity check's tolerances, which --no-parity-check "
                "(parity_check=False) skips"
            )


_Options = TypeVar("_Options", bound="_Grouped")


class _Grouped:
    """Options made of groups, each a dataclass field; builds itself from the groups' field names, flat."""

    #: The keyword names the call takes (its TypedDict's keys): a group's field outside them is not an option of it.
    kwargs_names: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def _group_of(cls) -> dict[str, str]:
        """{flat option name: the group field that holds it}."""
        owners = {}
        for group in dataclasses.fields(cls):  # type: ignore[arg-type]
            for field in dataclasses.fields(group.default_factory()):  # type: ignore[misc]
                if field.name in cls.kwargs_names:
                    owners[field.name] = group.name
        return owners

    @classmethod
    def build(cls: type[_Options], options: _Options | None = None, call: str = "", /, **kwargs: Any) -> _Options:
        """`options` (the defaults when None) with the flat keyword options in `kwargs` applied; TypeError for a
        name that is not an option of `call` (as Python says for an unknown keyword argument)."""
        base = options if options is not None else cls()
        owners = cls._group_of()
        changes: dict[str, dict[str, Any]] = {}
        for name, value in kwargs.items():
            if name not in owners:
                raise TypeError(f"{call or cls.__name__}() got an unexpected keyword argument {name!r}")
            changes.setdefault(owners[name], {})[name] = value
        replaced = {group: dataclasses.replace(getattr(base, group), **values) for group, values in changes.items()}
        return dataclasses.replace(base, **replaced) if replaced else base  # type: ignore[type-var]

    def flat(self) -> dict[str, Any]:
        """The options as keyword arguments of the call (the inverse of `build`)."""
        owners = self._group_of()
        return {name: getattr(getattr(self, group), name) for name, group in owners.items()}


class VerifyKwargs(TypedDict, total=False):
    """verify()'s options as keyword arguments (the fields of VerifyOptions' groups)."""

    input_files: Sequence[str | Path]
    shapes: Shapes | None
    values: Values | None
    samples: int
    seed: int
    provider: Provider
    threads: int | None
    device_id: int
    atol: PerOutput
    rtol: PerOutput
    check_error_stat: Stat | Mapping[str, Stat] | None
    error_quantile: float
    golden: GoldenMethod
    original_optimization: OptLevel
    optimized_optimization: OptLevel
    per_node: bool
    allow_nonfinite: bool
    segments: int | str


class BenchKwargs(TypedDict, total=False):
    """bench()'s options as keyword arguments (the fields of BenchOptions' groups)."""

    input_files: Sequence[str | Path]
    shapes: Shapes | None
    values: Values | None
    seed: int
    provider: Provider
    threads: int | None
    device_id: int
    warmup: int
    repeat: int
    sessions_per_variant: int
    sweep: tuple[str, Sequence[int]] | None
    include_unoptimized: bool
    profile: bool
    cuda_graph: bool
    parity_check: bool
    atol: PerOutput
    rtol: PerOutput


@dataclasses.dataclass(frozen=True)
class VerifyOptions(_Grouped):
    """Everything `verify()` is asked to do besides its models and given inputs."""

    kwargs_names: ClassVar[frozenset[str]] = frozenset(VerifyKwargs.__annotations__)

    input: InputOptions = dataclasses.field(default_factory=InputOptions)
    runtime: RuntimeOptions = dataclasses.field(default_factory=RuntimeOptions)
    compare: CompareOptions = dataclasses.field(default_factory=CompareOptions)


@dataclasses.dataclass(frozen=True)
class BenchOptions(_Grouped):
    """Everything `bench()` is asked to do besides its models, given inputs, progress callback and clock."""

    kwargs_names: ClassVar[frozenset[str]] = frozenset(BenchKwargs.__annotations__)

    input: InputOptions = dataclasses.field(default_factory=InputOptions)
    runtime: RuntimeOptions = dataclasses.field(default_factory=RuntimeOptions)
    measure: MeasureOptions = dataclasses.field(default_factory=MeasureOptions)
    check: ParityCheckOptions = dataclasses.field(default_factory=ParityCheckOptions)

    def __post_init__(self) -> None:
        # ValueError, not InputError: a call that asks for a CUDA feature on the CPU is a programming error.
        if self.measure.cuda_graph and self.runtime.provider != "cuda":
            raise ValueError(
                f"cuda_graph=True needs provider='cuda', not {self.runtime.provider!r}: CUDA graphs are a CUDA feature"
            )
