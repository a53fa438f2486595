"""The docs describe the house as it is: every file they quote (`name.py`, `path/to/file.cc`) is in the repository,
and every class-like name they quote (`FuseNormsPass`, `RowKernelFor`) is in its sources. A rename that leaves the
docs behind fails here; the few names that are meant to be outside the repository are listed with their reason."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FILE = re.compile(r"[\w./-]+\.(?:py|cc|cu|cuh|h|sh|md|toml|json|mjs)")
_CLASS_LIKE = re.compile(r"[A-Z][a-z]+(?:[A-Z][a-z0-9]*)+")
_SOURCES = (".py", ".cc", ".cu", ".cuh", ".h", ".sh", ".toml", ".mjs", ".js", ".cmake", ".txt")

#: Quoted on purpose although not in the repository, each with its reason.
ELSEWHERE = {
    "onnxruntime_c_api.h": "ONNX Runtime's header, fetched at build time",
    "onnxruntime_cxx_api.h": "ONNX Runtime's header, fetched at build time",
    "../shared/tools/ort-gpu-parts.sh": "the workplace's tool beside the repository",
    ".ortgpu/install.sh": "written by that tool",
    "gpu_check.json": "written by the GPU run",
    "genai_config.json": "a file of an ONNX Runtime GenAI model folder",
    "workflow.json": "an Olive workflow a user writes",
    "out/model_config.json": "a file an Olive run writes",
    "olive/olive_config.json": "a file of the olive-ai package",
    "graph_transform_test_layernorm.cc": "ONNX Runtime's test source the fusion cases are rebuilt from",
    "ChooseModulatedConfig": "a former name, in the history of the GroupNorm worked example",
    "node_modules/onnxruntime-web/docs/webgpu-operators.md": "onnxruntime-web's own list, installed by npm",
    "onnxruntime/core/providers/webgpu/webgpu_execution_provider.cc": "ONNX Runtime's source, read for targets.md",
    "docs/operators.md": "a file of another project's documentation, quoted in targets.md",
}


def _tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False).stdout.split()
    return listed or [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]


def _quoted(doc: Path) -> list[str]:
    return [token.strip() for token in re.findall(r"`([^`\n]+)`", doc.read_text())]


def missing_names(docs: list[Path], files: list[str], sources: str) -> list[str]:
    """`doc: name` for every quoted file or class-like name that is neither in the repository nor in ELSEWHERE."""
    names = {Path(f).name for f in files}
    found = []
    for doc in docs:
        for token in _quoted(doc):
            if token in ELSEWHERE:
                continue
            if _FILE.fullmatch(token):
                if (
                    token not in files
                    and Path(token).name not in names
                    and not any(f.endswith("/" + token) for f in files)
                ):
                    found.append(f"{doc.name}: {token}")
            elif _CLASS_LIKE.fullmatch(token) and len(token) >= 6 and token not in sources:
                found.append(f"{doc.name}: {token}")
    return found


def test_the_check_finds_a_stale_name(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text("`onnx_norm/gone.py` and `RenamedPass` and `onnx_norm/cli/verify.py` and `FuseNormsPass`\n")
    assert missing_names([doc], ["onnx_norm/cli/verify.py"], "class FuseNormsPass:") == [
        "page.md: onnx_norm/gone.py",
        "page.md: RenamedPass",
    ]


def test_every_file_and_name_the_docs_quote_exists() -> None:
    files = _tracked()
    sources = "\n".join(
        (ROOT / f).read_text(errors="ignore") for f in files if f.endswith(_SOURCES) and (ROOT / f).is_file()
    )
    missing = missing_names(DOCS, files, sources)
    if missing:
        pytest.fail("names the docs quote that the repository lacks:\n" + "\n".join(missing))
