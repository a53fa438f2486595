"""Every subcommand through a table of bad inputs and outputs: exit 2, one line on stderr naming the problem, no
traceback, and nothing written or changed (every file in the working directory byte-identical afterwards).

The models are tiny (one decomposed LayerNorm over 16 values) and every case fails before any timing loop, so the
whole table runs in seconds. `/proc` stands for a directory nobody may write in: it refuses new files even to
root, whom permission bits do not stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from model_builders import HIDDEN, layer_norm_model, snapshot

import onnx_norm
from onnx_norm.cli import main

UNWRITABLE = Path("/proc/onnx-norm-test")


@dataclass
class Files:
    root: Path

    def __getattr__(self, name: str) -> str:
        names = {
            "good": "good.onnx",
            "opt": "good.opt.onnx",
            "other": "other_inputs.onnx",
            "empty": "empty.onnx",
            "truncated": "truncated.onnx",
            "text": "notes.onnx",
            "folder": "folder.onnx",
            "invalid": "no_opset.onnx",
            "shared": "shared/model.orig.onnx",
            "shared_out": "shared/model.onnx",
            "missing": "missing.onnx",
            "new": "new.onnx",
            "report": "report.json",
            "no_dir": "no/such/dir/out.onnx",
            "sample": "sample.npz",
        }
        return str(self.root / names[name])


@pytest.fixture
def files(tmp_path: Path) -> Files:
    model = layer_norm_model()
    onnx.save(model, tmp_path / "good.onnx")
    optimized, report = onnx_norm.optimize(model)
    assert report.fused == 1
    onnx.save(optimized, tmp_path / "good.opt.onnx")
    onnx.save(layer_norm_model("hidden_states"), tmp_path / "other_inputs.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    data = (tmp_path / "good.onnx").read_bytes()
    (tmp_path / "truncated.onnx").write_bytes(data[: len(data) // 2])
    (tmp_path / "notes.onnx").write_text("these are my notes, not a model\n")
    (tmp_path / "folder.onnx").mkdir()
    np.savez(tmp_path / "sample.npz", x=np.zeros((1, 4, HIDDEN), np.float32))
    invalid = layer_norm_model()
    del invalid.opset_import[:]
    onnx.save(invalid, tmp_path / "no_opset.onnx")
    # What `mv model.onnx model.orig.onnx` leaves: the weights still in model.onnx.data.
    (tmp_path / "shared").mkdir()
    onnx.save(
        layer_norm_model(),
        tmp_path / "shared" / "model.orig.onnx",
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    return Files(tmp_path)


# (id, argv from the files, text the one line must contain)
CASES = [
    # inspect
    ("inspect-missing", lambda f: ["inspect", f.missing], "no such file"),
    ("inspect-empty", lambda f: ["inspect", f.empty], "empty file, not an ONNX model"),
    ("inspect-truncated", lambda f: ["inspect", f.truncated], "not a readable ONNX model"),
    ("inspect-not-onnx", lambda f: ["inspect", f.text], "not a"),
    ("inspect-directory", lambda f: ["inspect", f.folder], "is a directory"),
    ("inspect-invalid", lambda f: ["inspect", f.invalid], "not a valid ONNX model: model with IR version"),
    ("inspect-report-unwritable", lambda f: ["inspect", f.good, "--report", f"{UNWRITABLE}/r.json"], "cannot write"),
    ("inspect-report-no-dir", lambda f: ["inspect", f.good, "--report", f.no_dir], "does not exist"),
    ("inspect-report-is-input", lambda f: ["inspect", f.good, "--report", f.good], "is the input model"),
    ("inspect-report-is-dir", lambda f: ["inspect", f.good, "--report", f.folder], "is a directory"),
    # optimize
    ("optimize-missing", lambda f: ["optimize", f.missing, "-o", f.new], "no such file"),
    ("optimize-empty", lambda f: ["optimize", f.empty, "-o", f.new], "empty file"),
    ("optimize-truncated", lambda f: ["optimize", f.truncated, "-o", f.new], "not a readable ONNX model"),
    ("optimize-not-onnx", lambda f: ["optimize", f.text, "-o", f.new], "not a"),
    ("optimize-directory", lambda f: ["optimize", f.folder, "-o", f.new], "is a directory"),
    ("optimize-invalid", lambda f: ["optimize", f.invalid, "-o", f.new], "not a valid ONNX model"),
    ("optimize-same-path", lambda f: ["optimize", f.good, "-o", f.good], "is the input model; pass --force"),
    ("optimize-shared-data", lambda f: ["optimize", f.shared, "-o", f.shared_out], "external data file of"),
    ("optimize-onto-directory", lambda f: ["optimize", f.good, "-o", f.folder], "is a directory"),
    ("optimize-read-only-dir", lambda f: ["optimize", f.good, "-o", f"{UNWRITABLE}/out.onnx"], "cannot write -o"),
    ("optimize-no-dir", lambda f: ["optimize", f.good, "-o", f.no_dir], "does not exist"),
    ("optimize-bad-report", lambda f: ["optimize", f.good, "-o", f.new, "--report", f.no_dir], "--report"),
    ("optimize-report-is-output", lambda f: ["optimize", f.good, "-o", f.new, "--report", f.new], "same file"),
    (
        "optimize-bad-verify-report",
        lambda f: ["optimize", f.good, "-o", f.new, "--verify", "--verify-report", f"{UNWRITABLE}/v.json"],
        "cannot write --verify-report",
    ),
    (
        "optimize-verify-report-is-input",
        lambda f: ["optimize", f.good, "-o", f.new, "--verify", "--verify-report", f.good],
        "is the input model",
    ),
    (
        "optimize-verify-report-without-verify",
        lambda f: ["optimize", f.good, "-o", f.new, "--verify-report", f.report],
        "--verify-report needs --verify",
    ),
    ("optimize-negative-atol", lambda f: ["optimize", f.good, "-o", f.new, "--verify", "--atol", "-1"], ">= 0"),
    (
        "optimize-atol-names-no-output",
        lambda f: ["optimize", f.good, "-o", f.new, "--verify", "--atol", "typo:1e-3"],
        "atol names 'typo', which is not an output of the model (outputs: y)",
    ),
    (
        "optimize-huge-shape",
        lambda f: ["optimize", f.good, "-o", f.new, "--verify", "--shape", "sequence:100000000000"],
        "give smaller dims with --shape",
    ),
    # verify
    ("verify-missing-original", lambda f: ["verify", f.missing, f.opt], "original model not found"),
    ("verify-missing-optimized", lambda f: ["verify", f.good, f.missing], "optimized model not found"),
    ("verify-empty", lambda f: ["verify", f.good, f.empty], "empty file"),
    ("verify-truncated", lambda f: ["verify", f.truncated, f.opt], "not a readable ONNX model"),
    ("verify-not-onnx", lambda f: ["verify", f.good, f.text], "not a"),
    ("verify-directory", lambda f: ["verify", f.folder, f.opt], "is a directory"),
    ("verify-invalid-original", lambda f: ["verify", f.invalid, f.opt], "not a valid ONNX model"),
    ("verify-report-unwritable", lambda f: ["verify", f.good, f.opt, "--report", f"{UNWRITABLE}/r.json"], "cannot"),
    ("verify-report-no-dir", lambda f: ["verify", f.good, f.opt, "--report", f.no_dir], "does not exist"),
    ("verify-report-is-input", lambda f: ["verify", f.good, f.opt, "--report", f.opt], "is the input model"),
    ("verify-report-is-data", lambda f: ["verify", f.shared, f.opt, "--report", f"{f.shared_out}.data"], "external"),
    (
        "verify-report-is-input-data",
        lambda f: ["verify", f.good, f.opt, "--inputs", f.sample, "--report", f.sample],
        "is an input data file",
    ),
    (
        "verify-report-is-named-input-data",
        lambda f: ["verify", f.good, f.opt, "--inputs", f"x:{f.sample}", "--report", f.sample],
        "is an input data file",
    ),
    ("verify-negative-atol", lambda f: ["verify", f.good, f.opt, "--atol", "-1"], "atol -1.0 must be"),
    ("verify-negative-rtol", lambda f: ["verify", f.good, f.opt, "--rtol", "y:-0.5"], "rtol y:-0.5 must be"),
    ("verify-atol-typo", lambda f: ["verify", f.good, f.opt, "--atol", "typo:1e-3"], "atol names 'typo'"),
    ("verify-bad-golden", lambda f: ["verify", f.good, f.opt, "--golden", "bogus"], "invalid choice: 'bogus'"),
    ("verify-huge-shape", lambda f: ["verify", f.good, f.opt, "--shape", "sequence:100000000000"], "GiB per sample"),
    ("verify-different-inputs", lambda f: ["verify", f.good, f.other], "different inputs"),
    # bench
    ("bench-missing", lambda f: ["bench", f.missing], "original model not found"),
    ("bench-empty", lambda f: ["bench", f.good, f.empty], "empty file"),
    ("bench-truncated", lambda f: ["bench", f.truncated], "not a readable ONNX model"),
    ("bench-not-onnx", lambda f: ["bench", f.text], "not a"),
    ("bench-directory", lambda f: ["bench", f.folder], "is a directory"),
    ("bench-invalid", lambda f: ["bench", f.invalid], "not a valid ONNX model"),
    ("bench-different-inputs", lambda f: ["bench", f.good, f.other, "--repeat", "1"], "different inputs"),
    ("bench-huge-shape", lambda f: ["bench", f.good, f.opt, "--shape", "sequence:100000000000"], "GiB per sample"),
    ("bench-report-unwritable", lambda f: ["bench", f.good, f.opt, "--report", f"{UNWRITABLE}/b.json"], "cannot"),
    ("bench-report-is-input", lambda f: ["bench", f.good, f.opt, "--report", f.good], "is the input model"),
    (
        "bench-report-is-input-data",
        lambda f: ["bench", f.good, f.opt, "--inputs", f.sample, "--report", f.sample],
        "is an input data file",
    ),
    ("bench-plot-no-dir", lambda f: ["bench", f.good, f.opt, "--plot", f.no_dir], "does not exist"),
    ("bench-negative-repeat", lambda f: ["bench", f.good, f.opt, "--repeat", "0"], "--repeat must be > 0"),
    (
        "bench-cuda-graph-on-cpu",
        lambda f: ["bench", f.good, f.opt, "--cuda-graph"],
        "--cuda-graph needs --provider cuda",
    ),
    # demo
    ("demo-out-is-file", lambda f: ["demo", "--out", f.good], "is a file, not a directory"),
    ("demo-out-unwritable", lambda f: ["demo", "--out", f"{UNWRITABLE}/demo"], "cannot"),
    ("demo-bad-shape", lambda f: ["demo", "--shape", "sequence:abc"], "dims must be integers"),
    ("demo-negative-warmup", lambda f: ["demo", "--warmup", "-1"], "--warmup must be >= 0"),
]


@pytest.mark.parametrize(("argv", "message"), [pytest.param(argv, msg, id=name) for name, argv, msg in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_written(files: Files, capfd, argv, message):
    before = snapshot(files.root)
    arguments = argv(files)
    try:
        code = main(arguments)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    captured = capfd.readouterr()  # file descriptors: ONNX Runtime's own log lines would show here
    command = arguments[0]
    assert code == 2, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"onnx-norm {command}: error: "), lines[0]
    assert message in lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert snapshot(files.root) == before


def test_force_allows_writing_over_the_input(files: Files, capfd):
    assert main(["optimize", files.good, "-o", files.good, "--force"]) == 0
    assert any(node.domain == "onnx_norm" for node in onnx.load(files.good).graph.node)
