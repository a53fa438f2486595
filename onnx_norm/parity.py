"""The parity gate: does an optimized model compute what the original computes?

Both models run on the same inputs and provider; every output of the optimized model is compared with the
original's. Both are also compared with a float64 evaluation of the original (the "golden" result: an upcast copy
of the model run by ONNX Runtime, or by onnx's ReferenceEvaluator when ORT lacks a double kernel), because a fused
norm that accumulates in float32 is often *more* accurate than the decomposed fp16 graph it replaced.

An output passes when
1. the optimized output is within tolerance of the original's (the chosen statistic, see below), or
2. it is, element by element, no farther from the exact result than the original is:
   `|optimized - golden| <= atol + rtol * |golden| + |original - golden|`; the report then says whether it is
   closer to the exact result than the original (smaller mean error).
NaN or Inf in one model where the other (and the exact result) is finite always fails.

Default tolerances by output element type (`atol`, `rtol`), for model outputs after many layers:

| dtype    | atol  | rtol  |
|----------|-------|-------|
| float64  | 1e-7  | 1e-7  |
| float32  | 1e-4  | 1e-4  |
| float16  | 1e-2  | 1e-2  |
| bfloat16 | 5e-2  | 5e-2  |
| integer, bool | 0 | 0   |

Statistics (`check_error_stat`, Polygraphy's names): `elementwise` (default) requires every element to satisfy
`|a - b| <= atol + rtol * |b|`; `max`, `mean` and `quantile` require that statistic of the absolute error to be
<= atol or that of the relative error to be <= rtol.

With `per_node=True` every fused norm of the optimized model (nodes tagged `onnx_norm.rule`) and the value it
replaced in the original are exposed as extra outputs, together with the norm's inputs, so a failure names the
first norm whose inputs still agree but whose output does not.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnx_norm import inputs as model_inputs
from onnx_norm.ops.reference import np_dtype
from onnx_norm.ops.schema import DOMAIN
from onnx_norm.paths import write_text_atomic
from onnx_norm.sessions import (
    OptLevel,
    Provider,
    RuntimeConfig,
    RuntimeUnavailableError,
    SessionError,
    create_session,
    model_label,
    run_model,
)

logger = logging.getLogger(__name__)

Stat = Literal["elementwise", "max", "mean", "quantile"]
STATS: tuple[Stat, ...] = ("elementwise", "max", "mean", "quantile")
GoldenMethod = Literal["auto", "ort", "reference", "none"]

RULE_KEY = "onnx_norm.rule"
#: Optional tag naming the original value a fused node's Y replaced (used before any structural mapping).
REPLACES_KEY = "onnx_norm.replaces"

DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
_MAX_FIRST_MISMATCHES = 5
_NORM_OPS = frozenset({"LayerNorm", "RMSNorm", "SkipLayerNorm", "SkipRMSNorm"})


# ---------------------------------------------------------------------------------------------- tolerances


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    stat: Stat = "elementwise"
    quantile: float = 0.99
    #: Pass an output whose every element is NaN/Inf in both models (at the same places); else that fails.
    allow_nonfinite: bool = False


def default_tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(atol, rtol) for an element type: the table in this module's docstring."""
    name = np.dtype(dtype).name
    if name in DEFAULT_TOLERANCES:
        return DEFAULT_TOLERANCES[name]
    return (0.0, 0.0)


PerOutput = float | Mapping[str, float] | None


@dataclasses.dataclass(frozen=True)
class ToleranceSpec:
    """Tolerances for every output: a value for all, or a mapping from output name (`"*"` for the rest)."""

    atol: PerOutput = None
    rtol: PerOutput = None
    stat: Stat | Mapping[str, Stat] | None = None
    quantile: float = 0.99
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

    def for_output(self, name: str, dtype: np.dtype) -> Tolerance:
        atol, rtol = default_tolerance(dtype)
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


_GOLDEN_METHODS: tuple[GoldenMethod, ...] = ("auto", "ort", "reference", "none")
_OPT_LEVELS: tuple[OptLevel, ...] = ("all", "extended", "basic", "disabled")
_PROVIDERS: tuple[Provider, ...] = ("cpu", "cuda")


def check_options(
    *,
    input_files: Sequence[str | Path] = (),
    samples: int = 1,
    seed: int = 0,
    per_node: bool = False,
    threads: int | None = None,
    device_id: int = 0,
    provider: str = "cpu",
    golden: str = "auto",
    original_optimization: str = "all",
    optimized_optimization: str = "all",
    shapes: Mapping[str, int | Sequence[int]] | None = None,
    atol: PerOutput = None,
    rtol: PerOutput = None,
    check_error_stat: Stat | Mapping[str, Stat] | None = None,
    error_quantile: float = 0.99,
    allow_nonfinite: bool = False,
) -> tuple[ToleranceSpec, dict[str, tuple[int, ...]] | None]:
    """Validates verify()'s options, for the API and the CLI alike (the CLI calls it before any work); returns
    the tolerances and the shapes normalised (`{"sequence": 8}` and `{"sequence": [8]}` mean the same).
    Raises InputError naming the option."""
    if isinstance(input_files, (str, Path)):
        raise model_inputs.InputError("input_files must be a list of paths, not one path")
    _check_count(samples, "samples", minimum=1)
    _check_count(seed, "seed", minimum=0)
    if threads is not None:
        _check_count(threads, "threads", minimum=1)
    _check_count(device_id, "device_id", minimum=0)
    for name, value, choices in (
        ("provider", provider, _PROVIDERS),
        ("golden", golden, _GOLDEN_METHODS),
        ("original_optimization", original_optimization, _OPT_LEVELS),
        ("optimized_optimization", optimized_optimization, _OPT_LEVELS),
    ):
        if value not in choices:
            raise model_inputs.InputError(f"{name} {value!r} is not one of {', '.join(choices)}")
    tolerances = ToleranceSpec(atol, rtol, check_error_stat, error_quantile, bool(allow_nonfinite))
    return tolerances, model_inputs.normalize_shapes(shapes)


def _check_count(value: Any, name: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise model_inputs.InputError(f"{name} must be an integer >= {minimum}, got {value!r}")


# ---------------------------------------------------------------------------------------------- metrics


@dataclasses.dataclass
class Metrics:
    """Error of `actual` against `expected`, over all samples."""

    max_abs: float
    max_rel: float
    mean_abs: float
    p99_abs: float
    cosine: float
    mismatched: int  # elements out of elementwise tolerance
    total: int
    nonfinite_mismatched: int  # NaN/Inf on one side only (or Inf of the other sign)
    first_mismatches: list[dict[str, Any]]  # {"sample": i, "index": [...], "actual": v, "expected": v}
    nonfinite_matched: int = 0  # NaN, or Inf of one sign, in both models at the same place: not in the stats


@dataclasses.dataclass
class GoldenComparison:
    """Both models against the float64 evaluation of the original."""

    original_max_abs: float
    original_mean_abs: float
    optimized_max_abs: float
    optimized_mean_abs: float
    within_envelope: bool  # optimized no farther from exact than the original (plus tolerance)

    @property
    def closer(self) -> bool:
        return self.optimized_mean_abs <= self.original_mean_abs


@dataclasses.dataclass
class Comparison:
    """One output (or one fused norm's value) compared across the two models."""

    name: str
    dtype: str
    shape: list[int] | None
    tolerance: Tolerance
    passed: bool
    verdict: str
    metrics: Metrics | None = None
    golden: GoldenComparison | None = None

    @property
    def message(self) -> str:
        m = self.metrics
        if m is None or m.nonfinite_matched == m.total:
            return self.verdict
        both = f", {m.nonfinite_matched}/{m.total} NaN/Inf in both at the same places" if m.nonfinite_matched else ""
        text = (
            f"{self.verdict} (max abs {m.max_abs:.3g}, max rel {m.max_rel:.3g}, "
            f"{m.mismatched}/{m.total} out of atol={self.tolerance.atol:g} rtol={self.tolerance.rtol:g}{both})"
        )
        if self.golden is not None and not self.passed:
            g = self.golden
            text += f"; vs exact: optimized max {g.optimized_max_abs:.3g}, original max {g.original_max_abs:.3g}"
        return text


@dataclasses.dataclass
class NormComparison:
    """One fused norm: its output against the value it replaced, and whether its inputs still agreed."""

    node: str
    op_type: str
    rule: str
    original_value: str | None
    optimized_value: str
    output: Comparison | None
    inputs_match: bool | None
    status: str  # "ok", "diverges", "input differs", "unmapped"


@dataclasses.dataclass
class ParityReport:
    passed: bool
    outputs: list[Comparison]
    norms: list[NormComparison]
    samples: int
    shapes: dict[str, list[int]]
    provider: str
    original_optimization: str
    golden: str  # how the golden result was computed: "ort", "reference" or "none"
    seed: int
    elapsed_s: float
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def first_divergent_norm(self) -> NormComparison | None:
        for norm in self.norms:
            if norm.status == "diverges":
                return norm
        return next((norm for norm in self.norms if norm.status == "input differs"), None)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["status"] = "PASSED" if self.passed else "FAILED"
        first = self.first_divergent_norm
        data["first_divergent_norm"] = None if first is None else first.node
        for item, output in zip(data["outputs"], self.outputs, strict=True):
            item["message"] = output.message
        return _json_safe(data)

    def write_json(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no Infinity/NaN; "inf"/"nan" strings keep the report valid
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    return value


def _as_float64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def compare(
    name: str,
    actual: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    tolerance: Tolerance,
    golden: Sequence[np.ndarray] | None = None,
) -> Comparison:
    """Compares the optimized (`actual`) and original (`expected`) values of one tensor over all samples."""
    dtype = np.asarray(expected[0]).dtype
    shape = list(np.shape(expected[0]))
    for a, b in zip(actual, expected, strict=True):
        if np.shape(a) != np.shape(b):
            return Comparison(
                name, dtype.name, shape, tolerance, False, f"shape {list(np.shape(a))} != {list(np.shape(b))}"
            )
        if np.asarray(a).dtype != np.asarray(b).dtype:
            return Comparison(name, dtype.name, shape, tolerance, False, f"dtype {np.asarray(a).dtype} != {dtype}")
    metrics, absdiff, rel = _metrics(actual, expected, tolerance)
    if metrics.total and metrics.nonfinite_matched == metrics.total:
        # Nothing finite to compare: agreeing on NaN everywhere says nothing about the computation.
        passed = tolerance.allow_nonfinite
        verdict = f"every element is NaN/Inf in both models ({metrics.total}/{metrics.total})" + (
            ", allowed" if passed else ": nothing to compare (--allow-nonfinite, allow_nonfinite=True, accepts it)"
        )
        return Comparison(name, dtype.name, shape, tolerance, passed, verdict, metrics)
    passed = metrics.nonfinite_mismatched == 0 and _stat_passes(absdiff, rel, metrics, tolerance)
    golden_cmp = None
    if golden is not None and np.issubdtype(np.asarray(golden[0]).dtype, np.floating):
        golden_cmp = _golden(actual, expected, golden, tolerance)
    if passed:
        verdict = "matches the original"
    elif golden_cmp is not None and golden_cmp.within_envelope:
        passed = True
        verdict = (
            "closer to the exact result than the original"
            if golden_cmp.closer
            else "within the original's own error from the exact result"
        )
    elif metrics.nonfinite_mismatched:
        verdict = f"{metrics.nonfinite_mismatched} NaN/Inf where the other model is finite"
    else:
        verdict = "differs from the original"
    return Comparison(name, dtype.name, shape, tolerance, passed, verdict, metrics, golden_cmp)


def _metrics(
    actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], tolerance: Tolerance
) -> tuple[Metrics, np.ndarray, np.ndarray]:
    """Metrics, and the absolute and relative differences of the compared elements of all samples (flattened;
    inf where only one side is NaN/Inf). Elements that are the same NaN/Inf in both are counted, not compared."""
    abs_parts, rel_parts, a_parts, b_parts = [], [], [], []
    nonfinite = matched = mismatched = 0
    first: list[dict[str, Any]] = []
    with np.errstate(all="ignore"):  # NaN/Inf and huge values are expected here, and handled
        for sample, (a_raw, b_raw) in enumerate(zip(actual, expected, strict=True)):
            a, b = _as_float64(a_raw), _as_float64(b_raw)
            finite = np.isfinite(a) & np.isfinite(b)
            same_special = ~finite & ((np.isnan(a) & np.isnan(b)) | (a == b))
            bad_special = ~finite & ~same_special
            nonfinite += int(bad_special.sum())
            matched += int(same_special.sum())
            absdiff = np.where(finite, np.abs(a - b), np.where(same_special, 0.0, np.inf))
            magnitude = np.abs(np.where(finite, b, 0.0))
            rel = np.where(absdiff == 0, 0.0, absdiff / magnitude)
            ok = absdiff <= tolerance.atol + tolerance.rtol * magnitude
            mismatched += int((~ok).sum())
            if len(first) < _MAX_FIRST_MISMATCHES and not ok.all():
                for index in np.argwhere(~ok)[: _MAX_FIRST_MISMATCHES - len(first)]:
                    position = tuple(int(i) for i in index)
                    first.append(
                        {
                            "sample": sample,
                            "index": list(position),
                            "actual": float(a[position]),
                            "expected": float(b[position]),
                        }
                    )
            compared = ~same_special
            abs_parts.append(absdiff[compared].ravel())
            rel_parts.append(rel[compared].ravel())
            a_parts.append(a[finite].ravel())
            b_parts.append(b[finite].ravel())
        absdiff_all = np.concatenate(abs_parts)
        rel_all = np.concatenate(rel_parts)
        a_all, b_all = np.concatenate(a_parts), np.concatenate(b_parts)
        finite_abs = absdiff_all[np.isfinite(absdiff_all)]
        norm = float(np.linalg.norm(a_all) * np.linalg.norm(b_all))
        if not a_all.size:
            cosine = math.nan  # no element finite in both: nothing to measure
        elif norm > 0 and math.isfinite(norm):
            cosine = float(np.dot(a_all, b_all) / norm)
        else:
            cosine = 1.0 if not a_all.any() and not b_all.any() else 0.0
        compared_count = int(absdiff_all.size)
        metrics = Metrics(
            max_abs=float(absdiff_all.max()) if compared_count else math.nan,
            max_rel=float(rel_all.max()) if compared_count else math.nan,
            mean_abs=float(finite_abs.mean()) if finite_abs.size else math.nan,
            p99_abs=float(np.quantile(finite_abs, 0.99)) if finite_abs.size else math.nan,
            cosine=cosine,
            mismatched=mismatched,
            total=compared_count + matched,
            nonfinite_mismatched=nonfinite,
            first_mismatches=first,
            nonfinite_matched=matched,
        )
    return metrics, absdiff_all, rel_all


def _stat_passes(absdiff: np.ndarray, rel: np.ndarray, metrics: Metrics, tolerance: Tolerance) -> bool:
    if tolerance.stat == "elementwise":
        return metrics.mismatched == 0
    if not absdiff.size:
        return True
    if tolerance.stat == "max":
        abs_stat, rel_stat = absdiff.max(), rel.max()
    elif tolerance.stat == "mean":
        abs_stat, rel_stat = absdiff.mean(), rel.mean()
    else:
        abs_stat, rel_stat = np.quantile(absdiff, tolerance.quantile), np.quantile(rel, tolerance.quantile)
    return bool(abs_stat <= tolerance.atol or rel_stat <= tolerance.rtol)


def _golden(
    actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], golden: Sequence[np.ndarray], tolerance: Tolerance
) -> GoldenComparison:
    opt_err, orig_err = [], []
    envelope_ok = True
    for a_raw, b_raw, g_raw in zip(actual, expected, golden, strict=True):
        a, b, g = _as_float64(a_raw), _as_float64(b_raw), _as_float64(g_raw)
        g_finite = np.isfinite(g)
        with np.errstate(all="ignore"):
            ea = np.where(g_finite, np.abs(a - g), 0.0)
            eb = np.where(g_finite, np.abs(b - g), 0.0)
            ea = np.where(np.isnan(ea), np.inf, ea)
            eb = np.where(np.isnan(eb), np.inf, eb)
            # Element by element, the optimized value may be as far from exact as the original's value is, plus
            # the tolerance; where the original is non-finite against a finite exact value, any finite value is
            # closer.
            allowed = tolerance.atol + tolerance.rtol * np.abs(np.where(g_finite, g, 0.0)) + eb
            inside = (ea <= allowed) | (~np.isfinite(eb) & np.isfinite(ea))
        envelope_ok = envelope_ok and bool(inside.all())
        opt_err.append(ea.ravel())
        orig_err.append(eb.ravel())
    ea_all, eb_all = np.concatenate(opt_err), np.concatenate(orig_err)

    def stats(errors: np.ndarray) -> tuple[float, float]:
        if not errors.size:
            return 0.0, 0.0
        finite = errors[np.isfinite(errors)]
        mean = float(finite.mean()) if finite.size else math.inf
        return float(errors.max()), mean

    opt_max, opt_mean = stats(ea_all)
    orig_max, orig_mean = stats(eb_all)
    return GoldenComparison(orig_max, orig_mean, opt_max, opt_mean, envelope_ok)


# ---------------------------------------------------------------------------------------------- golden model


def upcast_to_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` in which every float16/bfloat16/float32 tensor, cast and constant is float64."""
    upcast = onnx.ModelProto()
    upcast.CopyFrom(model)
    _upcast_graph(upcast.graph)
    for function in upcast.functions:
        for node in function.node:
            _upcast_node(node)
    return upcast


def _upcast_value_infos(values: Iterable[onnx.ValueInfoProto]) -> None:
    for value in values:
        tensor_type = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor_type.elem_type in _FLOAT_TYPES:
            tensor_type.elem_type = TensorProto.DOUBLE


def _upcast_tensor(tensor: onnx.TensorProto) -> None:
    if tensor.data_type not in _FLOAT_TYPES:
        return
    array = numpy_helper.to_array(tensor).astype(np.float64)
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


def _upcast_graph(graph: onnx.GraphProto) -> None:
    _upcast_value_infos(graph.input)
    _upcast_value_infos(graph.output)
    del graph.value_info[:]  # stale element types would contradict the upcast graph
    for tensor in graph.initializer:
        _upcast_tensor(tensor)
    for node in graph.node:
        _upcast_node(node)


def _upcast_node(node: onnx.NodeProto) -> None:
    for attr in list(node.attribute):
        if attr.type == onnx.AttributeProto.TENSOR:
            _upcast_tensor(attr.t)
        elif attr.type == onnx.AttributeProto.GRAPH:
            _upcast_graph(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for sub in attr.graphs:
                _upcast_graph(sub)
        elif (
            attr.type == onnx.AttributeProto.INT
            and attr.i in _FLOAT_TYPES
            and (
                (node.op_type in ("Cast",) and attr.name == "to")
                or attr.name == "dtype"
                or (node.op_type == "LayerNormalization" and attr.name == "stash_type")
            )
        ):
            attr.i = TensorProto.DOUBLE
    if node.op_type == "Constant":
        for attr in list(node.attribute):
            if attr.name in ("value_float", "value_floats"):
                values = np.array(attr.f if attr.name == "value_float" else list(attr.floats), dtype=np.float64)
                node.attribute.remove(attr)
                node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(values)))


_MISSING_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\)")
_MAX_FLOAT32_FALLBACKS = 8


def _golden_session(upcast: onnx.ModelProto, threads: int | None) -> Any:
    """ORT session for the float64 copy. ORT lacks double kernels for a few ops (Erf, for one): those nodes run
    in float32 between Casts, which keeps the golden result far more precise than any fp16 graph."""
    model = upcast
    for _ in range(_MAX_FLOAT32_FALLBACKS):
        try:
            return create_session(model, RuntimeConfig("cpu", threads, "disabled"), custom_ops=False)
        except SessionError as err:
            missing = _MISSING_KERNEL.search(str(err))
            if missing is None:
                raise
            op_type = missing.group(1)
            if any(node.op_type == op_type and len(node.input) != 1 for node in model.graph.node):
                raise  # only unary ops are known to take just the float tensor that a Cast can narrow
            logger.info("no float64 kernel for %s in ONNX Runtime; evaluating it in float32", op_type)
            model = _run_in_float32(model, op_type)
    raise SessionError("too many ops without a float64 kernel")


def _run_in_float32(model: onnx.ModelProto, op_type: str) -> onnx.ModelProto:
    patched = onnx.ModelProto()
    patched.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(patched.graph.node):
        if node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        prefix = f"onnx_norm_f32_{index}"
        new_inputs = []
        for i, name in enumerate(node.input):
            cast_name = f"{prefix}_in{i}"
            nodes.append(onnx.helper.make_node("Cast", [name], [cast_name], to=TensorProto.FLOAT))
            new_inputs.append(cast_name)
        outputs = list(node.output)
        del node.input[:]
        node.input.extend(new_inputs)
        del node.output[:]
        node.output.extend(f"{prefix}_out{i}" for i in range(len(outputs)))
        nodes.append(node)
        for i, name in enumerate(outputs):
            nodes.append(onnx.helper.make_node("Cast", [f"{prefix}_out{i}"], [name], to=TensorProto.DOUBLE))
    del patched.graph.node[:]
    patched.graph.node.extend(nodes)
    return patched


class GoldenEvaluator:
    """Evaluates the original model in float64: ORT on the upcast copy, else onnx's ReferenceEvaluator."""

    def __init__(self, model: onnx.ModelProto, method: GoldenMethod, threads: int | None) -> None:
        self.method = "none"
        self._session = None
        self._reference = None
        if method == "none":
            return
        upcast = upcast_to_double(model)
        if method in ("auto", "ort"):
            try:
                self._session = _golden_session(upcast, threads)
                self.method = "ort"
                return
            except SessionError as err:
                if method == "ort":
                    raise
                logger.info("float64 copy does not run in ONNX Runtime (%s); using onnx.reference", err)
        from onnx.reference import ReferenceEvaluator

        try:
            self._reference = ReferenceEvaluator(upcast)
            self.method = "reference"
        except Exception as err:  # the reference evaluator raises for ops it does not implement
            if method == "reference":
                raise SessionError(f"onnx.reference cannot evaluate the model: {err}") from err
            logger.warning("no float64 golden reference for this model: %s", err)

    def run(self, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray] | None:
        upcast_feeds = {
            name: (_as_float64(value) if _is_float(value.dtype) else value) for name, value in feeds.items()
        }
        if self._session is not None:
            try:
                return run_model(self._session, upcast_feeds, list(names), label="the float64 copy")
            except SessionError as err:
                # The golden result is a second opinion: without it the models are compared with each other only.
                logger.warning("%s", err)
                self._session = None
                self.method = "none"
                return None
        if self._reference is not None:
            try:
                values = self._reference.run(list(names), upcast_feeds)
            except Exception as err:
                logger.warning("onnx.reference failed on the float64 copy: %s", err)
                self._reference = None
                self.method = "none"
                return None
            return dict(zip(names, values, strict=True))
        return None


def _is_float(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or dtype == np_dtype(TensorProto.BFLOAT16)


# ---------------------------------------------------------------------------------------------- per-node mapping


@dataclasses.dataclass
class FusedNorm:
    """A fused norm node of the optimized model and the original values its output and inputs correspond to."""

    node: str
    op_type: str
    rule: str
    y: str
    original_y: str | None
    inputs: list[tuple[str, str | None]]  # (optimized name, original name) for X and Skip


def _metadata(node: onnx.NodeProto) -> dict[str, str]:
    return {prop.key: prop.value for prop in getattr(node, "metadata_props", ())}


def find_fused_norms(original: onnx.ModelProto, optimized: onnx.ModelProto) -> list[FusedNorm]:
    """Fused norm nodes of `optimized` (tagged `onnx_norm.rule`, or any node in our domain), in graph order, with
    the names of the corresponding values in `original`."""
    orig_values = {name for node in original.graph.node for name in node.output if name}
    orig_values |= {value.name for value in original.graph.input}
    orig_nodes = {node.name: node for node in original.graph.node if node.name}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in optimized.graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, index))
    opt_outputs = {value.name for value in optimized.graph.output}
    orig_outputs = [value.name for value in original.graph.output]
    opt_output_index = {value.name: i for i, value in enumerate(optimized.graph.output)}

    def map_value(name: str, hint: str | None = None) -> str | None:
        if hint and hint in orig_values:
            return hint
        if name in orig_values:
            return name
        if name in opt_outputs and opt_output_index[name] < len(orig_outputs):
            return orig_outputs[opt_output_index[name]]
        # Untouched consumers keep their node names: the value they read in the original is the one replaced.
        for consumer, index in consumers.get(name, ()):
            twin = orig_nodes.get(consumer.name)
            if twin is not None and twin.op_type == consumer.op_type and index < len(twin.input):
                return twin.input[index]
        return None

    norms: list[FusedNorm] = []
    mapped_y: dict[str, str | None] = {}
    for node in optimized.graph.node:
        meta = _metadata(node)
        if RULE_KEY not in meta and not (node.domain == DOMAIN and node.op_type in _NORM_OPS):
            continue
        y = node.output[0]
        original_y = map_value(y, meta.get(REPLACES_KEY))
        mapped_y[y] = original_y
        skip_op = node.op_type.startswith("Skip")
        data_inputs = list(node.input[: 2 if skip_op else 1])
        inputs = [(name, mapped_y.get(name) or map_value(name)) for name in data_inputs if name]
        norms.append(FusedNorm(node.name or y, node.op_type, meta.get(RULE_KEY, ""), y, original_y, inputs))
    return norms


def _with_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    exposed = copy.deepcopy(model)
    present = {value.name for value in exposed.graph.output}
    for name in names:
        if name not in present:
            # ONNX Runtime infers the type of an output declared by name only.
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return exposed


# ---------------------------------------------------------------------------------------------- verify


def _load_optimized(optimized: Any) -> tuple[onnx.ModelProto, str | None]:
    """The optimized model, and why it is not a valid model if it is not: the gate exists to catch a broken
    rewrite, so that is a failed report. A file that is not an ONNX model at all is an InputError."""
    from onnx_norm import model_io

    proto = model_inputs.load_model(optimized, load_external_data=True, checked=False)
    try:
        model_io.check(proto, "the optimized model")
    except model_io.ModelLoadError as err:
        return proto, str(err)
    return proto, None


def _nonfinite_inputs(samples: Sequence[Mapping[str, np.ndarray]]) -> list[str]:
    warnings = []
    for index, sample in enumerate(samples):
        for name, array in sample.items():
            values = np.asarray(array)
            if values.dtype.kind == "f" or values.dtype == np_dtype(TensorProto.BFLOAT16):
                count = int(values.size - np.isfinite(values.astype(np.float32)).sum())
                if count:
                    warnings.append(f"sample {index}: input {name!r} holds {count} NaN/Inf value(s)")
    return warnings


def verify(
    original: str | Path | onnx.ModelProto | Any,
    optimized: str | Path | onnx.ModelProto | Any,
    *,
    inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    input_files: Sequence[str | Path] = (),
    shapes: Mapping[str, int | Sequence[int]] | None = None,
    samples: int = 1,
    seed: int = 0,
    provider: Provider = "cpu",
    threads: int | None = None,
    device_id: int = 0,
    original_optimization: OptLevel = "all",
    optimized_optimization: OptLevel = "all",
    atol: PerOutput = None,
    rtol: PerOutput = None,
    check_error_stat: Stat | Mapping[str, Stat] | None = None,
    error_quantile: float = 0.99,
    golden: GoldenMethod = "auto",
    per_node: bool = False,
    allow_nonfinite: bool = False,
) -> ParityReport:
    """Checks that `optimized` computes what `original` computes (see the module docstring for the rules).

    `shapes` maps an input to its dims or a symbolic dim to its value (`{"sequence": 8}`); `atol`/`rtol` are one
    value or {output: value} ("*" for the rest). `allow_nonfinite` passes an output that is NaN/Inf everywhere in
    both models (it fails otherwise). Options are validated by `check_options`, as the CLI's are.

    Raises `onnx_norm.inputs.InputError` for bad options, an original that is not a valid model and inputs that do
    not fit the models, and `onnx_norm.sessions.SessionError` when the original cannot be run or the machine
    cannot run the models as asked (library not built, CUDA unavailable). An optimized model that is not valid,
    or that ONNX Runtime rejects or fails to run, is a failed report.
    """
    start = time.perf_counter()
    tolerances, shapes = check_options(
        input_files=input_files,
        samples=samples,
        seed=seed,
        per_node=per_node,
        threads=threads,
        device_id=device_id,
        provider=provider,
        golden=golden,
        original_optimization=original_optimization,
        optimized_optimization=optimized_optimization,
        shapes=shapes,
        atol=atol,
        rtol=rtol,
        check_error_stat=check_error_stat,
        error_quantile=error_quantile,
        allow_nonfinite=allow_nonfinite,
    )
    original_label = model_label("original", original)
    original_proto = model_inputs.load_model(original, load_external_data=True)
    optimized_proto, optimized_failure = _load_optimized(optimized)
    model_inputs.check_same_inputs(original_proto, optimized_proto)
    output_names = [value.name for value in original_proto.graph.output]
    tolerances.check_names(output_names)
    hint = ""
    if inputs is not None:
        specs = model_inputs.input_specs(original_proto)
        sample_list = [dict(sample) for sample in inputs]
        for index, sample in enumerate(sample_list):
            model_inputs.validate(specs, sample, where=f"sample {index}")
    else:
        sample_list = model_inputs.prepare(original_proto, files=input_files, shapes=shapes, samples=samples, seed=seed)
        hint = "" if input_files else model_inputs.shape_hint(original_proto, shapes)
    if not sample_list:
        raise model_inputs.InputError("no input samples")
    report_warnings = _nonfinite_inputs(sample_list)

    norms = find_fused_norms(original_proto, optimized_proto) if per_node and optimized_failure is None else []
    extra_orig = [name for norm in norms for name in [norm.original_y, *(o for _, o in norm.inputs)] if name]
    extra_opt = [name for norm in norms for name in [norm.y, *(o for o, _ in norm.inputs)]]
    run_original = _with_outputs(original_proto, extra_orig) if norms else original_proto
    run_optimized = _with_outputs(optimized_proto, extra_opt) if norms else optimized_proto

    config = RuntimeConfig(provider, threads, original_optimization, device_id)
    original_session = create_session(run_original, config, label=original_label)
    golden_eval = GoldenEvaluator(run_original, golden, threads)
    # An optimized model that ONNX Runtime rejects or fails to run is a parity failure, not a usage error.
    if optimized_failure is None:
        try:
            optimized_session = create_session(
                run_optimized, config.replace(optimization=optimized_optimization), label="it"
            )
        except RuntimeUnavailableError:
            raise
        except SessionError as err:
            optimized_failure = f"the optimized model does not run: {err}"

    opt_names = [value.name for value in optimized_proto.graph.output]
    missing = [name for name in output_names if name not in opt_names]
    orig_results: list[dict[str, np.ndarray]] = []
    opt_results: list[dict[str, np.ndarray]] = []
    golden_results: list[dict[str, np.ndarray]] | None = [] if golden_eval.method != "none" else None
    orig_fetch = list(dict.fromkeys(output_names + extra_orig))
    opt_fetch = list(dict.fromkeys([n for n in output_names if n in opt_names] + extra_opt))
    for sample in sample_list:
        try:
            orig_results.append(run_model(original_session, sample, orig_fetch, label=original_label))
        except SessionError as err:
            raise SessionError(f"{err}{hint}") from err
        if optimized_failure is None:
            try:
                opt_results.append(run_model(optimized_session, sample, opt_fetch, label="it"))
            except SessionError as err:
                optimized_failure = f"the optimized model does not run: {err}"
        if golden_results is not None:
            result = golden_eval.run(sample, orig_fetch)
            if result is None:
                golden_results = None
                report_warnings.append("the float64 golden evaluation failed; compared with the original only")
            else:
                golden_results.append(result)

    outputs: list[Comparison] = []
    for name in output_names:
        dtype = orig_results[0][name].dtype
        tolerance = tolerances.for_output(name, dtype)
        if optimized_failure is not None:
            failure = optimized_failure
        elif name in missing:
            failure = "missing from the optimized model"
        else:
            failure = None
        if failure is not None:
            shape = list(orig_results[0][name].shape)
            outputs.append(Comparison(name, dtype.name, shape, tolerance, False, failure))
            continue
        outputs.append(
            compare(
                name,
                [r[name] for r in opt_results],
                [r[name] for r in orig_results],
                tolerance,
                None if golden_results is None else [g[name] for g in golden_results],
            )
        )

    norm_results = (
        [_compare_norm(norm, opt_results, orig_results, golden_results, tolerances) for norm in norms]
        if optimized_failure is None
        else []
    )
    unmapped = [norm.node for norm in norm_results if norm.status == "unmapped"]
    if unmapped:
        report_warnings.append(f"no original value found for fused norm(s) {', '.join(unmapped)}")
    passed = all(item.passed for item in outputs) and not any(norm.status == "diverges" for norm in norm_results)
    return ParityReport(
        passed=passed,
        outputs=outputs,
        norms=norm_results,
        samples=len(sample_list),
        shapes={name: list(array.shape) for name, array in sample_list[0].items()},
        provider=provider,
        original_optimization=original_optimization,
        golden=golden_eval.method if golden_results is not None else "none",
        seed=seed,
        elapsed_s=time.perf_counter() - start,
        warnings=report_warnings,
    )


def _compare_norm(
    norm: FusedNorm,
    opt_results: list[dict[str, np.ndarray]],
    orig_results: list[dict[str, np.ndarray]],
    golden_results: list[dict[str, np.ndarray]] | None,
    tolerances: ToleranceSpec,
) -> NormComparison:
    if norm.original_y is None:
        return NormComparison(norm.node, norm.op_type, norm.rule, None, norm.y, None, None, "unmapped")

    def pair(opt_name: str, orig_name: str) -> Comparison:
        dtype = orig_results[0][orig_name].dtype
        return compare(
            opt_name,
            [r[opt_name] for r in opt_results],
            [r[orig_name] for r in orig_results],
            tolerances.for_output("*", dtype),
            None if golden_results is None else [g[orig_name] for g in golden_results],
        )

    output = pair(norm.y, norm.original_y)
    mapped_inputs = [(o, g) for o, g in norm.inputs if g is not None]
    inputs_match = all(pair(o, g).passed for o, g in mapped_inputs) if mapped_inputs else None
    if output.passed:
        status = "ok"
    elif inputs_match is False:
        status = "input differs"
    else:
        status = "diverges"
    return NormComparison(norm.node, norm.op_type, norm.rule, norm.original_y, norm.y, output, inputs_match, status)
