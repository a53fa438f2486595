"""Peak memory of `onnx-norm optimize`, `verify` and `bench` on a large model, against the model's weight bytes.

Builds a model with external data in a temporary directory (in a child process of its own, so that no measured
process inherits the builder's memory), runs one onnx-norm command on it in a child process and reports that
child's peak resident memory (`os.wait4`'s ru_maxrss, the child forked from a small launcher so that it does not
start from this process's peak) next to the weight bytes W, with the budget of issue 20.
Exits with the command's exit status when it fails, and 3 when it succeeded above the budget.

Models (`--shape`):

- `blocks` (default): `--layers` blocks of a `--hidden` x `--hidden` MatMul followed by a decomposed RMSNorm or
  LayerNorm, alternately; 16 x 4096 fp32 is 1.00 GiB, 33 x 4096 is 2.06 GiB (past protobuf's 2 GiB).
- `llama`: LLaMA-shaped decoder layers (decomposed RMSNorm with fp32 statistics between Casts, q/k/v/o projections,
  single-head attention, SwiGLU MLP, residual Adds), `--hidden` 4096 and `--intermediate` 11008 by default; 10
  fp16 layers are 3.8 GiB.

Layouts (`--layout`): `onnx` writes the external data as `onnx.save(..., save_as_external_data=True)` does (one file,
tensors above 1 KiB back to back at unaligned offsets), `aligned` the same with offsets aligned to 64 KiB (as onnx-ir
and the GenAI builder align them), `inline` keeps every weight in the .onnx file (small models only).
`--data-dir NAME` puts the data file in a folder below the model's, named through a relative location (`NAME/...`;
ONNX Runtime and onnx's checker refuse a location that leaves the model's folder).

    python tools/memory_check.py optimize                       # 1 GiB, onnx-written
    python tools/memory_check.py verify --layers 33             # 2.06 GiB
    python tools/memory_check.py bench --layers 33 -- --repeat 5
    python tools/memory_check.py verify --shape llama --dtype float16 --layers 10
    python tools/memory_check.py genai --shape llama --dtype float16 --layers 10 -- --verify   # optimize FOLDER
    python tools/memory_check.py ort --layers 33      # ONNX Runtime alone: load and run both models once
    python tools/memory_check.py build --layers 33 --out /tmp/big.onnx     # only write the model

`ort` is the time baseline of issue 34 ("segmented verify within 2x of what ONNX Runtime alone needs to load and
run both models once"): one child loads the original in an ONNX Runtime session (all of its optimizations on), runs
it once on the inputs verify's `--shape sequence:16` gives, frees it, then does the same with the optimized model
(our library registered). Its peak is reported but has no budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

#: Tensors above this many bytes go to the data file, as onnx.save's default `size_threshold`.
EXTERNAL_THRESHOLD = 1024
ALIGNMENT = 65536
GIB = 2**30
#: The issue's budgets: peak RSS <= factor * W + 1 GiB.
BUDGETS = {"optimize": 0.25, "verify": 1.5, "optimize-verify": 1.5, "bench": 1.5, "genai": 1.5}
#: Commands measured for their time only.
UNBUDGETED = ("ort",)


class _Writer:
    """Collects initializers; writes the large ones to the data file as they come (one tensor in memory)."""

    def __init__(self, data_path: Path | None, location: str, align: int | None) -> None:
        self.data = open(data_path, "wb") if data_path is not None else None  # noqa: SIM115 - closed in finish
        self.location = location
        self.align = align
        self.initializers: list[TensorProto] = []
        self.weight_bytes = 0

    def add(self, name: str, array: np.ndarray) -> str:
        self.weight_bytes += array.nbytes
        if self.data is None or array.nbytes <= EXTERNAL_THRESHOLD:
            self.initializers.append(onnx.numpy_helper.from_array(array, name))
            return name
        offset = self.data.tell()
        if self.align:
            offset = -(-offset // self.align) * self.align
            self.data.seek(offset)
        self.data.write(np.ascontiguousarray(array).tobytes())
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(array.nbytes))):
            tensor.external_data.add(key=key, value=value)
        self.initializers.append(tensor)
        return name

    def finish(self) -> None:
        if self.data is not None:
            self.data.close()


def _norm(nodes: list, w: _Writer, x: str, hidden: int, prefix: str, dtype: np.dtype, *, centred: bool) -> str:
    """A decomposed RMSNorm (LayerNorm when `centred`) of `x`, its statistics in fp32 between Casts for fp16."""
    axes = w.add(f"{prefix}_axes", np.asarray([-1], np.int64))
    eps = w.add(f"{prefix}_eps", np.asarray(1e-5, np.float32))
    scale = w.add(f"{prefix}_scale", np.linspace(0.5, 1.5, hidden).astype(dtype))

    def node(op: str, *inputs: str, **attrs: object) -> str:
        out = f"{prefix}_{op}_{len(nodes)}"
        nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    data = node("Cast", x, to=TensorProto.FLOAT) if dtype != np.float32 else x
    if centred:
        data = node("Sub", data, node("ReduceMean", data, axes))
    stat = node("ReduceMean", node("Mul", data, data), axes)
    normed = node("Div", data, node("Sqrt", node("Add", stat, eps)))
    if dtype != np.float32:
        normed = node("Cast", normed, to=helper.np_dtype_to_tensor_dtype(dtype))
    return node("Mul", normed, scale)


def _weight(rng: np.random.Generator, rows: int, cols: int, dtype: np.dtype, cache: dict) -> np.ndarray:
    """A rows x cols weight scaled to keep activations near unit size. One random draw per shape (drawing GiBs of
    random numbers would take longer than anything measured), rolled by a different amount for every weight: ONNX
    Runtime may keep identical initializers once, and the weights must be W bytes of distinct data."""
    if (rows, cols) not in cache:
        cache[(rows, cols)] = [(rng.standard_normal((rows, cols), dtype=np.float32) * rows**-0.5).astype(dtype), 0]
    entry = cache[(rows, cols)]
    entry[1] += 1
    return np.roll(entry[0], entry[1], axis=1)


def _blocks(w: _Writer, nodes: list, x: str, args: argparse.Namespace, dtype: np.dtype) -> str:
    rng, cache = np.random.default_rng(0), {}
    for layer in range(args.layers):
        weight = w.add(f"l{layer}_matmul_w", _weight(rng, args.hidden, args.hidden, dtype, cache))
        out = f"l{layer}_matmul"
        nodes.append(helper.make_node("MatMul", [x, weight], [out], name=out))
        x = _norm(nodes, w, out, args.hidden, f"l{layer}_norm", dtype, centred=bool(layer % 2))
    return x


def _llama(w: _Writer, nodes: list, x: str, args: argparse.Namespace, dtype: np.dtype) -> str:
    rng, cache = np.random.default_rng(0), {}
    hidden, inter = args.hidden, args.intermediate

    def node(op: str, *inputs: str, **attrs: object) -> str:
        out = f"{op}_{len(nodes)}"
        nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def linear(value: str, name: str, rows: int, cols: int) -> str:
        return node("MatMul", value, w.add(name, _weight(rng, rows, cols, dtype, cache)))

    inv_sqrt = w.add("attn_scale", np.asarray(hidden**-0.5, dtype))
    for layer in range(args.layers):
        p = f"l{layer}"
        h = _norm(nodes, w, x, hidden, f"{p}_input_norm", dtype, centred=False)
        q, k, v = (linear(h, f"{p}_{n}_proj", hidden, hidden) for n in "qkv")
        scores = node("Mul", node("MatMul", q, node("Transpose", k, perm=[0, 2, 1])), inv_sqrt)
        attn = node("MatMul", node("Softmax", scores, axis=-1), v)
        x = node("Add", x, linear(attn, f"{p}_o_proj", hidden, hidden))
        h = _norm(nodes, w, x, hidden, f"{p}_post_norm", dtype, centred=False)
        gate, up = linear(h, f"{p}_gate_proj", hidden, inter), linear(h, f"{p}_up_proj", hidden, inter)
        silu = node("Mul", gate, node("Sigmoid", gate))
        x = node("Add", x, linear(node("Mul", silu, up), f"{p}_down_proj", inter, hidden))
    return _norm(nodes, w, x, hidden, "final_norm", dtype, centred=False)


def build(path: Path, args: argparse.Namespace) -> int:
    """Writes the model described by `args` to `path` (its data file as the layout says); returns W, the bytes of
    its weights."""
    dtype = np.dtype(args.dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    data_path, location = None, f"{path.name}.data"
    if args.layout != "inline":
        folder = path.parent
        if args.data_dir:
            folder = path.parent / args.data_dir
            folder.mkdir(exist_ok=True)
            location = f"{args.data_dir}/{location}"
        data_path = folder / f"{path.name}.data"
    w = _Writer(data_path, location, ALIGNMENT if args.layout == "aligned" else None)
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    nodes: list = []
    try:
        make = _llama if args.shape == "llama" else _blocks
        y = make(w, nodes, "x", args, dtype)
    finally:
        w.finish()
    nodes.append(helper.make_node("Identity", [y], ["y"], name="output"))
    graph = helper.make_graph(
        nodes,
        args.shape,
        [helper.make_tensor_value_info("x", elem, ["batch", "sequence", args.hidden])],
        [helper.make_tensor_value_info("y", elem, ["batch", "sequence", args.hidden])],
        w.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, path)
    onnx.checker.check_model(str(path))  # by path: the checker finds the data file relative to the model
    return w.weight_bytes


# A child's ru_maxrss starts at its parent's peak: exec records the peak of the memory map it replaces, and a
# forked (or vforked) child's map is the parent's. A test worker that has run other tests first would pass its own
# peak on to the command measured, so the command is forked from this small launcher, whose peak is a few MB.
_LAUNCHER = """
import os, sys
report, command = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"cannot run {command[0]}: {error.strerror}", file=sys.stderr, flush=True)
    os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as out:
    out.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def measure(command: Sequence[str]) -> tuple[int, float, int, str]:
    """Runs `command` in a child; its exit status, seconds, peak RSS in bytes and its output."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "maxrss"
        with (Path(folder) / "log").open("w+") as log:
            launcher = [sys.executable, "-S", "-c", _LAUNCHER, str(report), *command]
            launched = subprocess.run(launcher, stdout=log, stderr=subprocess.STDOUT, check=False)
            seconds = time.perf_counter() - start
            log.seek(0)
            output = log.read()
        if not report.exists():  # the launcher itself failed: its traceback is in the output
            return launched.returncode or 1, seconds, 0, output
        status, peak = (int(field) for field in report.read_text().split())
        return status, seconds, peak * 1024, output


# ONNX Runtime alone, one session at a time: the load (graph optimizations included) and one run of each model.
_ORT_RUN = """
import sys, time
import numpy as np
import onnxruntime as ort
import onnx_norm
total = time.perf_counter()
for path in sys.argv[1:]:
    options = ort.SessionOptions()
    options.register_custom_ops_library(onnx_norm.get_library_path())
    start = time.perf_counter()
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    loaded = time.perf_counter() - start
    (spec,) = session.get_inputs()
    dtype = np.float16 if "float16" in spec.type else np.float32
    shape = [16 if dim == "sequence" else dim if isinstance(dim, int) else 1 for dim in spec.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    start = time.perf_counter()
    session.run(None, {spec.name: x})
    print(f"{path}: load {loaded:.1f} s, run {time.perf_counter() - start:.1f} s", flush=True)
    del session
print(f"both models, one session at a time: {time.perf_counter() - total:.1f} s")
"""


def command_for(name: str, source: Path, work: Path, extra: Sequence[str]) -> list[str]:
    cli = [str(Path(sys.executable).parent / "onnx-norm")]
    out = ["-o", str(work / "out.onnx")]
    shape = ["--shape", "sequence:16"]
    if name == "optimize":
        return [*cli, "optimize", str(source), *out, *extra]
    if name == "optimize-verify":
        return [*cli, "optimize", str(source), *out, "--verify", *shape, *extra]
    if name == "verify":
        return [*cli, "verify", str(source), str(work / "opt.onnx"), *shape, *extra]
    if name == "ort":
        return [sys.executable, "-c", _ORT_RUN, str(source), str(work / "opt.onnx")]
    if name == "genai":  # the model's folder as a GenAI folder (genai_config.json written beside it)
        return [*cli, "optimize", str(source.parent), "-o", str(work / "genai"), *extra]
    return [*cli, "bench", str(source), str(work / "opt.onnx"), *shape, *extra]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=[*BUDGETS, *UNBUDGETED, "build"])
    parser.add_argument("--shape", choices=("blocks", "llama"), default="blocks")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=11008)
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    parser.add_argument("--layout", choices=("onnx", "aligned", "inline"), default="onnx")
    parser.add_argument("--data-dir", help="write the data file into this subfolder (a relative location)")
    parser.add_argument("--out", type=Path, help="build: where to write the model")
    parser.add_argument("--dir", type=Path, help="where to build (default: a temporary directory, removed after)")
    parser.add_argument("--model", type=Path, help="measure this model (made by `build`) instead of building one")
    return parser


def _build_in_child(args: argparse.Namespace, path: Path) -> int:
    """W of the model built at `path` by a child process."""
    keys = ("shape", "layers", "hidden", "intermediate", "dtype", "layout", "data_dir")
    flags = [f"--{key.replace('_', '-')}={getattr(args, key)}" for key in keys if getattr(args, key) is not None]
    done = subprocess.run(
        [sys.executable, __file__, "build", *flags, "--out", str(path)], check=True, capture_output=True, text=True
    )
    return int(done.stdout.split()[-1])


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = _parser().parse_args(argv[:split])
    args.extra = argv[split + 1 :]  # flags for the onnx-norm command
    if args.command == "build":
        if args.out is None:
            raise SystemExit("build needs --out")
        print(build(args.out, args))
        return 0
    with tempfile.TemporaryDirectory(prefix="onnx-norm-memory-", dir=args.dir) as tmp:
        work = Path(tmp) / "model"
        work.mkdir()
        source = work / "big.onnx"
        if args.model is not None:
            source = args.model.resolve()
            weights = sum(
                int(entry.value)
                for tensor in onnx.load(str(source), load_external_data=False).graph.initializer
                for entry in tensor.external_data
                if entry.key == "length"
            )
        else:
            weights = _build_in_child(args, source)
        described = (
            str(source)
            if args.model is not None
            else f"{args.shape} {args.layers} layers, hidden {args.hidden}, {args.dtype}, {args.layout} layout"
        )
        print(f"model: {described}, W = {weights / GIB:.2f} GiB")
        if args.command in ("verify", "bench", "ort"):
            code, _, _, output = measure(command_for("optimize", source, work, []))
            if code:
                print(output)
                return code
            os.replace(work / "out.onnx", work / "opt.onnx")  # its data file keeps its name, which it refers to
        command = command_for(args.command, source, work, args.extra)
        config = source.parent / "genai_config.json"
        written = args.command == "genai" and not config.exists()
        if written:
            config.write_text(json.dumps({"model": {"decoder": {"filename": source.name}}}))
        try:
            code, seconds, peak, output = measure(command)
        finally:
            if written:
                config.unlink()
        return _report(args, command, (code, seconds, peak, output), weights)


Measured = tuple[int, float, int, str]  # exit status, seconds, peak RSS in bytes, output


def _report(args: argparse.Namespace, command: Sequence[str], measured: Measured, weights: int) -> int:
    """Prints the command's result and peak against W; its exit status (3: succeeded over the budget)."""
    code, seconds, peak, output = measured
    for line in output.splitlines()[-12:]:
        print("  " + line)
    shown = command[:2] if args.command in UNBUDGETED else command  # not the child's script
    print(f"{' '.join(Path(c).name if i == 0 else c for i, c in enumerate(shown))}")
    line = f"{args.command}: exit {code} in {seconds:.0f} s, peak RSS {peak / GIB:.2f} GiB = {peak / weights:.2f} W"
    if args.command in UNBUDGETED:
        print(line)
        return code
    # The budget for inline models (up to 2 GiB): optimize <= 2 W.
    inline = args.layout == "inline" and args.command == "optimize"
    budget = 2 * weights if inline else BUDGETS[args.command] * weights + GIB
    print(f"{line} (budget {budget / GIB:.2f} GiB)")
    if code:
        return code
    return 0 if peak <= budget else 3


if __name__ == "__main__":
    raise SystemExit(main())
