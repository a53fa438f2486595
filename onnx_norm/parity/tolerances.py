"""Tolerances of the parity gate: the defaults per element type, per-output settings, and the validation of
verify()'s options (shared by the API and the CLI)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import numpy as np

from onnx_norm import defaults
from onnx_norm import inputs as model_inputs
from onnx_norm.defaults import GOLDEN_METHODS, OPT_LEVELS, PROVIDERS, STATS, GoldenMethod, Stat
from onnx_norm.options import CompareOptions, PerOutput, VerifyKwargs, VerifyOptions

__all__ = ["DEFAULT_TOLERANCES", "GOLDEN_METHODS", "OPT_LEVELS", "PROVIDERS", "STATS", "GoldenMethod", "Stat"]
__all__ += ["PerOutput", "Tolerance", "ToleranceSpec", "check_options", "default_tolerance", "tolerance_spec"]

DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    stat: Stat = "elementwise"
    quantile: float = 0.99
    #: Pass an output whose every element is NaN/Inf in both models (at the same places); else that fails.
    allow_nonfinite: bool = False


def default_tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(atol, rtol) for an element type: the table in the docstring of onnx_norm.parity."""
    name = np.dtype(dtype).name
    if name in DEFAULT_TOLERANCES:
        return DEFAULT_TOLERANCES[name]
    return (0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class ToleranceSpec:
    """Tolerances for every output: a value for all, or a mapping from output name (`"*"` for the rest)."""

    atol: PerOutput = None
    rtol: PerOutput = None
    stat: Stat | Mapping[str, Stat] | None = None
    quantile: float = defaults.ERROR_QUANTILE
    allow_nonfinite: bool = False

    def __post_init__(self) -> None:
        for flag in ("atol", "rtol"):
            for key, value in _entries(getattr(self, flag)):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise model_inputs.InputError(f"{flag} {_named(key)}{value!r} is not a number")
                if not math.isfinite(value) or value < 0:
                    raise model_inputs.InputError(f"{flag} {_named(key)}{value!r} must be a finite value >= 0")
        for key, stat in _entries(self.stat):
            if stat not in STATS:
                raise model_inputs.InputError(
                    f"check_error_stat {_named(key)}{stat!r} is not a statistic; choose from {', '.join(STATS)}"
                )
        if isinstance(self.quantile, bool) or not 0.0 <= self.quantile <= 1.0:
            raise model_inputs.InputError(f"error_quantile must be in [0, 1], got {self.quantile!r}")

    def check_names(self, outputs: Sequence[str]) -> None:
        """Raises InputError when a per-output value names no output of the model (a typo would be ignored)."""
        for flag in ("atol", "rtol", "check_error_stat"):
            value = self.stat if flag == "check_error_stat" else getattr(self, flag)
            for key, _ in _entries(value):
                if key != "*" and key not in outputs:
                    raise model_inputs.InputError(
                        f"{flag} names {key!r}, which is not an output of the model (outputs: {', '.join(outputs)})"
                    )

    def for_output(self, name: str, dtype: np.dtype, computed_in: np.dtype | None = None) -> Tolerance:
        """The tolerance of one output: the values given for it, else the defaults of the narrowest float type on
        its path (`computed_in`, onnx_norm/parity/precision.py) or of its own type."""
        atol, rtol = default_tolerance(computed_in if computed_in is not None else dtype)
        return Tolerance(
            atol=float(_pick(self.atol, name, atol)),
            rtol=float(_pick(self.rtol, name, rtol)),
            stat=_pick(self.stat, name, "elementwise"),
            quantile=self.quantile,
            allow_nonfinite=self.allow_nonfinite,
        )


def _entries(value: Any) -> list[tuple[str, Any]]:
    """(output name or "*", value) pairs of a per-output setting."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        return list(value.items())
    return [("*", value)]


def _named(key: str) -> str:
    return "" if key == "*" else f"{key}:"


def _pick(value: Any, name: str, default: Any) -> Any:
    if value is None:
        return default
    if isinstance(value, Mapping):
        return value.get(name, value.get("*", default))
    return value


def tolerance_spec(compare: CompareOptions) -> ToleranceSpec:
    """The tolerances of a comparison's options, validated (InputError naming the option)."""
    return ToleranceSpec(
        compare.atol, compare.rtol, compare.check_error_stat, compare.error_quantile, bool(compare.allow_nonfinite)
    )


def check_options(
    options: VerifyOptions | None = None, /, **kwargs: Unpack[VerifyKwargs]
) -> tuple[ToleranceSpec, dict[str, tuple[int, ...]] | None]:
    """Validates verify()'s options (a VerifyOptions, keyword options applied on top), for the API and the CLI
    alike (the CLI calls it before any work); returns the tolerances and the shapes normalised
    (`{"sequence": 8}` and `{"sequence": [8]}` mean the same). Raises InputError naming the option."""
    options = VerifyOptions.build(options, "check_options", **kwargs)
    return tolerance_spec(options.compare), options.input.shapes  # type: ignore[return-value]
