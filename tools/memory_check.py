"""Peak memory of `onnx-norm optimize` on a large model, as a multiple of the model's size.

Builds a model of `--layers` blocks (MatMul with a `--hidden` x `--hidden` float32 weight, then a decomposed
RMSNorm or LayerNorm, alternately), ~1 GiB by default, saves it with external data in a temporary directory, runs
`onnx-norm -v optimize` on it in a child process and reports the child's peak resident memory (ru_maxrss) next to
the model's size. The norms are fused, so the run does all the work a real model needs (shape inference, matching,
proofs, saving).

    python tools/memory_check.py                      # ~1 GiB: 16 layers of 4096 x 4096
    python tools/memory_check.py --inline             # the weights inside the .onnx file
    python tools/memory_check.py --layers 4           # ~256 MiB, quicker
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx_ir as ir


def _decomposed_norm(inputs: list, x: ir.Value, hidden: int, layer: int, rng: np.random.Generator) -> ir.Value:
    """Appends the nodes of one norm reading `x` to `inputs` (a node list); returns its output."""

    def const(name: str, array: np.ndarray) -> ir.Value:
        value = ir.Value(name=f"l{layer}_{name}", const_value=ir.tensor(array, name=f"l{layer}_{name}"))
        value.type = ir.TensorType(ir.DataType.FLOAT if array.dtype == np.float32 else ir.DataType.INT64)
        value.shape = ir.Shape(array.shape)
        inputs.append(("init", value))
        return value

    def node(op: str, *args: ir.Value, **attrs) -> ir.Value:
        made = ir.node(op, list(args), attributes=attrs or None, name=f"l{layer}_{op}_{len(inputs)}")
        inputs.append(("node", made))
        return made.outputs[0]

    axes = const("axes", np.asarray([-1], np.int64))
    eps = const("eps", np.asarray(1e-5, np.float32))
    weight = const("w", (rng.random(hidden) + 0.5).astype(np.float32))
    data = x
    if layer % 2:
        data = node("Sub", x, node("ReduceMean", x, axes))
    square = node("Mul", data, data)
    stat = node("ReduceMean", square, axes)
    normalised = node("Div", data, node("Sqrt", node("Add", stat, eps)))
    return node("Mul", normalised, weight)


def build(path: Path, layers: int, hidden: int, inline: bool = False) -> int:
    """Writes the model (with external data unless `inline`); returns its tensor bytes."""
    rng = np.random.default_rng(0)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", "seq", hidden]))
    items: list = []
    value = x
    total = 0
    for layer in range(layers):
        weight = (rng.standard_normal((hidden, hidden), dtype=np.float32) * hidden**-0.5).astype(np.float32)
        total += weight.nbytes
        w = ir.Value(name=f"l{layer}_matmul_w", const_value=ir.tensor(weight, name=f"l{layer}_matmul_w"))
        w.type, w.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(weight.shape)
        items.append(("init", w))
        matmul = ir.node("MatMul", [value, w], name=f"l{layer}_MatMul")
        items.append(("node", matmul))
        value = _decomposed_norm(items, matmul.outputs[0], hidden, layer, rng)
    value.name = "y"
    nodes = [item for kind, item in items if kind == "node"]
    initializers = [item for kind, item in items if kind == "init"]
    graph = ir.Graph([x], [value], nodes=nodes, initializers=initializers, opset_imports={"": 18}, name="big")
    ir.save(ir.Model(graph, ir_version=10), path, external_data=None if inline else path.name + ".data")
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--inline", action="store_true", help="weights inside the .onnx file, not external data")
    parser.add_argument("--build-only", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_only:
        build(Path(args.build_only), args.layers, args.hidden, args.inline)
        return 0
    with tempfile.TemporaryDirectory(prefix="onnx-norm-memory-") as tmp:
        source, output = Path(tmp) / "big.onnx", Path(tmp) / "big.opt.onnx"
        # Built in a child of its own: a child forked from a process holding the weights would count them in its
        # peak RSS before it runs anything.
        builder = [sys.executable, __file__, "--layers", str(args.layers), "--hidden", str(args.hidden)]
        subprocess.run([*builder, *(["--inline"] if args.inline else []), "--build-only", str(source)], check=True)
        size = args.layers * args.hidden * args.hidden * 4
        where = "inside the file" if args.inline else "as external data"
        gib = size / 2**30
        print(f"model: {args.layers} layers of {args.hidden} x {args.hidden}, {gib:.2f} GiB of weights {where}")
        cli = Path(sys.executable).parent / "onnx-norm"
        command = [str(cli), "-v", "optimize", str(source), "-o", str(output)]
        start = time.perf_counter()
        with tempfile.TemporaryFile("w+") as log:
            child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
            _, status, usage = os.wait4(child.pid, 0)  # this child's own peak, not the builder's
            child.returncode = os.waitstatus_to_exitcode(status)
            seconds = time.perf_counter() - start
            log.seek(0)
            for line in log.read().splitlines():
                if line.startswith(("INFO", "WARNING", "ERROR", "wrote", "Traceback")):
                    print("  " + line)
        peak = usage.ru_maxrss * 1024  # kilobytes on Linux
        done = child
        print(f"optimize: exit {done.returncode} in {seconds:.0f} s, peak RSS {peak / 2**30:.2f} GiB")
        print(f"peak RSS / model size: {peak / size:.2f}")
        return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
