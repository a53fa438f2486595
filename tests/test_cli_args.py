"""The CLI's argument groups (onnx_norm/cli/args.py): a command line without flags configures the API call exactly
as a call without arguments does, because flags and signatures read one table of defaults (onnx_norm.defaults)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from onnx_norm import bench, defaults, parity
from onnx_norm.cli import UsageError, build_parser
from onnx_norm.cli import args as common
from onnx_norm.cli import bench as bench_cli
from onnx_norm.cli import verify as verify_cli


def _api_defaults(function: Callable[..., Any]) -> dict[str, Any]:
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


def _same(value: Any) -> Any:
    """An empty list of input files and an empty tuple are the same option."""
    return list(value) if isinstance(value, (list, tuple)) else value


def _assert_cli_matches_api(kwargs: dict[str, Any], function: Callable[..., Any]) -> None:
    api = _api_defaults(function)
    assert set(kwargs) <= set(api), set(kwargs) - set(api)
    mismatched = {key: (value, api[key]) for key, value in kwargs.items() if _same(value) != _same(api[key])}
    assert not mismatched, f"CLI default != API default: {mismatched}"


def test_verify_without_flags_is_verify_without_arguments():
    kwargs = verify_cli.parity_kwargs(build_parser().parse_args(["verify", "a.onnx", "b.onnx"]))
    assert kwargs["samples"] == defaults.SAMPLES == 2  # the CLI's long-standing default, which users rely on
    _assert_cli_matches_api(kwargs, parity.verify)
    # check_options is the validation both share: its defaults must not be a third opinion.
    _assert_cli_matches_api(kwargs, parity.check_options)


def test_bench_without_flags_is_bench_without_arguments():
    kwargs = bench_cli.bench_kwargs(build_parser().parse_args(["bench", "a.onnx"]))
    assert kwargs["sessions_per_variant"] == defaults.SESSIONS_PER_VARIANT == 3
    _assert_cli_matches_api(kwargs, bench.bench)


def test_optimize_verify_takes_the_same_parity_defaults_as_verify():
    optimize_args = build_parser().parse_args(["optimize", "a.onnx", "-o", "b.onnx", "--verify"])
    verify_args = build_parser().parse_args(["verify", "a.onnx", "b.onnx"])
    assert verify_cli.parity_kwargs(optimize_args) == verify_cli.parity_kwargs(verify_args)


def test_each_group_parses_its_own_flags_into_api_arguments():
    parsed = build_parser().parse_args(
        ["verify", "a.onnx", "b.onnx", "--atol", "1e-3", "logits:0.5", "--shape", "sequence:8", "--samples", "3"]
    )
    assert common.ToleranceArgs().parse(parsed)["atol"] == {"*": 1e-3, "logits": 0.5}
    assert common.InputArgs().parse(parsed) == {
        "input_files": [],
        "shapes": {"sequence": (8,)},
        "samples": 3,
        "seed": 0,
    }
    assert common.RuntimeArgs().parse(parsed) == {"provider": "cpu", "threads": None, "device_id": 0}


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
    assert bench_cli.bench_kwargs(build_parser().parse_args(["bench", "a.onnx"]))["cuda_graph"] is False
    parsed = build_parser().parse_args(["bench", "a.onnx", "--provider", "cuda", "--cuda-graph"])
    assert common.CudaGraphArgs().parse(parsed) == {"cuda_graph": True}
    assert bench_cli.bench_kwargs(parsed)["provider"] == "cuda"


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
