"""Build the GPU run's whole-model bench models: a LLaMA-like decoder stack and a BERT-like encoder stack, with
seeded numpy random weights, written with onnx.helper (the GPU machine has no transformers and no package index,
and a transfer carries at most 64 MiB, so the models are built there, not carried).

    python tools/device/make_gpu_models.py --out build/gpu-models                       # hidden 4096, 2 layers
    python tools/device/make_gpu_models.py --out /tmp/m --hidden 64 --layers 1 --intermediate 128   # tiny (tests)

Four models, so that the bench covers norms ONNX Runtime fuses itself and norms it does not:

- `llama-div`: RMSNorm as torch's TorchScript exporter writes it for fp16 (Cast to fp32, Pow, ReduceMean, Add,
  Sqrt, Div(1, .), Mul, Cast back, Mul by the weight): ORT's SimplifiedLayerNormFusion fuses it;
- `llama-reciprocal`: the same with rsqrt as Reciprocal(Sqrt) (torch's dynamo exporter): ORT does not fuse it;
- `bert-decomposed`: post-LN encoder, LayerNorm decomposed (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul,
  Add) after a residual Add with a bias: ORT fuses LayerNormalization and, on CUDA, SkipLayerNormalization;
- `bert-native`: the same with opset 17's LayerNormalization op (what torch exports at opset >= 17).

Every model takes `hidden` [batch, sequence, hidden] (fp16 by default; the embedding is left out, it is not what
is measured) and returns the last norm's output. The attention is a stand-in of two hidden x hidden MatMuls (no
softmax): the bench measures the norms against the rest of a layer's memory traffic, and the MLP dominates anyway.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
EPS = 1e-5
DTYPES = {"fp16": (np.float16, TensorProto.FLOAT16), "fp32": (np.float32, TensorProto.FLOAT)}


@dataclasses.dataclass(frozen=True)
class Spec:
    hidden: int
    intermediate: int
    layers: int
    dtype: str
    seed: int = 0


class Graph:
    """Nodes and initializers of one model being built, with unique names."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.np_dtype, self.onnx_dtype = DTYPES[spec.dtype]
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(spec.seed)
        self._count = 0

    def name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def const(self, stem: str, value: np.ndarray) -> str:
        name = self.name(stem)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def scalar(self, value: float, dtype: type = np.float32) -> str:
        return self.const("c", np.array(value, dtype))

    def weight(self, rows: int, cols: int) -> str:
        # Scaled so that activations stay O(1) through the stack in fp16.
        values = self.rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(rows)
        return self.const("w", values.astype(self.np_dtype))

    def gain(self, size: int, center: float) -> str:
        values = center + 0.1 * self.rng.standard_normal(size, dtype=np.float32)
        return self.const("g", values.astype(self.np_dtype))

    def matmul(self, x: str, rows: int, cols: int) -> str:
        return self.op("MatMul", [x, self.weight(rows, cols)])


def rms_norm(g: Graph, x: str, reciprocal: bool) -> str:
    """HF LlamaRMSNorm as exported: in fp32 between two Casts, rsqrt as Div(1, Sqrt) or Reciprocal(Sqrt)."""
    x32 = g.op("Cast", [x], to=TensorProto.FLOAT)
    variance = g.op("ReduceMean", [g.op("Pow", [x32, g.scalar(2.0)])], axes=[-1], keepdims=1)
    root = g.op("Sqrt", [g.op("Add", [variance, g.scalar(EPS)])])
    inverse = g.op("Reciprocal", [root]) if reciprocal else g.op("Div", [g.scalar(1.0), root])
    normed = g.op("Cast", [g.op("Mul", [x32, inverse])], to=g.onnx_dtype)
    return g.op("Mul", [g.gain(g.spec.hidden, 1.0), normed])


def layer_norm(g: Graph, x: str, native: bool) -> str:
    gamma, beta = g.gain(g.spec.hidden, 1.0), g.gain(g.spec.hidden, 0.0)
    if native:
        return g.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=EPS)
    mean = g.op("ReduceMean", [x], axes=[-1], keepdims=1)
    centered = g.op("Sub", [x, mean])
    variance = g.op("ReduceMean", [g.op("Pow", [centered, g.scalar(2.0, g.np_dtype)])], axes=[-1], keepdims=1)
    root = g.op("Sqrt", [g.op("Add", [variance, g.scalar(EPS, g.np_dtype)])])
    return g.op("Add", [g.op("Mul", [g.op("Div", [centered, root]), gamma]), beta])


def llama(g: Graph, x: str, reciprocal: bool) -> str:
    h, m = g.spec.hidden, g.spec.intermediate
    for _ in range(g.spec.layers):
        attention = g.matmul(g.matmul(rms_norm(g, x, reciprocal), h, h), h, h)
        x = g.op("Add", [x, attention])
        normed = rms_norm(g, x, reciprocal)
        gate = g.matmul(normed, h, m)
        silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
        x = g.op("Add", [x, g.matmul(g.op("Mul", [silu, g.matmul(normed, h, m)]), m, h)])
    return rms_norm(g, x, reciprocal)


def gelu(g: Graph, x: str) -> str:
    erf = g.op("Erf", [g.op("Div", [x, g.scalar(float(np.sqrt(2.0)), g.np_dtype)])])
    return g.op("Mul", [g.op("Mul", [x, g.op("Add", [erf, g.scalar(1.0, g.np_dtype)])]), g.scalar(0.5, g.np_dtype)])


def bert(g: Graph, x: str, native: bool) -> str:
    h, m = g.spec.hidden, g.spec.intermediate
    for _ in range(g.spec.layers):
        attention = g.op("Add", [g.matmul(g.matmul(x, h, h), h, h), g.gain(h, 0.0)])
        x = layer_norm(g, g.op("Add", [x, attention]), native)
        mlp = g.op("Add", [g.matmul(gelu(g, g.matmul(x, h, m)), m, h), g.gain(h, 0.0)])
        x = layer_norm(g, g.op("Add", [x, mlp]), native)
    return x


#: model name -> (body, how many norms it has per layer and after the stack)
MODELS: dict[str, tuple[Callable[[Graph, str], str], int, int]] = {
    "llama-div": (lambda g, x: llama(g, x, reciprocal=False), 2, 1),
    "llama-reciprocal": (lambda g, x: llama(g, x, reciprocal=True), 2, 1),
    "bert-decomposed": (lambda g, x: bert(g, x, native=False), 2, 0),
    "bert-native": (lambda g, x: bert(g, x, native=True), 2, 0),
}


def norm_count(name: str, layers: int) -> int:
    """How many norms the model has: what the rewrite should find in it."""
    _, per_layer, final = MODELS[name]
    return per_layer * layers + final


def build(name: str, spec: Spec) -> onnx.ModelProto:
    g = Graph(spec)
    body, _, _ = MODELS[name]
    out = body(g, "hidden")
    shape = ["batch", "sequence", spec.hidden]
    graph = helper.make_graph(
        g.nodes,
        name,
        [helper.make_tensor_value_info("hidden", g.onnx_dtype, shape)],
        [helper.make_tensor_value_info(out, g.onnx_dtype, shape)],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="make_gpu_models")
    model.ir_version = 8  # what ONNX Runtime 1.16+ reads
    onnx.checker.check_model(model)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write NAME.onnx and models.json to")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=None, help="MLP width (default: LLaMA's 8/3, x256)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    args = parser.parse_args(argv)
    if args.hidden < 1 or args.layers < 1:
        parser.error(f"--hidden and --layers must be positive, got {args.hidden} and {args.layers}")
    intermediate = args.intermediate or -(-(8 * args.hidden // 3) // 256) * 256
    spec = Spec(args.hidden, intermediate, args.layers, args.dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name in args.models:
        model = build(name, spec)
        path = args.out / f"{name}.onnx"
        onnx.save(model, str(path))
        manifest[name] = {**dataclasses.asdict(spec), "norms": norm_count(name, spec.layers), "file": path.name}
        print(f"{path}: {manifest[name]['norms']} norms, {path.stat().st_size / 2**20:.0f} MiB")
    (args.out / "models.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
