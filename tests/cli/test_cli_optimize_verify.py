"""`optimize --verify` on one model and on a GenAI folder: each model is read once per process (the rewrite and the
parity gate share the input as read; the gate reads the staged output once), the gate's options are parsed once
(typed objects passed down, no flags parsed again per model), and `--segments` runs the gate as `verify` does."""

from __future__ import annotations

import collections
import json
import os
import shutil
import traceback
from pathlib import Path

import onnx
import pytest
from cli_support import in_process
from test_cli_routes import EXAMPLES

from onnx_norm import model_io
from onnx_norm.cli import args as cli_args

MODEL = EXAMPLES / "llama-rmsnorm-fp32.onnx"  # 5 RMSNorms: a plan of 2 segments cuts between them
FLAGS = ("--samples", "1", "--shape", "sequence:16")


def _by_the_harness() -> bool:
    """Whether this read is conftest's check that every written model loads in ONNX Runtime, not the command's."""
    return any(Path(frame.filename).name == "written_models.py" for frame in traceback.extract_stack())


class Reads:
    """Every read of a model file by the command, by resolved path: `model_io.read_proto` (every loader of the
    package reads through it) and any other `onnx.load` of a path (a session's signature, a folder's shapes)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: collections.Counter[Path] = collections.Counter()
        real_read, real_load, inside = model_io.read_proto, onnx.load, []

        def read_proto(path: str | os.PathLike, **kwargs: object) -> onnx.ModelProto:
            self.counts[Path(path).resolve()] += 1
            inside.append(path)
            try:
                return real_read(path, **kwargs)
            finally:
                inside.pop()

        def load(f: object, *args: object, **kwargs: object) -> onnx.ModelProto:
            if not inside and isinstance(f, (str, os.PathLike)) and not _by_the_harness():
                self.counts[Path(f).resolve()] += 1
            return real_load(f, *args, **kwargs)

        monkeypatch.setattr(model_io, "read_proto", read_proto)
        monkeypatch.setattr(onnx, "load", load)

    def of(self, path: Path) -> int:
        return self.counts[path.resolve()]

    def elsewhere(self, folder: Path) -> dict[str, int]:
        """The reads of files outside `folder` (the staged outputs), by file name."""
        counts: collections.Counter[str] = collections.Counter()
        for path, count in self.counts.items():
            if not path.is_relative_to(folder.resolve()):
                counts[path.name] += count
        return dict(counts)


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """How often each of the gate's argument groups parses its flags."""
    parses: collections.Counter[str] = collections.Counter()
    for group in (cli_args.ToleranceArgs, cli_args.InputArgs, cli_args.RuntimeArgs):
        real = group.parse

        def parse(self: object, args: object, real: object = real, name: str = group.__name__) -> object:
            parses[name] += 1
            return real(self, args)  # type: ignore[operator]

        monkeypatch.setattr(group, "parse", parse)
    return parses


@pytest.mark.parametrize(("tolerance", "code"), [((), 0), (("--atol", "0", "--rtol", "0"), 1)])
def test_optimize_verify_reads_each_model_once_and_parses_its_options_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tolerance: tuple, code: int
) -> None:
    """Passed, and failed (the failure also checks the original against itself: still no second read)."""
    source = tmp_path / "in" / "m.onnx"
    source.parent.mkdir()
    shutil.copy(MODEL, source)
    out = tmp_path / "out.onnx"
    reads, parses = Reads(monkeypatch), _count_parses(monkeypatch)
    done = in_process(capsys, "optimize", source, "-o", out, "--verify", *FLAGS, *tolerance)
    assert done[0] == code, done[2]
    assert reads.of(source) == 1
    assert reads.elsewhere(source.parent) == {"out.onnx": 1}  # the staged OUT, read by the gate
    assert dict(parses) == {"ToleranceArgs": 1, "InputArgs": 1, "RuntimeArgs": 1}
    assert out.is_file() == (code == 0)


def _genai_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "genai"
    folder.mkdir()
    for name in ("decoder.onnx", "vision.onnx"):
        shutil.copy(MODEL, folder / name)
    config = {"model": {"decoder": {"filename": "decoder.onnx"}, "vision": {"filename": "vision.onnx"}}}
    (folder / "genai_config.json").write_text(json.dumps(config))
    return folder


def test_the_genai_route_reads_each_model_once_and_parses_its_options_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, out = _genai_folder(tmp_path), tmp_path / "out"
    reads, parses = Reads(monkeypatch), _count_parses(monkeypatch)
    done = in_process(capsys, "optimize", folder, "-o", out, "--verify", *FLAGS)
    assert done[0] == 0, done[2]
    assert done[1].count("PASSED | Runtime") == 2
    assert reads.of(folder / "decoder.onnx") == reads.of(folder / "vision.onnx") == 1
    assert reads.elsewhere(folder) == {"decoder.onnx": 1, "vision.onnx": 1}  # each staged model, by its gate
    assert dict(parses) == {"ToleranceArgs": 1, "InputArgs": 1, "RuntimeArgs": 1}
    assert sorted(path.name for path in out.iterdir() if path.suffix == ".onnx") == ["decoder.onnx", "vision.onnx"]


def test_a_failed_gate_on_a_genai_folder_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, out = _genai_folder(tmp_path), tmp_path / "out"
    code, stdout, _ = in_process(
        capsys, "optimize", folder, "-o", out, "--verify", *FLAGS, "--atol", "0", "--rtol", "0"
    )
    assert code == 1
    assert "FAILED parity gate on decoder" in stdout and not out.exists()
    assert [path.name for path in tmp_path.iterdir()] == ["genai"]  # no staging folder left behind


def _form_and_outputs(report: Path) -> tuple[bool, str, dict[str, float]]:
    data = json.loads(report.read_text())
    return data["passed"], data["form"], {o["name"]: o["metrics"]["max_abs"] for o in data["outputs"]}


@pytest.mark.parametrize("tolerance", [(), ("--atol", "0", "--rtol", "0")])
def test_optimize_verify_in_segments_gives_the_verdict_of_the_whole_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tolerance: tuple
) -> None:
    results = {}
    for setting in ("off", "2"):
        report = tmp_path / f"parity-{setting}.json"
        argv = ("optimize", MODEL, "-o", tmp_path / "out.onnx", "--verify", "--verify-report", report, "--force")
        code, stdout, _ = in_process(capsys, *argv, *FLAGS, *tolerance, "--segments", setting)
        results[setting] = (code, *_form_and_outputs(report))
        assert ("form: 2 segments" in stdout) == (setting == "2")
    (code_off, passed_off, form_off, off), (code_cut, passed_cut, form_cut, cut) = results["off"], results["2"]
    assert form_off == "whole model" and form_cut.startswith("2 segments")
    assert code_off == code_cut == (1 if tolerance else 0) and passed_off == passed_cut
    assert off.keys() == cut.keys()
    for name, value in off.items():
        assert cut[name] == pytest.approx(value, abs=1e-6)


def test_the_genai_route_honours_segments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _genai_folder(tmp_path)
    for setting, shown in (("2", 2), ("off", 0)):
        out = tmp_path / f"out-{setting}"
        code, stdout, _ = in_process(capsys, "optimize", folder, "-o", out, "--verify", *FLAGS, "--segments", setting)
        assert code == 0
        assert stdout.count("form: 2 segments") == shown  # each model's gate, in segments or whole
    code, _, stderr = in_process(capsys, "optimize", folder, "-o", tmp_path / "bad", "--verify", "--segments", "x")
    assert code == 2 and "--segments 'x': expected auto, off or a number" in stderr
    assert not (tmp_path / "bad").exists()
