"""Smoke test of an installed onnx-norm wheel (tools/check_wheel.sh runs it in a fresh virtual environment, from
outside the repository): the library comes from the installed package, ONNX Runtime registers it, and one node of
each op family runs on the CPU provider and matches the numpy reference. No model-local functions are attached,
so a library that does not register fails the session, not silently falls back. Exit 0 on success."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnx_norm
from onnx_norm.ops import reference
from onnx_norm.ops.schema import DOMAIN, OPSET_VERSION

ROWS, COLS = 3, 40
RNG = np.random.default_rng(0)
X = RNG.standard_normal((ROWS, COLS)).astype(np.float32)
FEEDS = {"X": X, "Skip": RNG.standard_normal((ROWS, COLS)).astype(np.float32)}
PARAMETERS = {
    "Scale": RNG.standard_normal(COLS).astype(np.float32),
    "Bias": RNG.standard_normal(COLS).astype(np.float32),
}
# op: (inputs, the reference's Y)
CASES = {
    "LayerNorm": (("X", "Scale", "Bias"), reference.layer_norm(X, PARAMETERS["Scale"], PARAMETERS["Bias"])[0]),
    "RMSNorm": (("X", "Scale"), reference.rms_norm(X, PARAMETERS["Scale"])[0]),
    "SkipRMSNorm": (("X", "Skip", "Scale"), reference.skip_rms_norm(X, FEEDS["Skip"], PARAMETERS["Scale"])[0]),
}


def _model(op: str, inputs: tuple[str, ...]) -> onnx.ModelProto:
    node = helper.make_node(op, list(inputs), ["Y"], domain=DOMAIN, epsilon=1e-5)
    graph = helper.make_graph(
        [node],
        "smoke",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [ROWS, COLS]) for name in inputs if name in FEEDS],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(PARAMETERS[name], name=name) for name in inputs if name in PARAMETERS],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
    # IR version 10: what every ONNX Runtime this project supports reads (onnx may write a newer default).
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def main() -> int:
    library = Path(onnx_norm.get_library_path()).resolve()
    if not library.is_relative_to(Path(sys.prefix).resolve()):
        print(f"the library {library} is not the installed one (prefix {sys.prefix})", file=sys.stderr)
        return 1
    if importlib.util.find_spec("torch") is not None:
        print("torch is installed: the check must show that onnx-norm runs without it", file=sys.stderr)
        return 1
    for op, (inputs, expected) in CASES.items():
        session = ort.InferenceSession(
            _model(op, inputs).SerializeToString(), onnx_norm.session_options(), providers=["CPUExecutionProvider"]
        )
        (y,) = session.run(["Y"], {name: FEEDS[name] for name in inputs if name in FEEDS})
        error = float(np.max(np.abs(y.astype(np.float64) - expected)))
        if not error < 1e-4:
            print(f"{op}: max error {error:.3g} against the reference", file=sys.stderr)
            return 1
        print(f"{op} (domain {DOMAIN}) from {library}: max error {error:.2g}")
    print(f"onnx-norm {onnx_norm.__version__}, onnxruntime {ort.__version__}: smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
