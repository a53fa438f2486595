"""Regenerate examples/: the small models that `onnx-norm demo` runs, built from Hugging Face configs with seeded
random weights (nothing is downloaded) and exported with torch's TorchScript and dynamo exporters.

    python tools/make_examples.py            # writes examples/*.onnx
    python tools/make_examples.py --check    # exits 1 if the committed files differ from a fresh export

The output is deterministic for fixed torch/transformers/onnx versions: the weights come from fixed seeds and
the exporter is given the same trace inputs every time.
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import re
import sys
import tempfile
from pathlib import Path

import onnx

from onnx_norm.zoo import ZOO, build_model, example_inputs
from onnx_norm.zoo.export import TRACE_SHAPE, Dtype, output_names_of, to_torch, write_onnx

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"


@dataclasses.dataclass(frozen=True)
class Example:
    file: str
    model: str  # zoo model name
    exporter: str
    dtype: Dtype
    what: str


EXAMPLES = (
    Example("llama-rmsnorm-fp32.onnx", "llama", "torchscript-17", "fp32", "LLaMA-style decoder, RMSNorm, fp32"),
    Example("llama-rmsnorm-fp16.onnx", "llama", "torchscript-17", "fp16", "LLaMA-style decoder, fp16"),
    Example("bert-layernorm-opset13.onnx", "bert", "torchscript-13", "fp32", "BERT-style encoder, LayerNorm, opset 13"),
    Example(
        "llama-rmsnorm-dynamo-fp32.onnx", "llama", "dynamo", "fp32", "LLaMA-style decoder, dynamo export (rsqrt), fp32"
    ),
    Example(
        "llama-rmsnorm-dynamo-fp16.onnx", "llama", "dynamo", "fp16", "LLaMA-style decoder, dynamo export (rsqrt), fp16"
    ),
)
#: Names for the dims of the text inputs, by position: dynamo writes s0, s1, ... (one symbol per input's batch).
DIM_NAMES = ("batch", "sequence")


def name_dims(proto: onnx.ModelProto) -> None:
    """Gives the inputs' symbolic dims the names the other examples use, everywhere they appear, so that one
    `--shape sequence:64` fits every example."""
    renames: dict[str, str] = {}
    for value in proto.graph.input:
        for dim, name in zip(value.type.tensor_type.shape.dim, DIM_NAMES, strict=False):
            if dim.dim_param:
                renames.setdefault(dim.dim_param, name)
    if not renames:
        return
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, renames)) + r")\b")
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = pattern.sub(lambda m: renames[m.group(1)], dim.dim_param)


def make(example: Example, out_dir: Path) -> Path:
    import torch

    spec = ZOO[example.model]
    model = build_model(spec, seed=0)
    trace = example_inputs(spec, *TRACE_SHAPE, seed=0)
    output_names = output_names_of(model, to_torch(trace, torch.float32))
    path = out_dir / example.file
    write_onnx(model, spec, example.exporter, example.dtype, trace, path, output_names)
    proto = onnx.load(path)
    name_dims(proto)
    proto.doc_string = f"onnx-norm example: {example.what}; made by tools/make_examples.py"
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=EXAMPLES_DIR, help="output directory (default: examples/)")
    parser.add_argument("--check", action="store_true", help="compare a fresh export with the files in --out")
    args = parser.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            stale = [e.file for e in EXAMPLES if not filecmp.cmp(make(e, Path(tmp)), args.out / e.file, shallow=False)]
        for name in stale:
            print(f"{args.out / name} differs from a fresh export: run tools/make_examples.py", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for example in EXAMPLES:
        path = make(example, args.out)
        print(f"{path} ({path.stat().st_size // 1024} KiB): {example.what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
