"""Running both models and the float64 evaluation segment by segment (the plan: onnx_norm/parity/segments.py): one
segment's session at a time, its weights memory-mapped for its run and freed after, each chain carrying its own
activations across the cuts (the original's, the optimized model's and the float64 ones), so that the outputs are
what the whole models give, within rounding. The cuts are compared as they pass, to name the first segment where
the two models part."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from onnx_norm.parity.golden import GoldenEvaluator
from onnx_norm.parity.segments import Plan, Segment, segment_model
from onnx_norm.parity.tolerances import ToleranceSpec
from onnx_norm.sessions import RuntimeConfig, SessionError, create_session, run_model

logger = logging.getLogger(__name__)

Results = list[dict[str, np.ndarray]]


@dataclasses.dataclass
class Chain:
    """What one model's segments gave so far: the graph outputs fetched, and the values carried at the last cut."""

    results: Results
    carried: list[dict[str, np.ndarray]]
    failure: str | None = None


@dataclasses.dataclass
class SegmentedRuns:
    original: Results
    optimized: Results
    golden: Results | None
    golden_method: str
    optimized_failure: str | None
    #: Per cut: whether the carried values of the two models agreed within the default tolerances, and the largest
    #: difference; the first that did not is where the models part.
    cuts: list[dict[str, object]]


def _run_segment(
    model: onnx.ModelProto,
    segment: Segment,
    chain: Chain,
    samples: Sequence[Mapping[str, np.ndarray]],
    config: RuntimeConfig,
    label: str,
) -> None:
    """One segment of one model over every sample, in place on `chain`; a failure is recorded, not raised."""
    if chain.failure is not None:
        return
    proto = segment_model(model, segment, chain.carried[0], segment.outputs)
    try:
        session = create_session(proto, config, label=label)
        inputs = {i.name for i in session.get_inputs()}
        for index, sample in enumerate(samples):
            feeds = {k: v for k, v in {**sample, **chain.carried[index]}.items() if k in inputs}
            values = run_model(session, feeds, segment.outputs, label=label)
            chain.results[index].update(values)
            chain.carried[index] = values
    except SessionError as err:
        chain.failure = str(err)


def _golden_segment(
    model: onnx.ModelProto,
    segment: Segment,
    chain: Chain,
    samples: Sequence[Mapping[str, np.ndarray]],
    evaluator_args: tuple[str, int | None],
) -> str:
    """The float64 evaluation of one of the original's segments, in place on `chain`; returns the method that ran
    ("none" when it could not: the models are then compared with each other only)."""
    if chain.failure is not None:
        return "none"
    method, threads = evaluator_args
    proto = segment_model(model, segment, chain.carried[0], segment.outputs)
    inputs = {value.name for value in proto.graph.input}
    evaluator = GoldenEvaluator(proto, method, threads)  # type: ignore[arg-type]
    if evaluator.method == "none":
        chain.failure = "no float64 evaluation"
        return "none"
    for index, sample in enumerate(samples):
        feeds = {k: v for k, v in {**sample, **chain.carried[index]}.items() if k in inputs}
        values = evaluator.run(feeds, segment.outputs)
        if values is None:
            chain.failure = "the float64 evaluation failed"
            return "none"
        chain.results[index].update(values)
        chain.carried[index] = values
    return evaluator.method


def _compare_cut(original: Chain, optimized: Chain, names: Sequence[str], tolerances: ToleranceSpec) -> dict:
    from onnx_norm.parity.verdict import compare

    if original.failure or optimized.failure:
        return {"values": list(names), "passed": False, "max_abs": None}
    worst, passed = 0.0, True
    for name in names:
        a = [carried[name] for carried in optimized.carried]
        b = [carried[name] for carried in original.carried]
        result = compare(name, a, b, tolerances.for_output("*", np.asarray(b[0]).dtype))
        passed = passed and result.passed
        if result.metrics is not None and np.isfinite(result.metrics.max_abs):
            worst = max(worst, float(result.metrics.max_abs))
    return {"values": list(names), "passed": passed, "max_abs": worst}


def run(
    plan: Plan,
    models: tuple[onnx.ModelProto, onnx.ModelProto],
    samples: Sequence[Mapping[str, np.ndarray]],
    config: RuntimeConfig,
    golden: tuple[str, int | None],
    optimized_level: str,
) -> SegmentedRuns:
    """Both models and the float64 evaluation of the original, segment by segment (`golden`: method and threads;
    `optimized_level`: ORT's optimizations for the optimized model). A failure of the original raises SessionError
    (it is the reference); one of the optimized model is recorded."""
    original, optimized = models
    chains = [Chain([{} for _ in samples], [{} for _ in samples]) for _ in range(3)]
    orig, opt, exact = chains
    method = golden[0]
    cuts: list[dict[str, object]] = []
    optimized_config = config.replace(optimization=optimized_level)  # type: ignore[arg-type]
    for index, (seg_orig, seg_opt) in enumerate(zip(plan.original, plan.optimized, strict=True)):
        where = f"segment {index + 1} of {len(plan.original)}"
        _run_segment(original, seg_orig, orig, samples, config, f"the original ({where})")
        if orig.failure is not None:
            raise SessionError(orig.failure)
        if method != "none":
            method = _golden_segment(original, seg_orig, exact, samples, golden)
        _run_segment(optimized, seg_opt, opt, samples, optimized_config, f"the optimized model ({where})")
        if index < len(plan.cuts):
            cuts.append(_compare_cut(orig, opt, plan.cuts[index], ToleranceSpec()))
    failure = None if opt.failure is None else f"the optimized model does not run: {opt.failure}"
    golden_results = exact.results if method != "none" and exact.failure is None else None
    return SegmentedRuns(orig.results, opt.results, golden_results, method, failure, cuts)
