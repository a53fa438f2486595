"""The CLI as a user types it (a subprocess of the `onnx-norm` script): --version, -v/-q anywhere, reports that name
their models and versions, readable output when piped, one line when nothing was found, the hint for native norms,
Ctrl-C, and third-party log records without tracebacks. Where the process itself proves nothing (what is printed on
stdout, the exit code, a report's content), the same `main` runs in the test's process: each `onnx-norm` process
pays ~2 CPU-s of imports before its work."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from cli_support import cli, in_process, onnx_norm_command
from onnx import TensorProto, helper
from repo_paths import EXAMPLES

LLAMA = EXAMPLES / "llama-rmsnorm-dynamo-fp32.onnx"
BERT = EXAMPLES / "bert-layernorm-opset13.onnx"


def test_version_names_onnx_norm_and_onnxruntime() -> None:
    import onnxruntime

    import onnx_norm

    done = cli("--version")
    assert done.returncode == 0
    assert f"onnx-norm {onnx_norm.__version__}" in done.stdout
    assert f"onnxruntime {onnxruntime.__version__}" in done.stdout


HEAVY_MODULES = ("onnx", "onnxruntime", "onnx_norm.rewrite", "onnx_norm.parity")


@pytest.mark.parametrize(
    ("argv", "imported"),
    [
        (["--version"], []),
        (["--help"], []),
        (["verify", "--help"], []),
        (["inspect", "--help"], ["onnx", "onnx_norm.rewrite"]),  # its --target and rule names come from the rewrite
    ],
)
def test_the_cli_imports_only_what_the_named_subcommand_needs(argv: list[str], imported: list[str]) -> None:
    """Every CLI process would otherwise pay ~1.8 CPU-s importing the rewrite and ONNX before parsing its flags."""
    script = (
        "import sys\n"
        "from onnx_norm.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print([m for m in {HEAVY_MODULES!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", script, *argv], check=True, capture_output=True, text=True)
    assert json.loads(done.stdout.splitlines()[-1].replace("'", '"')) == imported


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_and_quiet_are_accepted_before_and_after_the_subcommand(where: str) -> None:
    verbose = ["-v", "inspect", BERT] if where == "before" else ["inspect", BERT, "-v"]
    done = cli(*verbose)
    assert done.returncode == 0 and "INFO onnx_norm" in done.stderr
    quiet = ["-q", "inspect", BERT] if where == "before" else ["inspect", BERT, "-q"]
    done = cli(*quiet)
    assert done.returncode == 0 and "INFO" not in done.stderr and "5 norm(s) found" in done.stdout


def test_inspect_piped_keeps_rule_names_whole() -> None:
    done = cli("inspect", LLAMA)
    assert done.returncode == 0
    rows = [line for line in done.stdout.splitlines() if "rms_norm" in line]
    # One row per norm, each with its whole rule name (at 80 columns rich cut them into "skip_rms_…" or two lines).
    assert len(rows) == 5
    assert sum(1 for row in rows if "skip_rms_norm" in row) == 4


def test_nothing_found_is_one_line_and_our_function_bodies_are_not_near_misses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    optimized = tmp_path / "llama.opt.onnx"
    assert in_process(capsys, "optimize", LLAMA, "-o", optimized)[0] == 0
    # The optimized model carries our ops' function bodies (decomposed norms); they are ours, not the model's.
    assert any(function.domain == "onnx_norm" for function in onnx.load(str(optimized)).functions)
    code, out, _ = in_process(capsys, "inspect", optimized, "--explain")
    assert code == 0
    assert out.strip() == "no decomposed norm and no near-miss found"
    code, out, _ = in_process(capsys, "optimize", optimized, "-o", tmp_path / "again.onnx")
    assert code == 0
    assert out.splitlines() == ["no decomposed norm found", f"wrote {tmp_path / 'again.onnx'}"]


def test_reports_name_their_models_and_versions(tmp_path: Path) -> None:
    import onnxruntime

    import onnx_norm

    out, report = tmp_path / "bert.opt.onnx", tmp_path / "optimize.json"
    assert cli("optimize", BERT, "-o", out, "--report", report).returncode == 0
    verify = tmp_path / "verify.json"
    assert cli("verify", BERT, out, "--report", verify, "--samples", "1").returncode == 0
    bench = tmp_path / "bench.json"
    done = cli("bench", BERT, out, "--report", bench, "--warmup", "1", "--repeat", "3", "--sessions", "1", "--no-noopt")
    assert done.returncode == 0, done.stderr
    expected = {
        report: ("optimize", {"input": str(BERT), "output": str(out)}),
        verify: ("verify", {"original": str(BERT), "optimized": str(out)}),
        bench: ("bench", {"original": str(BERT), "optimized": str(out)}),
    }
    for path, (command, models) in expected.items():
        run = json.loads(path.read_text())["run"]
        assert run["models"] == models
        assert run["versions"]["onnx-norm"] == onnx_norm.__version__
        assert run["versions"]["onnxruntime"] == onnxruntime.__version__
        assert run["command"][:2] == ["onnx-norm", command]


def test_optimize_verify_report_names_the_kept_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, report = tmp_path / "bert.opt.onnx", tmp_path / "parity.json"
    argv = ("optimize", BERT, "-o", out, "--verify", "--verify-report", report, "--samples", "1")
    assert in_process(capsys, *argv)[0] == 0
    assert json.loads(report.read_text())["run"]["models"] == {"original": str(BERT), "optimized": str(out)}


def _many_norms(path: Path, count: int) -> None:
    """A chain of `count` decomposed RMSNorms: seconds of matching and proving, time to press Ctrl-C."""
    nodes, inits, x = [], [helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6])], "x"
    for i in range(count):
        nodes += [
            helper.make_node("Mul", [x, x], [f"sq{i}"]),
            helper.make_node("ReduceMean", [f"sq{i}"], [f"m{i}"], axes=[-1]),
            helper.make_node("Add", [f"m{i}", "eps"], [f"me{i}"]),
            helper.make_node("Sqrt", [f"me{i}"], [f"r{i}"]),
            helper.make_node("Div", [x, f"r{i}"], [f"y{i}"]),
        ]
        x = f"y{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, 16])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


# The CLI with the rewrite held inside its matching step until the signal comes: interrupting a real run at a
# chosen moment raced the rewrite, which finishes 400 norms in under a second on a quiet machine.
# SIGINT handled as Python handles it when started from a terminal: a test worker may ignore SIGINT (its controller
# handles Ctrl-C), and an ignored signal stays ignored across exec, so the child would sleep through it.
_HELD_IN_THE_REWRITE = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from onnx_norm.cli import main
from onnx_norm.rewrite import fuse_pass

def held(*args, **kwargs):
    print("held in the rewrite", file=sys.stderr, flush=True)
    time.sleep(60)

fuse_pass.driver.fuse = held
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_is_one_line_exit_130_and_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "chain.onnx"
    _many_norms(source, 4)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    argv = ["-v", "optimize", str(source), "-o", str(out_dir / "chain.opt.onnx"), "--report", str(out_dir / "r.json")]
    command = [sys.executable, "-c", _HELD_IN_THE_REWRITE, *argv]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        assert process.stderr is not None
        seen = []
        for line in process.stderr:  # wait until the rewrite is under way
            seen.append(line)
            if "held in the rewrite" in line:
                break
        assert any("matching and proving norms" in line for line in seen), seen
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=50)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert stderr.strip().splitlines()[-1] == "onnx-norm: interrupted; nothing written"
    assert stdout == ""
    assert list(out_dir.iterdir()) == []  # no output, no report, no staging folder


def test_third_party_log_records_carry_no_traceback() -> None:
    """onnx_ir logs a failed shape inference with its exception (`exc_info`): one line with -v, hidden without,
    the traceback only with -vv."""
    script = (
        "import logging, sys\n"
        "from onnx_norm.cli import _configure_output\n"
        "_configure_output(int(sys.argv[1]))\n"
        "try:\n"
        "    raise ValueError('inference failed\\nsecond line')\n"
        "except ValueError as err:\n"
        "    log = logging.getLogger('onnx_ir.passes.common.shape_inference')\n"
        "    log.warning('Shape inference failed', exc_info=err)\n"
    )
    lines = {}
    for verbose in (0, 1, 2):
        done = subprocess.run(
            [sys.executable, "-c", script, str(verbose)], check=True, capture_output=True, text=True, timeout=60
        )
        lines[verbose] = done.stderr.splitlines()
    assert lines[0] == []
    assert lines[1] == [
        "WARNING onnx_ir.passes.common.shape_inference: Shape inference failed (ValueError: inference failed)"
    ]
    assert "Traceback (most recent call last):" in lines[2]


@pytest.mark.parametrize(
    ("other", "difference"),
    [
        (BERT, "different outputs: the optimized model's 'pooler_output' (fp32, rank 2) not in the original"),
        (
            EXAMPLES / "llama-rmsnorm-fp16.onnx",
            "output 'last_hidden_state' (fp32, rank 3) in the original is 'last_hidden_state' (fp16, rank 3)",
        ),
    ],
)
def test_bench_refuses_models_that_do_not_correspond(tmp_path: Path, other: Path, difference: str) -> None:
    report = tmp_path / "bench.json"
    done = cli("bench", EXAMPLES / "llama-rmsnorm-fp32.onnx", other, "--report", report)
    assert done.returncode == 2
    assert done.stderr.startswith("onnx-norm bench: error: llama-rmsnorm-fp32.onnx and ")
    assert difference in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not report.exists()


def _with_terminal_stderr(argv: list[str | Path]) -> tuple[int, str, str]:
    """Runs `onnx-norm ARGV` with stderr on a pseudo-terminal (as in an interactive shell) and stdout piped."""
    import pty
    import select

    primary, secondary = pty.openpty()
    command = [*onnx_norm_command(), *map(str, argv)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=secondary, text=True) as process:
        os.close(secondary)
        terminal = b""
        while True:
            ready, _, _ = select.select([primary], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(primary, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                terminal += chunk
            elif process.poll() is not None:
                break
        stdout = process.stdout.read() if process.stdout else ""
    os.close(primary)
    return process.wait(), stdout, terminal.decode(errors="replace")


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["verify", LLAMA, LLAMA, "--samples", "1"], "verify: loading the models and running both"),
        (["bench", LLAMA, LLAMA, "--warmup", "1", "--repeat", "40", "--sessions", "1"], ": timing"),
    ],
)
def test_progress_on_a_terminal_only(argv: list[str | Path], shown: str) -> None:
    code, stdout, terminal = _with_terminal_stderr(argv)
    assert code == 0
    assert shown in terminal  # on the terminal (stderr) ...
    assert shown not in stdout  # ... never in the results
    piped = cli(*argv)
    assert piped.returncode == 0
    assert shown not in piped.stdout and shown not in piped.stderr


def _half_model(path: Path, *, nudge: float = 0.0) -> None:
    """y = float32(x * w) in float16 with w = 1: a float16 model with a float32 output; `nudge` scales y by 1 + nudge
    in float32 (2^-12: farther from the exact result than float32's tolerances allow, but by less than one float16
    ulp; 0.05: beyond float16's tolerance)."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["p"]), helper.make_node("Cast", ["p"], ["y"], to=TensorProto.FLOAT)]
    initializers = [helper.make_tensor("w", TensorProto.FLOAT16, [64], [1.0] * 64)]
    if nudge:
        nodes[-1].output[0] = "c"
        nodes.append(helper.make_node("Mul", ["c", "k"], ["y"]))
        initializers.append(helper.make_tensor("k", TensorProto.FLOAT, [], [1.0 + nudge]))
    graph = helper.make_graph(
        nodes,
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])],
        initializers,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))


def test_float16_model_with_float32_outputs_is_judged_as_float16_and_a_failure_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original, nudged, changed = tmp_path / "half.onnx", tmp_path / "half.nudged.onnx", tmp_path / "half.changed.onnx"
    _half_model(original)
    _half_model(nudged, nudge=2.0**-12)
    _half_model(changed, nudge=0.05)
    code, stdout, _ = in_process(capsys, "verify", original, nudged)
    assert code == 0, stdout
    assert "judged as float16" in " ".join(stdout.split())
    code, stdout, _ = in_process(capsys, "verify", original, changed)
    assert code == 1
    out = " ".join(stdout.split())
    assert "output 'y' (float32) was compared with atol=0.01 rtol=0.01 (the defaults of float16" in out
    assert "--atol/--rtol y:VALUE" in out
    # The flag the hint names sets the tolerance against the original; the float64 check, which finds the
    # nudged model less accurate whatever the tolerance, is off here (--golden none).
    flags = ["--atol", "y:0.5", "--rtol", "y:0.5", "--golden", "none"]
    assert in_process(capsys, "verify", original, changed, *flags)[0] == 0


def test_an_original_that_does_not_reproduce_itself_is_said_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Here: NaN everywhere (sqrt(-|x| - 1)), as T5 in float16 overflows; the same exit for outputs that change from
    run to run."""
    original, copy = tmp_path / "nan.onnx", tmp_path / "copy.onnx"
    nodes = [
        helper.make_node("Abs", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["n"]),
        helper.make_node("Sub", ["n", "one"], ["m"]),
        helper.make_node("Sqrt", ["m"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "nan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, str(original))
    onnx.save(model, str(copy))
    report = tmp_path / "parity.json"
    code, out, err = in_process(capsys, "verify", original, copy, "--report", report)
    assert code == 2
    assert err.startswith("onnx-norm verify: error: the original model does not reproduce itself")
    assert "FAILED" not in out  # the optimized model is not blamed
    assert not report.exists()


@pytest.fixture(scope="module")
def dynamo_bert() -> Path:
    """A tiny Hugging Face BERT through the dynamo exporter, which writes LayerNormalization itself."""
    pytest.importorskip("transformers")
    from onnx_norm import zoo

    try:
        return zoo.export("bert", "dynamo", "fp32").path
    except zoo.ZooExportError as err:
        pytest.skip(f"exporter failure: {err}")


def test_native_norms_point_at_take_over_native(dynamo_bert: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = in_process(capsys, "inspect", dynamo_bert, "--explain")
    assert code == 0
    assert out.strip() == (
        "no decomposed norm and no near-miss found; the model already has native norm ops (5 LayerNormalization), "
        "left as they are; `onnx-norm optimize --take-over-native` moves them onto onnx-norm's kernels"
    )


def test_demo_does_not_present_its_temporary_folder_as_an_output() -> None:
    done = cli("demo", "--model", "bert-layernorm-opset13", "--warmup", "1", "--repeat", "5", "--sessions", "1")
    assert done.returncode == 0, done.stderr
    assert "wrote bert-layernorm-opset13.optimized.onnx (into a temporary folder deleted when the demo ends" in (
        " ".join(done.stdout.split())
    )
    assert not any(line.startswith("wrote /") for line in done.stdout.splitlines())


@pytest.mark.parametrize(
    ("model", "opset", "op", "was"),
    [(LLAMA, 23, "RMSNormalization", 20), (BERT, 17, "LayerNormalization", 13)],
    ids=["llama-dynamo-rms-23", "bert-layer-norm-17"],
)
def test_opset_raises_the_model_so_target_onnx_fuses_and_verify_passes(tmp_path, model, opset, op, was) -> None:
    out, report = tmp_path / "fused.onnx", tmp_path / "report.json"
    done = cli("optimize", model, "-o", out, "--target", "onnx", "--opset", opset, "--verify", "--report", report)
    assert done.returncode == 0, done.stderr
    assert f"default opset raised from {was} to {opset} (onnx's version converter)" in done.stdout
    assert "PASSED" in done.stdout  # the gate compared OUT with the unconverted input
    written = onnx.load(out, load_external_data=False)
    assert {o.domain: o.version for o in written.opset_import}[""] == opset
    assert sum(node.op_type == op for node in written.graph.node) == 5
    data = json.loads(report.read_text())
    assert data["opset_raised"] == {"from": was, "to": opset} and data["fused"] == 5


@pytest.mark.parametrize(
    ("opset", "message"),
    [
        ("17", "cannot lower the model's default opset 20 to 17: the opset is only raised"),
        ("twenty-three", "argument --opset: not an opset number: 'twenty-three'"),
        (str(onnx.defs.onnx_opset_version() + 1), f"is not one the installed onnx {onnx.__version__} knows"),
    ],
    ids=["below-the-models", "not-a-number", "above-onnxs"],
)
def test_opset_refusals_are_one_line_and_write_nothing(tmp_path, opset, message) -> None:
    out = tmp_path / "fused.onnx"
    done = cli("optimize", LLAMA, "-o", out, "--target", "onnx", "--opset", opset)
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not out.exists()


def test_opset_a_conversion_the_converter_cannot_do_is_one_line(tmp_path) -> None:
    # ONNX Runtime's LayerNormalization in the ONNX domain at opset 16 (which it loads): no adapter from 16.
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"])
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 8]) for name in ("x", "s", "y")]
    graph = helper.make_graph([node], "g", values[:2], values[2:])
    model = tmp_path / "ln16.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)], ir_version=8), model)
    done = cli("inspect", model, "--target", "onnx", "--opset", "23")
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "cannot raise the opset from 16 to 23: onnx's version converter: " in line
    assert "No Adapter From Version $16 for LayerNormalization" in line


def test_opset_is_refused_for_a_genai_folder(tmp_path) -> None:
    folder = tmp_path / "genai"
    folder.mkdir()
    done = cli("optimize", folder, "-o", tmp_path / "out", "--opset", "23")
    assert done.returncode == 2 and "--opset takes one model, not a GenAI model folder" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["inside", "same"])
def test_a_folder_written_into_itself_is_refused_before_any_work(tmp_path, where: str) -> None:
    """The other files of a folder are copied into the output: an output inside the input would be copied into
    itself, level after level (a 13 GB model folder filled the disk)."""
    folder = tmp_path / "genai"
    folder.mkdir()
    shutil.copy(EXAMPLES / "llama-rmsnorm-dynamo-fp32.onnx", folder / "model.onnx")
    (folder / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"filename": "model.onnx"}}}))
    before = sorted(p.name for p in folder.rglob("*"))
    output = folder / "optimized" if where == "inside" else folder
    done = cli("optimize", folder, "-o", output, "--verify", "--force")
    assert done.returncode == 2, done.stderr
    assert ("inside the input folder" if where == "inside" else "is the input folder") in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in folder.rglob("*")) == before  # nothing written, no staging folder left
