"""How far each output of a zoo export is from the float64 evaluation of the original, for the original and for
the optimized model (max and mean |error|, from `onnx_norm.verify`'s golden comparison), on ONNX Runtime's CPU
provider. docs/accuracy.md lists what it measured.

    python tools/fp16_accuracy.py bert:torchscript-14:fp16-converted llama:torchscript-14:fp16
    python tools/fp16_accuracy.py bert:torchscript-14:bf16-converted

DTYPE is one of the zoo's (fp32, fp16, fp16-converted) or `bf16-converted`: the zoo's fp32 export through ONNX
Runtime's float16 converter (fp32 inputs and outputs kept), then every float16 type, Cast and tensor made bfloat16
(weights rounded from their fp32 values). ONNX Runtime's CPU provider inserts no Casts for bfloat16 and has
bfloat16 kernels for few ops, so the op types it cannot run in bfloat16 are left in fp32 by the converter (its
op_block_list: Casts to fp32 and back to bfloat16 around each of them, every op's result rounded to bfloat16 as a
bfloat16 kernel rounds it); the tool prints which op types ran in bfloat16.

The last column, `original (basic)`, is the original run at ORT_ENABLE_BASIC, without ONNX Runtime's own norm
fusions: they change the original's numerics (T5's fp16 epsilon 1e-6 becomes 1e-5 in its fused
SimplifiedLayerNormalization).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

import onnx_norm
from onnx_norm.zoo.export import export

#: Op types tried in bfloat16 first; any that ONNX Runtime's CPU provider refuses joins the block list.
_DATA_MOVEMENT = {"Cast", "Concat", "Expand", "Flatten", "Gather", "Identity", "Reshape", "Slice", "Split"}
_DATA_MOVEMENT |= {"Squeeze", "Transpose", "Unsqueeze", "Shape", "Constant", "ConstantOfShape"}
_NOT_IMPLEMENTED = re.compile(r"Could not find an implementation for (\w+)\(")


def _bf16_tensor(tensor: TensorProto, fp32: dict[str, np.ndarray]) -> None:
    """A float16 tensor made bfloat16, from the fp32 value of the same name when the fp32 model has one (no double
    rounding through float16, no float16 clamping)."""
    source = fp32.get(tensor.name)
    values = numpy_helper.to_array(tensor).astype(np.float32) if source is None else source
    tensor.CopyFrom(numpy_helper.from_array(values.astype(ml_dtypes.bfloat16), tensor.name))


def _retype_graph(graph: onnx.GraphProto, fp32: dict[str, np.ndarray]) -> None:
    for tensor in graph.initializer:
        if tensor.data_type == TensorProto.FLOAT16:
            _bf16_tensor(tensor, fp32)
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
            value.type.tensor_type.elem_type = TensorProto.BFLOAT16
    for node in list(graph.node):
        for attr in node.attribute:
            if node.op_type == "ConstantOfShape" and attr.t.data_type == TensorProto.FLOAT16:
                _widen_constant_of_shape(graph, node, attr)
            elif node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.BFLOAT16
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                attr.t.name = attr.t.name or node.output[0]
                _bf16_tensor(attr.t, fp32)
            elif attr.type == onnx.AttributeProto.GRAPH:
                _retype_graph(attr.g, fp32)


def _widen_constant_of_shape(graph: onnx.GraphProto, node: onnx.NodeProto, attr: onnx.AttributeProto) -> None:
    """ConstantOfShape takes a bfloat16 value from opset 20 only (ONNX Runtime runs it earlier, onnx's shape
    inference refuses it): the fp32 value, then a Cast."""
    value = numpy_helper.to_array(attr.t).astype(np.float32)
    attr.t.CopyFrom(numpy_helper.from_array(value, attr.t.name))
    name = node.output[0]
    node.output[0] = f"{name}_fp32"
    cast = onnx.helper.make_node("Cast", [node.output[0]], [name], to=TensorProto.BFLOAT16)
    graph.node.insert(list(graph.node).index(node) + 1, cast)


def _fp32_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
    for node in model.graph.node:
        for attr in node.attribute:
            tensor = attr.t if attr.type == onnx.AttributeProto.TENSOR else None
            if node.op_type == "Constant" and tensor is not None and tensor.data_type == TensorProto.FLOAT:
                values[node.output[0]] = numpy_helper.to_array(tensor)
    return values


def _run_in_fp32(model: onnx.ModelProto, blocked: set[str]) -> tuple[onnx.ModelProto, set[str]]:
    """Each node of a `blocked` op type computes in fp32 between Casts: its bfloat16 inputs widened, its bfloat16
    outputs rounded back (what a bfloat16 kernel computes; ONNX Runtime's float16 converter does this with its
    op_block_list, but names the Casts of one value once per reader, which ORT refuses)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    bf16 = {v.name for v in [*graph.input, *graph.value_info, *graph.output]}
    bf16 = {n for n in bf16 if _elem_type(graph, n) == TensorProto.BFLOAT16}
    bf16 |= {t.name for t in graph.initializer if t.data_type == TensorProto.BFLOAT16}
    nodes, ran = [], set()
    for index, node in enumerate(graph.node):
        if node.op_type not in blocked:
            nodes.append(node)
            if bf16 & {*node.input, *node.output}:
                ran.add(node.op_type)
            continue
        after = []
        for i, name in enumerate(node.input):
            if name in bf16:
                wide = f"{name}_fp32_for_{index}"
                nodes.append(onnx.helper.make_node("Cast", [name], [wide], to=TensorProto.FLOAT))
                node.input[i] = wide
        for i, name in enumerate(node.output):
            if name in bf16:
                node.output[i] = f"{name}_fp32"
                after.append(onnx.helper.make_node("Cast", [node.output[i]], [name], to=TensorProto.BFLOAT16))
        nodes += [node, *after]
    del graph.node[:]
    graph.node.extend(nodes)
    return inferred, ran


def _elem_type(graph: onnx.GraphProto, name: str) -> int:
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if value.name == name:
            return value.type.tensor_type.elem_type
    return 0


def to_bf16(fp32_model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The bf16 conversion described above, and the op types that run in bfloat16 in it."""
    from onnxruntime.transformers import float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    op_types = {node.op_type for node in fp32_model.graph.node}
    blocked = op_types - _DATA_MOVEMENT
    converted = float16.convert_float_to_float16(
        onnx.ModelProto.FromString(fp32_model.SerializeToString()), keep_io_types=True
    )
    OnnxModel(converted).topological_sort()
    _retype_graph(converted.graph, _fp32_values(fp32_model))
    while True:
        model, ran = _run_in_fp32(converted, blocked)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception as err:  # only the "no bf16 kernel" refusal is retried, with that op type in fp32
            refused = _NOT_IMPLEMENTED.search(str(err))
            if refused is None or refused.group(1) in blocked or refused.group(1) not in op_types:
                raise
            blocked.add(refused.group(1))
            continue
        return model, sorted(ran)


def _source(item: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], str]:
    name, exporter, dtype = item.split(":")
    if dtype != "bf16-converted":
        source = export(name, exporter, dtype)  # type: ignore[arg-type]
        return onnx.load(source.path), source.inputs(), ""
    source = export(name, exporter, "fp32")  # type: ignore[arg-type]
    model, ran = to_bf16(onnx.load(source.path))
    return model, source.inputs(), f"bf16 ops: {', '.join(ran)}"


def measure(item: str, target: str = "onnx-norm") -> list[str]:
    original, feeds, note = _source(item)
    optimized, fusion = onnx_norm.optimize(original, target=target, take_over_native=True)
    fused = f"{len(fusion.norms)} norms fused ({target}), {len(fusion.near_misses)} near-misses"
    note = "; ".join(filter(None, [note, fused]))
    report = onnx_norm.verify(original, optimized, inputs=[feeds])
    basic = onnx_norm.verify(original, optimized, inputs=[feeds], original_optimization="basic")
    rows = [f"{item} {note}"]
    for output, output_basic in zip(report.outputs, basic.outputs, strict=True):
        g, b = output.golden, output_basic.golden
        if g is None or b is None:
            rows.append(f"{item} {output.name}: no float64 result ({output.verdict})")
            continue
        rows.append(
            f"{item} {output.name}: original max {g.original_max_abs:.3g} mean {g.original_mean_abs:.3g} | "
            f"optimized max {g.optimized_max_abs:.3g} mean {g.optimized_mean_abs:.3g} | "
            f"mean ratio {_ratio(g):.2f} | margin {g.margin:.2g} | {g.less_accurate or 'not less accurate (verify)'}"
            f" | original (basic) max {b.original_max_abs:.3g} mean {b.original_mean_abs:.3g}, "
            f"mean ratio {_ratio(b):.2f}"
        )
    return rows


def _ratio(golden: Any) -> float:
    return golden.optimized_mean_abs / max(golden.original_mean_abs, 1e-30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="NAME:EXPORTER:DTYPE, e.g. gpt2:torchscript-14:fp16-converted")
    parser.add_argument("--target", default="onnx-norm", help="the rewrite's target (onnx-norm, onnx, ort)")
    args = parser.parse_args()
    for item in args.models:
        for row in measure(item, args.target):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
