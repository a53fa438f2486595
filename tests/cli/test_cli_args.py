"""The CLI's argument groups (onnx_norm/cli/args.py): a command line without flags configures the API call exactly
as a call without arguments does, because flags and signatures read one table of defaults (onnx_norm.defaults)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from onnx_norm import defaults
from onnx_norm.cli import UsageError, build_parser
from onnx_norm.cli import args as common
from onnx_norm.cli import bench as bench_cli
from onnx_norm.cli import verify as verify_cli
from onnx_norm.options import BenchOptions, InputOptions, MeasureOptions, RuntimeOptions, VerifyOptions


def _api_defaults(function: Callable[..., Any]) -> dict[str, Any]:
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


def test_verify_without_flags_is_verify_without_arguments():
    options = verify_cli.parity_options(build_parser().parse_args(["verify", "a.onnx", "b.onnx"]))
    assert options.input.samples == defaults.SAMPLES == 2  # the CLI's long-standing default, which users rely on
    # verify() without arguments runs VerifyOptions(): the CLI's defaults must not be a second opinion.
    assert options == VerifyOptions()
    assert options.flat() == VerifyOptions.build(None).flat()


def test_bench_without_flags_is_bench_without_arguments():
    options = bench_cli.bench_options(build_parser().parse_args(["bench", "a.onnx"]))
    assert options.measure.sessions_per_variant == defaults.SESSIONS_PER_VARIANT == 3
    assert options == BenchOptions()


def test_optimize_verify_takes_the_same_parity_defaults_as_verify():
    optimize_args = build_parser().parse_args(["optimize", "a.onnx", "-o", "b.onnx", "--verify"])
    verify_args = build_parser().parse_args(["verify", "a.onnx", "b.onnx"])
    assert verify_cli.parity_options(optimize_args) == verify_cli.parity_options(verify_args)


def test_each_group_parses_its_own_flags_into_api_options():
    parsed = build_parser().parse_args(
        ["verify", "a.onnx", "b.onnx", "--atol", "1e-3", "logits:0.5", "--shape", "sequence:8", "--samples", "3"]
    )
    assert common.ToleranceArgs().parse(parsed).atol == {"*": 1e-3, "logits": 0.5}
    assert common.InputArgs().parse(parsed) == InputOptions(shapes={"sequence": 8}, samples=3, seed=0)
    assert common.InputArgs().parse(parsed).shapes == {"sequence": (8,)}
    assert common.RuntimeArgs().parse(parsed) == RuntimeOptions("cpu", None, 0)


def test_the_bench_flags_reach_the_measure_options():
    flags = ["--sweep", "sequence:4,8", "--no-noopt", "--profile", "--warmup", "0", "--repeat", "2", "--sessions", "1"]
    measure = bench_cli.bench_options(build_parser().parse_args(["bench", "a.onnx", *flags])).measure
    assert measure == MeasureOptions(0, 2, 1, ("sequence", [4, 8]), include_unoptimized=False, profile=True)


@pytest.mark.parametrize(
    ("group", "flags", "message"),
    [
        (common.BenchSessionArgs(), ["--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (common.BenchSessionArgs(), ["--sessions", "0"], "--sessions must be > 0, got 0"),
        (common.RuntimeArgs(), ["--threads", "0"], "--threads must be > 0, got 0"),
        (common.RuntimeArgs(), ["--device-id", "-1"], "--device-id must be >= 0, got -1"),
    ],
)
def test_a_group_rejects_its_bad_values_by_flag_name(group, flags, message):
    parsed = build_parser().parse_args(["bench", "a.onnx", *flags])
    with pytest.raises(UsageError, match=message):
        group.parse(parsed)


def test_the_cuda_graph_flag_is_off_by_default_and_on_with_the_cuda_provider():
    assert bench_cli.bench_options(build_parser().parse_args(["bench", "a.onnx"])).measure.cuda_graph is False
    parsed = build_parser().parse_args(["bench", "a.onnx", "--provider", "cuda", "--cuda-graph"])
    assert common.CudaGraphArgs().parse(parsed) == {"cuda_graph": True}
    options = bench_cli.bench_options(parsed)
    assert options.runtime.provider == "cuda" and options.measure.cuda_graph


def test_the_cuda_graph_flag_without_the_cuda_provider_is_a_usage_error():
    parsed = build_parser().parse_args(["bench", "a.onnx", "--cuda-graph"])
    with pytest.raises(UsageError, match="--cuda-graph needs --provider cuda"):
        common.CudaGraphArgs().parse(parsed)


@pytest.mark.parametrize("command", [["inspect", "a.onnx"], ["optimize", "a.onnx", "-o", "b.onnx"]])
def test_the_target_flag_offers_the_rewrites_registry_and_its_default(command):
    from onnx_norm.rewrite import TARGETS, optimize

    parser = build_parser()
    assert parser.parse_args(command).target == defaults.TARGET == _api_defaults(optimize)["target"]
    for target in TARGETS:
        assert parser.parse_args([*command, "--target", target]).target == target
