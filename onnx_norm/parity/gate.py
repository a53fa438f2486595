"""`verify`: runs the original and the optimized model on the same inputs and compares them (rules: the docstring
of onnx_norm.parity)."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import numpy as np
import onnx

from onnx_norm import inputs as model_inputs
from onnx_norm import model_io
from onnx_norm.options import CompareOptions, InputOptions, VerifyKwargs, VerifyOptions
from onnx_norm.parity import precision, segmented, segments
from onnx_norm.parity.golden import GoldenEvaluator
from onnx_norm.parity.mapping import FusedNorm, find_fused_norms, with_outputs
from onnx_norm.parity.report import NormComparison, ParityReport
from onnx_norm.parity.tolerances import GoldenMethod, ToleranceSpec, tolerance_spec
from onnx_norm.parity.verdict import Comparison, compare
from onnx_norm.sessions import (
    OptLevel,
    Provider,
    RuntimeConfig,
    RuntimeUnavailableError,
    SessionError,
    create_session,
    half_weights_policy,
    model_label,
    run_model,
)
from onnx_norm.weights import (
    HEADROOM,
    available_memory,
    check_memory,
    half_weights_at_run,
    session_copies,
    weight_bytes,
)

logger = logging.getLogger(__name__)

Results = list[dict[str, np.ndarray]]


def _load_optimized(optimized: Any) -> tuple[onnx.ModelProto, str | None]:
    """The optimized model, and why it is not a valid model if it is not: the gate exists to catch a broken
    rewrite, so that is a failed report. A file that is not an ONNX model at all is an InputError."""
    proto = model_io.load_proto(optimized, resolve_external=True, checked=False)
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
            if model_inputs.is_float(values.dtype):
                count = int(values.size - np.isfinite(values.astype(np.float32)).sum())
                if count:
                    warnings.append(f"sample {index}: input {name!r} holds {count} NaN/Inf value(s)")
    return warnings


def _samples(
    original: onnx.ModelProto, inputs: Sequence[Mapping[str, np.ndarray]] | None, options: InputOptions
) -> tuple[list[dict[str, np.ndarray]], str, dict[str, dict[str, Any]]]:
    """The input samples (given, read from files or generated, with `options.values` set), the hint to add to a
    run failure about the values and shapes generated inputs took, and the report's notes on the inputs whose
    values choose the model's path (`inputs.input_notes`)."""
    files, shapes, values = options.input_files, options.shapes, options.values
    generated = inputs is None and not files
    if inputs is not None:
        sample_list = model_inputs.check_given(original, inputs, values)
    else:
        sample_list = model_inputs.prepare(
            original, files=files, shapes=shapes, samples=options.samples, seed=options.seed, values=values
        )
    if not sample_list:
        raise model_inputs.InputError("no input samples")
    hint = model_inputs.run_hint(original, sample_list[0], shapes=shapes, values=values) if generated else ""
    notes = model_inputs.input_notes(original, sample_list[0], values=values, generated=generated)
    return sample_list, hint, notes


@dataclasses.dataclass
class _Runs:
    """What both models (and the golden evaluation) returned for every sample."""

    original: Results
    optimized: Results
    golden: Results | None
    golden_method: str
    optimized_failure: str | None
    warnings: list[str]
    form: str = "whole model"  # or "N segments (the largest reads W MiB of weights)"
    cuts: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Models:
    """The two models as run (with the fused norms' values exposed as outputs when comparing per node), and what
    each session is made from: the model's path when it is run as it is (ONNX Runtime loads it as users do), else
    the proto (its external tensors handed over without copying: onnx_norm.weights)."""

    original: onnx.ModelProto
    optimized: onnx.ModelProto
    original_label: str
    original_fetch: list[str]
    optimized_fetch: list[str]
    optimized_failure: str | None
    original_source: onnx.ModelProto | model_io.ModelFile | None = None
    optimized_source: onnx.ModelProto | model_io.ModelFile | None = None
    golden_form: str = ""
    weights_policy: str = ""  # how the sessions held the weights, when not as ONNX Runtime does by default


def _source(given: Any, proto: onnx.ModelProto, exposed: onnx.ModelProto) -> onnx.ModelProto | model_io.ModelFile:
    """A model run as it is runs from its file (ONNX Runtime loads it as users do), with the proto already read:
    the session reads nothing of it again."""
    if exposed is not proto:
        return exposed
    if isinstance(given, model_io.ModelFile):
        return given
    return model_io.ModelFile(Path(given), proto) if isinstance(given, (str, Path)) else exposed


def _set_sources(
    models: _Models,
    original: Any,
    optimized: Any,
    original_proto: onnx.ModelProto,
    optimized_proto: onnx.ModelProto,
    provider: Provider,
    plan: segments.Plan | None = None,
) -> bool:
    """What each session is made from (a path when the model runs as it is), once the memory is known to suffice
    (for the largest segment when `plan` cuts the models):
    one model at a time, its weights and the fp32 copies ORT's CPU provider makes of half-precision ones. Returns
    whether the sessions cast half-precision weights where used (`weights.half_weights_at_run`): the values of
    ORT's fp32 copies made at load, less its pre-packing of them (which sums in another order), without holding
    them all; both models are run alike."""
    models.original_source = _source(original, original_proto, models.original)
    models.optimized_source = _source(optimized, optimized_proto, models.optimized)
    at_run = half_weights_at_run([original_proto, optimized_proto], provider)
    resident = [weight_bytes(p) + session_copies(p, provider, at_run=at_run) for p in (original_proto, optimized_proto)]
    if plan is None:
        check_memory(max(resident), "verify")
    else:
        check_memory(plan.largest_weights, f"verify in {len(plan.original)} segments (its largest segment)")
    if at_run:
        at_once = max(session_copies(p, provider, at_run=True) for p in (original_proto, optimized_proto))
        models.weights_policy = "weights: " + half_weights_policy("in both models alike", at_once)
    return at_run


def _models(
    original: onnx.ModelProto, optimized: onnx.ModelProto, norms: Sequence[FusedNorm], label: str, failure: str | None
) -> _Models:
    output_names = [value.name for value in original.graph.output]
    opt_names = {value.name for value in optimized.graph.output}
    extra_orig = [name for norm in norms for name in [norm.original_y, *(o for _, o in norm.inputs)] if name]
    extra_opt = [name for norm in norms for name in [norm.y, *(o for o, _ in norm.inputs)]]
    return _Models(
        with_outputs(original, extra_orig) if norms else original,
        with_outputs(optimized, extra_opt) if norms else optimized,
        label,
        list(dict.fromkeys(output_names + extra_orig)),
        list(dict.fromkeys([n for n in output_names if n in opt_names] + extra_opt)),
        failure,
    )


def _optimized_session(models: _Models, config: RuntimeConfig, level: OptLevel) -> Any:
    """The optimized model's session; None (and the failure recorded) when ONNX Runtime rejects it, which is a
    parity failure, not a usage error."""
    if models.optimized_failure is not None:
        return None
    try:
        source = models.optimized_source if models.optimized_source is not None else models.optimized
        return create_session(source, config.replace(optimization=level), label="it")
    except RuntimeUnavailableError:
        raise
    except SessionError as err:
        models.optimized_failure = f"the optimized model does not run: {err}"
        return None


def _golden_runs(
    models: _Models, samples: Sequence[Mapping[str, np.ndarray]], golden: GoldenMethod, threads: int | None
) -> tuple[Results | None, str, list[str]]:
    """The float64 results of the original for every sample, the form that ran, and warnings."""
    evaluator = GoldenEvaluator(models.original, golden, threads)
    if evaluator.method == "none":
        return None, "none", []
    results: Results = []
    for sample in samples:
        result = evaluator.run(sample, models.original_fetch)
        if result is None:
            return None, "none", ["the float64 golden evaluation failed; compared with the original only"]
        results.append(result)
    models.golden_form = evaluator.form
    return results, evaluator.method, []


def _run(
    models: _Models,
    samples: Sequence[Mapping[str, np.ndarray]],
    config: RuntimeConfig,
    compare: CompareOptions,
    hint: str,
) -> _Runs:
    """Runs the original, its float64 evaluation and the optimized model on every sample, one model at a time:
    each session is freed before the next is made, so that the weights of only one are resident."""
    source = models.original_source if models.original_source is not None else models.original
    session = create_session(source, config, label=models.original_label)
    original: Results = []
    for sample in samples:
        try:
            original.append(run_model(session, sample, models.original_fetch, label=models.original_label))
        except SessionError as err:
            raise SessionError(f"{err}{hint}") from err
    del session
    golden_results, method, warnings = _golden_runs(models, samples, compare.golden, config.threads)
    runs = _Runs(original, [], golden_results, method, None, warnings)
    session = _optimized_session(models, config, compare.optimized_optimization)
    for sample in samples if session is not None else []:
        try:
            runs.optimized.append(run_model(session, sample, models.optimized_fetch, label="it"))
        except SessionError as err:
            models.optimized_failure = f"the optimized model does not run: {err}"
            break
    del session
    runs.optimized_failure = models.optimized_failure
    return runs


def _plan(models: _Models, setting: int | str, provider: Provider) -> segments.Plan | None:
    """The segment plan, None for the whole models: `setting` "auto" cuts only when the whole models would not fit
    the memory available (into twice as many segments as their weights need), a count cuts into that many."""
    if setting in ("off", 1) or models.optimized_failure is not None:
        return None
    protos = (models.original, models.optimized)
    resident = max(weight_bytes(p) + session_copies(p, provider) for p in protos)
    if setting == "auto":
        room = available_memory() - HEADROOM
        if resident <= room:
            return None
        count = max(2, 2 * math.ceil(resident / max(room, 1)))
    else:
        count = int(setting)
    try:
        return segments.plan(models.original, models.optimized, count)
    except segments.PlanError as err:
        if setting == "auto":  # the whole-model memory check then says why it cannot run
            logger.warning("verify cannot cut the models into %d segments: %s", count, err)
            return None
        raise model_inputs.InputError(f"--segments {count}: {err}") from None


def _configure(
    models: _Models, given: tuple[Any, Any], protos: tuple[onnx.ModelProto, onnx.ModelProto], options: VerifyOptions
) -> tuple[segments.Plan | None, bool, RuntimeConfig]:
    """The segment plan (None: the whole models), whether half-precision weights are cast where used, and the
    sessions' configuration, once the memory is known to suffice for what runs at once."""
    runtime, compare = options.runtime, options.compare
    plan = _plan(models, compare.segments, runtime.provider)
    at_run = _set_sources(models, *given, *protos, runtime.provider, plan)
    level = compare.original_optimization
    config = RuntimeConfig(runtime.provider, runtime.threads, level, runtime.device_id, half_weights_at_run=at_run)
    return plan, at_run, config


def _execute(
    plan: segments.Plan | None,
    models: _Models,
    samples: Sequence[Mapping[str, np.ndarray]],
    config: RuntimeConfig,
    compare: CompareOptions,
    hint: str,
) -> _Runs:
    """The whole models one after the other, or segment by segment when there is a plan."""
    if plan is None:
        return _run(models, samples, config, compare, hint)
    return _run_plan(plan, models, samples, config, compare)


def _run_plan(
    plan: segments.Plan,
    models: _Models,
    samples: Sequence[Mapping[str, np.ndarray]],
    config: RuntimeConfig,
    compare: CompareOptions,
) -> _Runs:
    """`_run`, segment by segment (onnx_norm/parity/segmented.py)."""
    golden = (compare.golden, config.threads)
    pair = (models.original, models.optimized)
    done = segmented.run(plan, pair, samples, config, golden, compare.optimized_optimization)
    form = f"{len(plan.original)} segments (the largest reads {plan.largest_weights / 2**20:.1f} MiB of weights)"
    runs = _Runs(
        done.original, done.optimized, done.golden, done.golden_method, done.optimized_failure, [], form, done.cuts
    )
    models.optimized_failure = done.optimized_failure
    models.golden_form = "segment by segment" if done.golden is not None else ""
    return runs


def _compare_outputs(
    output_names: Sequence[str],
    optimized: onnx.ModelProto,
    runs: _Runs,
    tolerances: ToleranceSpec,
    original: onnx.ModelProto,
) -> list[Comparison]:
    """Every output of the original against the optimized model's, each judged by the narrowest float type on its
    path in the original (onnx_norm/parity/precision.py)."""
    present = {value.name for value in optimized.graph.output}
    paths = precision.narrowest_on_path(original, output_names)
    outputs: list[Comparison] = []
    for name in output_names:
        dtype = runs.original[0][name].dtype
        computed = precision.narrower(paths.get(name), dtype)
        tolerance = tolerances.for_output(name, dtype, computed)
        failure = runs.optimized_failure or (None if name in present else "missing from the optimized model")
        if failure is not None:
            shape = list(runs.original[0][name].shape)
            outputs.append(Comparison(name, dtype.name, shape, tolerance, False, failure))
            continue
        golden = None if runs.golden is None else [g[name] for g in runs.golden]
        optimized = [r[name] for r in runs.optimized]
        original_values = [r[name] for r in runs.original]
        outputs.append(compare(name, optimized, original_values, tolerance, golden, compute_dtype=computed))
    return outputs


def verify(
    original: str | Path | onnx.ModelProto | model_io.ModelFile | Any,
    optimized: str | Path | onnx.ModelProto | model_io.ModelFile | Any,
    options: VerifyOptions | None = None,
    *,
    inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    **kwargs: Unpack[VerifyKwargs],
) -> ParityReport:
    """Checks that `optimized` computes what `original` computes (the rules: the docstring of onnx_norm.parity).

    The options are a `VerifyOptions` (`onnx_norm.options`), or keyword arguments named as its fields (applied on
    top of `options` when both are given): `shapes` maps an input to its dims or a symbolic dim to its value
    (`{"sequence": 8}`), `values` sets inputs (`{"sr": 16000}`); `atol`/`rtol` are one value or {output: value}
    ("*" for the rest). `allow_nonfinite` passes an output NaN/Inf everywhere in both models, or whose NaN/Inf
    pattern differs from the original's (the report names the rows). Options are validated as the CLI's are.
    `inputs` are samples to run instead of generated ones.

    Raises `onnx_norm.inputs.InputError` for bad options, an original that is not a valid model and inputs that do
    not fit the models, and `onnx_norm.sessions.SessionError` when the original cannot be run or the machine
    cannot run the models as asked (library not built, CUDA unavailable). An optimized model that is not valid,
    or that ONNX Runtime rejects or fails to run, is a failed report.
    """
    start = time.perf_counter()
    options = VerifyOptions.build(options, "verify", **kwargs)
    tolerances = tolerance_spec(options.compare)
    original_label = model_label("original", original)
    original_proto = model_io.load_proto(original, resolve_external=True)
    optimized_proto, optimized_failure = _load_optimized(optimized)
    model_inputs.check_same_inputs(original_proto, optimized_proto)
    output_names = [value.name for value in original_proto.graph.output]
    tolerances.check_names(output_names)
    sample_list, hint, input_notes = _samples(original_proto, inputs, options.input)
    compare, runtime = options.compare, options.runtime
    norms = find_fused_norms(original_proto, optimized_proto) if compare.per_node and not optimized_failure else []
    models = _models(original_proto, optimized_proto, norms, original_label, optimized_failure)
    plan, at_run, config = _configure(models, (original, optimized), (original_proto, optimized_proto), options)
    level = compare.original_optimization
    runs = _execute(plan, models, sample_list, config, compare, hint)
    outputs = _compare_outputs(output_names, optimized_proto, runs, tolerances, original_proto)
    norm_results = _compare_norms(original_proto, norms, runs, tolerances)
    passed = all(item.passed for item in outputs) and not any(norm.status == "diverges" for norm in norm_results)
    return ParityReport(
        passed=passed,
        outputs=outputs,
        norms=norm_results,
        samples=len(sample_list),
        shapes={name: list(array.shape) for name, array in sample_list[0].items()},
        input_values=input_notes,
        provider=runtime.provider,
        original_optimization=level,
        golden=runs.golden_method,
        golden_form=models.golden_form if runs.golden_method != "none" else "",
        half_weights_at_run=at_run,
        weights_policy=models.weights_policy,
        form=runs.form,
        cuts=runs.cuts,
        seed=options.input.seed,
        elapsed_s=time.perf_counter() - start,
        warnings=_warnings(sample_list, runs, norm_results),
    )


def _compare_norms(
    original: onnx.ModelProto, norms: Sequence[FusedNorm], runs: _Runs, tolerances: ToleranceSpec
) -> list[NormComparison]:
    """Every fused norm against the value it replaced, with the original norm's own-type numerics beside it."""
    if runs.optimized_failure:
        return []
    numerics = _narrow_numerics(original, norms, runs) if norms else {}
    results = [_compare_norm(norm, runs, tolerances) for norm in norms]
    for result in results:
        result.numerics = numerics.get(result.node)
    return results


def _warnings(samples: Sequence[Mapping[str, np.ndarray]], runs: _Runs, norms: Sequence[NormComparison]) -> list[str]:
    warnings = _nonfinite_inputs(samples) + runs.warnings
    # An input dim the model fixes to 0 (ONNX Runtime runs no other size) leaves nothing to compare: say so.
    empty = [f"{name!r} {list(array.shape)}" for name, array in runs.original[0].items() if np.size(array) == 0]
    if empty:
        warnings.append(f"output(s) {', '.join(empty)} hold no values on these inputs: nothing of them was compared")
    unmapped = [norm.node for norm in norms if norm.status == "unmapped"]
    if unmapped:
        warnings.append(f"no original value found for fused norm(s) {', '.join(unmapped)}")
    return warnings


def _narrow_numerics(original: onnx.ModelProto, norms: Sequence[FusedNorm], runs: _Runs) -> dict[str, Any]:
    """Each mapped norm of the original evaluated in its own types on the first sample (parity/numerics.py)."""
    from onnx_norm.parity.numerics import narrow_numerics

    values = {
        norm.node: (norm.original_y, [o for _, o in norm.inputs if o is not None])
        for norm in norms
        if norm.original_y is not None and all(o is not None for _, o in norm.inputs)
    }
    fused = {norm.node: runs.optimized[0][norm.y] for norm in norms if norm.y in runs.optimized[0]}
    return narrow_numerics(original, values, runs.original[0], fused)


def _compare_norm(norm: FusedNorm, runs: _Runs, tolerances: ToleranceSpec) -> NormComparison:
    if norm.original_y is None:
        return NormComparison(norm.node, norm.op_type, norm.rule, None, norm.y, None, None, "unmapped")

    mapped_inputs = [(o, g) for o, g in norm.inputs if g is not None]
    # The norm computes in its inputs' type: an fp16 norm whose result the original widens to a float32 output is
    # judged with fp16's tolerance, as the whole model's output is (computed in it on its path).
    computed_in = min(
        (runs.original[0][name].dtype for name in [norm.original_y, *(g for _, g in mapped_inputs)]),
        key=lambda dtype: (dtype.kind != "f", dtype.itemsize),
    )

    def pair(opt_name: str, orig_name: str, *, widen: bool = False) -> Comparison:
        dtype = runs.original[0][orig_name].dtype
        judged = computed_in if orig_name == norm.original_y else dtype
        optimized = [r[opt_name] for r in runs.optimized]
        original = [r[orig_name] for r in runs.original]
        if widen and optimized[0].dtype != dtype:
            # An input the rewrite widened in front of the op (an fp16 X cast to fp32): exact, so compare the
            # original's value widened the same way.
            original = [np.asarray(a).astype(optimized[0].dtype) for a in original]
        return compare(
            opt_name,
            optimized,
            original,
            tolerances.for_output("*", judged),
            None if runs.golden is None else [g[orig_name] for g in runs.golden],
            compute_dtype=judged if judged != dtype else None,
        )

    output = pair(norm.y, norm.original_y)
    inputs_match = all(pair(o, g, widen=True).passed for o, g in mapped_inputs) if mapped_inputs else None
    if output.passed:
        status = "ok"
    elif inputs_match is False:
        status = "input differs"
    else:
        status = "diverges"
    return NormComparison(norm.node, norm.op_type, norm.rule, norm.original_y, norm.y, output, inputs_match, status)
