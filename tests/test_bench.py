"""Mechanics of the bench (onnx_norm.bench and `onnx-norm bench`): interleaving, warm-up exclusion, statistics,
profile split, report fields and exit codes. No test asserts a speed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_norm import bench, sessions
from onnx_norm.cli.args import parse_sweep

HIDDEN = 16


class FakeClock:
    """A clock that advances only when a fake runner "runs"."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_runs_are_interleaved_round_by_round_in_shuffled_order_and_warmup_is_not_recorded():
    clock = FakeClock()
    calls: list[str] = []
    rounds_seen: list[tuple[int, int]] = []

    def runner(name: str, warm_cost: float, cost: float):
        def run() -> None:
            calls.append(name)
            in_warmup = len([c for c in calls if c == name]) <= 2
            clock.now += warm_cost if in_warmup else cost

        return run

    times = bench.interleave(
        {"A": runner("A", 100.0, 1.0), "B": runner("B", 100.0, 2.0)},
        warmup=2,
        repeat=3,
        clock=clock,
        progress=lambda done, total: rounds_seen.append((done, total)),
    )
    rounds = [calls[i : i + 2] for i in range(0, len(calls), 2)]
    assert all(sorted(r) == ["A", "B"] for r in rounds)  # each variant once per round
    assert {tuple(r) for r in rounds} == {("A", "B"), ("B", "A")}  # in a shuffled order (seeded)
    assert times == {"A": [1.0, 1.0, 1.0], "B": [2.0, 2.0, 2.0]}  # the 100 s warm-up runs are dropped
    assert rounds_seen == [(i, 5) for i in range(1, 6)]


def test_sessions_are_used_in_turn_one_per_round():
    used: list[int] = []
    run = bench._rotating([lambda i=i: used.append(i) for i in range(3)])
    for _ in range(7):
        run()
    assert used == [0, 1, 2, 0, 1, 2, 0]
    single = lambda: None  # noqa: E731
    assert bench._rotating([single]) is single


def test_interleave_rejects_nonsense_counts():
    with pytest.raises(ValueError, match="repeat >= 1"):
        bench.interleave({"A": lambda: None}, warmup=0, repeat=0)


def test_median_interval_is_the_order_statistic_interval():
    # The textbook ranks: n = 100 -> x(40), x(61); n = 10 -> x(2), x(9) (97.9%, the narrowest at or above 95%).
    assert bench.median_interval(np.arange(1, 101)[::-1]) == (40.0, 61.0)
    assert bench.median_interval(np.arange(1, 11)) == (2.0, 9.0)
    assert bench.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few rounds: the whole range
    rng = np.random.default_rng(0)
    covered = sum(lo <= 1.0 <= hi for lo, hi in (bench.median_interval(rng.lognormal(0, 1, 40)) for _ in range(400)))
    assert covered >= 0.93 * 400  # the median of lognormal(0, 1) is 1


def test_speedup_verdict_needs_the_interval_to_exclude_one():
    ones = [1.0] * 30
    faster = bench.Speedup.of([1.2 + 0.01 * (i % 5) for i in range(30)], ones)
    assert faster.verdict == "faster" and faster.ci_low > 1.0
    slower = bench.Speedup.of([0.8 + 0.01 * (i % 5) for i in range(30)], ones)
    assert slower.verdict == "slower" and slower.ci_high < 1.0
    noisy = bench.Speedup.of([0.9, 1.1] * 15, ones)
    assert noisy.verdict == "no measurable difference"
    assert noisy.ci_low <= noisy.median <= noisy.ci_high


def test_verdict_needs_every_session_pair_to_agree():
    ones = [1.0] * 30
    baseline = [1.2 + 0.01 * (i % 5) for i in range(30)]
    agreeing = bench.Speedup.of(baseline, ones, sessions=[i % 3 for i in range(30)])
    assert len(agreeing.per_session) == 3 and agreeing.verdict == "faster"
    # Session pair 3 of 4 reads slower (0.99) while the pooled interval is above 1: not called faster.
    split = [0.99 if i % 4 == 3 else b for i, b in enumerate(baseline)]
    disagreeing = bench.Speedup.of(split, ones, sessions=[i % 4 for i in range(30)])
    assert disagreeing.ci_low > 1.0
    assert disagreeing.per_session[3] == pytest.approx(0.99)
    assert disagreeing.verdict == "no measurable difference"
    assert bench.Speedup.of(baseline, ones, sessions=[0] * 30).per_session == []  # one session: nothing to compare


def test_speedup_is_the_median_of_paired_round_ratios_with_its_spread():
    baseline = [2.0, 4.0, 3.0, 10.0, 2.0]
    candidate = [1.0, 1.0, 3.0, 1.0, 2.0]  # ratios 2, 4, 1, 10, 1
    speedup = bench.Speedup.of(baseline, candidate)
    assert speedup.median == 2.0
    assert speedup.p10 == pytest.approx(np.percentile([2, 4, 1, 10, 1], 10))
    assert speedup.p90 == pytest.approx(np.percentile([2, 4, 1, 10, 1], 90))
    stats = bench.LatencyStats.of([0.001, 0.003, 0.002, 0.010])
    assert stats.median_ms == pytest.approx(2.5)
    assert stats.min_ms == pytest.approx(1.0)
    assert stats.runs == 4
    assert stats.p90_ms == pytest.approx(np.percentile([1, 3, 2, 10], 90))


def test_profile_events_split_into_norm_nodes_and_the_rest_per_run():
    def node(name: str, op: str, dur: float, ts: float) -> dict:
        return {"cat": "Node", "name": f"{name}_kernel_time", "dur": dur, "ts": ts, "args": {"op_name": op}}

    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 50},
        node("ln/Pow", "Pow", 1000, 1),  # first run: dropped
        {"cat": "Session", "name": "model_run", "ts": 100, "dur": 50},
        node("ln/Pow", "Pow", 10, 101),
        node("fused", "LayerNormalization", 20, 102),
        node("mm", "MatMul", 70, 103),
        {"cat": "Node", "name": "mm_fence_before", "dur": 5, "ts": 103},
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 50},
        node("ln/Pow", "Pow", 10, 201),
        node("fused", "LayerNormalization", 20, 202),
        node("mm", "MatMul", 70, 203),
    ]
    split = bench.split_profile_events(events, frozenset({"ln/Pow"}), runs=3, skip_first=True)
    assert split.norm_ms == pytest.approx(0.030)
    assert split.other_ms == pytest.approx(0.070)
    assert split.norm_nodes == 2
    assert split.norm_share == pytest.approx(0.3)


def _ln_models() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """A decomposed RMSNorm in the Reciprocal style that ORT does not fuse, and opset 23 RMSNormalization."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), "gamma"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])
    decomposed = [
        helper.make_node("Mul", ["x", "x"], ["sq"], name="rms/Mul"),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="rms/ReduceMean"),
        helper.make_node("Add", ["ms", "eps"], ["ms_eps"], name="rms/Add"),
        helper.make_node("Sqrt", ["ms_eps"], ["rms"], name="rms/Sqrt"),
        helper.make_node("Reciprocal", ["rms"], ["inv"], name="rms/Reciprocal"),
        helper.make_node("Mul", ["x", "inv"], ["n"], name="rms/Mul_1"),
        helper.make_node("Mul", ["n", "gamma"], ["y"], name="rms/Mul_2"),
    ]
    fused = [helper.make_node("RMSNormalization", ["x", "gamma"], ["y"], axis=-1, epsilon=1e-5, name="fused")]
    opset = [helper.make_opsetid("", 23)]
    original = helper.make_model(
        helper.make_graph(decomposed, "g", [x], [y], weights), opset_imports=opset, ir_version=10
    )
    optimized = helper.make_model(
        helper.make_graph(fused, "g", [x], [y], weights[:1]), opset_imports=opset, ir_version=10
    )
    return original, optimized


def test_bench_report_fields_for_one_shape_and_a_sweep():
    original, optimized = _ln_models()
    report = bench.bench(original, optimized, warmup=1, repeat=3, shapes={"sequence": [8]}, threads=1, profile=True)
    (point,) = report.points
    assert set(point.latency) == {bench.ORIGINAL, bench.OPTIMIZED, bench.UNOPTIMIZED}
    assert all(stats.runs == 3 and stats.median_ms > 0 for stats in point.latency.values())
    assert point.shapes == {"x": [1, 8, HIDDEN]}
    assert report.speedup == point.speedup.median > 0
    assert report.speedup_spread == (point.speedup.p10, point.speedup.p90)
    assert report.speedup_ci95 == (point.speedup.ci_low, point.speedup.ci_high)
    assert report.speedup_ci95[0] <= report.speedup <= report.speedup_ci95[1]
    assert report.verdict == point.speedup.verdict
    assert point.speedup_vs_noopt is not None
    assert not report.optimized_in_memory
    assert report.profile is not None
    assert report.profile[bench.OPTIMIZED].norm_nodes == 1  # the RMSNormalization node
    assert report.profile[bench.UNOPTIMIZED].norm_nodes == 7  # the decomposed nodes the optimized model lacks
    data = report.to_dict()
    assert data["speedup"] == report.speedup
    assert data["points"][0]["latency"]["optimized"]["runs"] == 3
    assert 0 <= data["profile"]["optimized"]["norm_share"] <= 1

    assert report.sessions_per_variant == 3  # the API's default, as the CLI's --sessions
    pooled = bench.bench(original, optimized, warmup=0, repeat=4, sessions_per_variant=2, include_unoptimized=False)
    assert pooled.sessions_per_variant == 2
    assert len(pooled.points[0].speedup.per_session) == 2
    assert all(stats.runs == 4 for stats in pooled.points[0].latency.values())
    with pytest.raises(bench.model_inputs.InputError, match="--sessions"):
        bench.bench(original, optimized, warmup=0, repeat=1, sessions_per_variant=0)

    swept = bench.bench(original, optimized, warmup=0, repeat=2, sweep=("sequence", [4, 8]), include_unoptimized=False)
    assert [p.dims for p in swept.points] == [{"sequence": 4}, {"sequence": 8}]
    assert [p.shapes["x"][1] for p in swept.points] == [4, 8]
    assert all(set(p.latency) == {bench.ORIGINAL, bench.OPTIMIZED} for p in swept.points)
    expected = float(np.exp(np.mean([np.log(p.speedup.median) for p in swept.points])))
    assert swept.speedup == pytest.approx(expected)


def test_a_plot_that_fails_half_way_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch):
    """--plot writes like every other output: staged next to PNG and renamed into place only when complete."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from onnx_norm import bench_plot

    original, optimized = _ln_models()
    report = bench.bench(original, optimized, warmup=0, repeat=2, sessions_per_variant=1, include_unoptimized=False)
    target = tmp_path / "speedup.png"
    bench_plot.plot(report, target)
    first = target.read_bytes()
    assert first[:4] == b"\x89PNG"

    def savefig_fails(self, path, *args, **kwargs):
        Path(path).write_bytes(b"half a PNG")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", savefig_fails)
    with pytest.raises(OSError, match="No space"):
        bench_plot.plot(report, target)
    assert target.read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == ["speedup.png"]


def _cli(argv: list[str]) -> int:
    from onnx_norm.cli import main

    return main(argv)


def test_bench_cli_writes_report_and_plot_and_gates_on_min_speedup(tmp_path: Path, capsys):
    original, optimized = _ln_models()
    onnx.save(original, tmp_path / "original.onnx")
    onnx.save(optimized, tmp_path / "optimized.onnx")
    base = [str(tmp_path / "original.onnx"), str(tmp_path / "optimized.onnx"), "--warmup", "0", "--repeat", "2"]
    code = _cli(
        [
            "bench",
            *base,
            "--sweep",
            "sequence:4,8",
            "--report",
            str(tmp_path / "b.json"),
            "--plot",
            str(tmp_path / "b.png"),
        ]
    )
    assert code == 0
    data = json.loads((tmp_path / "b.json").read_text())
    assert isinstance(data["speedup"], float)
    assert len(data["speedup_ci95"]) == 2 and data["verdict"]
    assert len(data["points"]) == 2
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "original (ORT_ENABLE_ALL)" in out
    assert "speedup" in out and "95% CI of the median" in out
    # A ratio no run can reach: the gate must fail with exit 1.
    assert _cli(["bench", *base, "--min-speedup", "1e9"]) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--shape", "nonexistent:1,2"], "neither an input nor a symbolic dim"),
        (["--repeat", "0"], "--repeat must be > 0"),
        (["--sessions", "0"], "--sessions must be > 0"),
        (["--sweep", "sequence"], "expected DIM:V1,V2"),
        (["--threads", "-1"], "--threads must be > 0"),
    ],
)
def test_bench_cli_usage_errors_exit_2(tmp_path: Path, capsys, extra, message):
    original, optimized = _ln_models()
    onnx.save(original, tmp_path / "original.onnx")
    onnx.save(optimized, tmp_path / "optimized.onnx")
    code = _cli(["bench", str(tmp_path / "original.onnx"), str(tmp_path / "optimized.onnx"), *extra])
    assert code == 2
    assert message in capsys.readouterr().err


def test_bench_cli_missing_model_exits_2(tmp_path: Path, capsys):
    assert _cli(["bench", str(tmp_path / "nope.onnx")]) == 2
    assert "not found" in capsys.readouterr().err


def test_parse_sweep():
    assert parse_sweep("sequence:64,128") == ("sequence", [64, 128])
    assert parse_sweep(None) is None


def test_bench_with_one_model_optimizes_it_in_memory(tmp_path: Path):
    example = Path(__file__).resolve().parents[1] / "examples" / "llama-rmsnorm-fp32.onnx"
    report = tmp_path / "b.json"
    code = _cli(
        ["bench", str(example), "--warmup", "0", "--repeat", "1", "--shape", "sequence:8", "--report", str(report)]
    )
    assert code == 0
    data = json.loads(report.read_text())
    assert data["optimized_in_memory"] is True
    assert data["points"][0]["shapes"] == {"input_ids": [1, 8], "attention_mask": [1, 8]}


def test_bench_cli_model_failing_at_run_time_is_a_one_line_error(tmp_path: Path, capsys):
    """A model that only runs at some shapes (a constant Reshape), benched at another: exit 2 and ORT's message."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence", HIDDEN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, HIDDEN])
    shape = numpy_helper.from_array(np.array([1, 4, HIDDEN], dtype=np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "g", [x], [y], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = tmp_path / "fixed.onnx"
    onnx.save(model, path)
    assert _cli(["bench", str(path), str(path), "--repeat", "1", "--warmup", "0", "--shape", "sequence:8"]) == 2
    err = capsys.readouterr().err
    assert f"failed to run the original model ({path}) on inputs x [1, 8, 16]" in err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1


def test_cuda_graph_needs_the_cuda_provider():
    original, optimized = _ln_models()
    with pytest.raises(ValueError, match="cuda_graph=True needs provider='cuda'"):
        bench.bench(original, optimized, cuda_graph=True, warmup=0, repeat=1)
    with pytest.raises(ValueError, match="CUDA graphs need the cuda provider"):
        sessions.RuntimeConfig(provider="cpu", cuda_graph=True)


def test_cuda_provider_options_turn_on_cuda_graphs_only_when_asked():
    """The providers argument ORT gets, built without creating a CUDA session (no GPU here)."""
    plain = sessions.providers(sessions.RuntimeConfig(provider="cuda", device_id=1))
    assert plain == [("CUDAExecutionProvider", {"device_id": "1"}), "CPUExecutionProvider"]
    graph = sessions.providers(sessions.RuntimeConfig(provider="cuda", cuda_graph=True))
    assert graph == [("CUDAExecutionProvider", {"device_id": "0", "enable_cuda_graph": "1"}), "CPUExecutionProvider"]
    assert sessions.providers(sessions.RuntimeConfig()) == ["CPUExecutionProvider"]


def _two_output_model() -> onnx.ModelProto:
    """x -> (LayerNormalization(x), Shape(x)): outputs of two element types, with symbolic dims."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])
    shape = helper.make_tensor_value_info("s", TensorProto.INT64, [3])
    gamma = numpy_helper.from_array(np.linspace(0.5, 1.5, HIDDEN, dtype=np.float32), "gamma")
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma"], ["y"], axis=-1, epsilon=1e-5),
        helper.make_node("Shape", ["x"], ["s"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y, shape], [gamma])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_outputs_bound_to_preallocated_ortvalues_give_the_ordinary_results_in_place():
    """The CUDA graph path's output binding, run on the CPU provider: shapes from one ordinary run (symbolic dims),
    every output written into its preallocated OrtValue, whose address does not change between runs."""
    config = sessions.RuntimeConfig(threads=1)
    session = sessions.create_session(_two_output_model(), config)
    assert sessions.static_output_shapes(session) is None  # batch and sequence are symbolic
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, HIDDEN)).astype(np.float32)}
    outputs = sessions.preallocate_outputs(session, feeds, "cpu")
    assert {name: value.shape() for name, value in outputs.items()} == {"y": [2, 5, HIDDEN], "s": [3]}
    assert outputs["s"].data_type() == "tensor(int64)"
    addresses = {name: value.data_ptr() for name, value in outputs.items()}
    runner = sessions.Runner(session, feeds, config, outputs=outputs)
    expected = runner.run()
    for _ in range(2):
        runner.run_bound()
        assert {name: value.data_ptr() for name, value in outputs.items()} == addresses
        for name, value in expected.items():
            np.testing.assert_array_equal(sessions.from_ortvalue(outputs[name]), value)
    assert [value.data_ptr() for value in runner._binding.get_outputs()] == list(addresses.values())


def test_static_output_shapes_need_no_run():
    static = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 3])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [static]),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=9,
    )
    session = sessions.create_session(model, sessions.RuntimeConfig())
    assert sessions.static_output_shapes(session) == {"y": [2, 3]}
    outputs = sessions.preallocate_outputs(session, {}, "cpu")  # no feeds: nothing is run
    assert outputs["y"].shape() == [2, 3] and outputs["y"].data_type() == "tensor(float16)"


def test_a_variant_ort_cannot_capture_is_left_out_only_when_it_is_the_unoptimized_reference(monkeypatch):
    """The policy for ORT's refusal (here raised in place of ORT's, since capture needs a GPU): original-noopt is
    reported and skipped; the original or the optimized model refusing leaves no speedup, so it is an error."""
    original, optimized = _ln_models()
    models = bench._load_models(original, optimized, include_unoptimized=True, provider="cpu")
    point = bench._Point({}, None, {"x": np.zeros((1, 4, HIDDEN), np.float32)})
    config = sessions.RuntimeConfig(provider="cuda", cuda_graph=True)
    refused = set()

    def graph_runners(proto, variant, feeds, count, label):
        if variant.optimization in refused:
            raise sessions.SessionError(f"CUDA graph not possible: ORT refused {label}")
        return []

    monkeypatch.setattr(bench, "_graph_runners", graph_runners)
    refused.add("disabled")
    runners, skipped = bench._runners(models, None, point, config, 1)
    assert set(runners) == {bench.ORIGINAL, bench.OPTIMIZED}
    assert skipped == {bench.UNOPTIMIZED: "CUDA graph not possible: ORT refused the original model"}
    refused.add("all")
    with pytest.raises(sessions.SessionError, match="CUDA graph not possible"):
        bench._runners(models, None, point, config, 1)


def test_onnx_norm_bench_stays_callable_after_its_module_is_imported(monkeypatch):
    """Importing onnx_norm.bench (bench_plot and the CLI do) sets the package's `bench` to the module: a second
    `onnx_norm.bench(...)` called a module (TypeError); the module calls the function."""
    import sys

    import onnx_norm
    import onnx_norm.bench_plot

    module = sys.modules["onnx_norm.bench"]
    monkeypatch.setattr(module, "bench", lambda *args, **kwargs: ("bench", args, kwargs))
    assert onnx_norm.bench("a.onnx", "b.onnx", repeat=1) == ("bench", ("a.onnx", "b.onnx"), {"repeat": 1})
