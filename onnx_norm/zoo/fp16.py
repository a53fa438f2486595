"""fp16 models whose norm statistics run in fp16, made the way the onnx-community / transformers.js pipeline makes
them: an fp32 export converted to float16 with the upcast `Cast(to=float)` of each RMSNorm turned into a Cast to
float16 (the "keep Casts out" conversion), so that x**2, its mean and the square root all run in fp16.

The fp32 parent is the zoo's toy LLaMA with its embedding table scaled to an RMS of `RESIDUAL_RMS`: a residual
stream of a few hundred, as trained LLMs carry (their massive activations reach thousands). Its fp16 norms then
square values past 65504 (fp16's largest) to inf, 1/sqrt(inf) is 0, and every norm's output, so the model's, is 0.

Converters: ONNX Runtime's `onnxruntime.transformers.float16` makes this spelling (every Cast to float becomes a Cast
to float16). onnxconverter-common 1.16's `convert_float_to_float16` cannot: with its default op_block_list it keeps
the norms' `Cast(to=float)` and records float16 after it (ONNX Runtime refuses the model: type error at the Cast),
and with `Cast` added to `op_block_list` it does not return (it wraps each blocked Cast in Casts, which are blocked
in turn).

    python -m onnx_norm.zoo.fp16 OUT_DIR [--residual-rms 600]   # OUT_DIR/parent.onnx, fp16.onnx, inputs.npz

(tests/parity/test_fp16_repair.py, docs/accuracy.md "fp16 norm repair").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

#: RMS of the residual stream the parent's embeddings give (docs/accuracy.md, "fp16 norm repair").
RESIDUAL_RMS = 600.0
EMBEDDING = "model.embed_tokens.weight"


def fp32_parent(path: Path, residual_rms: float = RESIDUAL_RMS) -> dict[str, np.ndarray]:
    """Writes the fp32 parent (the zoo's LLaMA, torchscript-14, embeddings scaled) to `path`; returns its inputs."""
    from onnx_norm.zoo.export import export as zoo_export

    export = zoo_export("llama", "torchscript-14", "fp32")
    model = onnx.load(export.path)
    for tensor in model.graph.initializer:
        if tensor.name == EMBEDDING:
            table = numpy_helper.to_array(tensor).astype(np.float64)
            table *= residual_rms / np.sqrt(np.mean(table**2))
            tensor.CopyFrom(numpy_helper.from_array(table.astype(np.float32), EMBEDDING))
    onnx.save(model, path)
    return export.inputs()


def ort_fp16(parent: Path, path: Path) -> None:
    """`parent` through ONNX Runtime's float16 converter (float32 inputs and outputs kept, as users convert)."""
    from onnxruntime.transformers import float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    converted = float16.convert_float_to_float16(onnx.load(parent), keep_io_types=True)
    OnnxModel(converted).topological_sort()  # the converter appends the input Casts after their consumers
    onnx.save(converted, path)


def true_fp16(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The model evaluated op by op in its own types by onnx's reference evaluator (numpy float16), as an fp16-native
    provider (CUDA, WebGPU) computes it; ONNX Runtime's CPU provider runs fp16 ops in fp32 and hides overflows."""
    from onnx.reference import ReferenceEvaluator

    with np.errstate(all="ignore"):
        return ReferenceEvaluator(str(path)).run(None, inputs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write an fp16 LLaMA with fp16 norm statistics and its fp32 parent.")
    parser.add_argument("out", type=Path, help="folder for parent.onnx, fp16.onnx and inputs.npz")
    parser.add_argument("--residual-rms", type=float, default=RESIDUAL_RMS, help="RMS of the embeddings (600)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    inputs = fp32_parent(args.out / "parent.onnx", args.residual_rms)
    ort_fp16(args.out / "parent.onnx", args.out / "fp16.onnx")
    np.savez(args.out / "inputs.npz", **inputs)
    print(f"wrote {args.out / 'parent.onnx'}, {args.out / 'fp16.onnx'}, {args.out / 'inputs.npz'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
