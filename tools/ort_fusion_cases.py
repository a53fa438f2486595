"""ONNX Runtime's own LayerNorm / SimplifiedLayerNorm / SkipLayerNorm fusion cases
(tests/rewrite/test_ort_fusion_cases.py):
how many of the positive ones ONNX Runtime's own optimizer turns into fused ops, on the CPU provider, at
ORT_ENABLE_EXTENDED and ORT_ENABLE_ALL (the saved optimized model is counted: as many fused norm ops as the case
has norms, and no ReduceMean or Pow left). onnx-norm's count is the test itself: every positive case passes.

    python tools/ort_fusion_cases.py            # one line per case, then the totals
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the helpers test modules import
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "rewrite"))
import test_ort_fusion_cases as cases

from onnx_norm.ops.schema import native_ops

#: ONNX Runtime's norm ops: the op records' native ops for the `ort` target.
FUSED_OPS = {native.op_type for _, native in native_ops() if "ort" in native.targets}
LEVELS = {
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def ort_fuses(model: onnx.ModelProto, norms: int, level: ort.GraphOptimizationLevel, out: Path) -> bool:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(out)
    options.log_severity_level = 3
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:  # ORT cannot run the model (an int8 Pow exponent): nothing fused
        return False
    ops = [node.op_type for node in onnx.load(out).graph.node]
    return sum(op in FUSED_OPS for op in ops) == norms and "ReduceMean" not in ops and "Pow" not in ops


def main() -> int:
    totals = dict.fromkeys(LEVELS, 0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (build, expected) in cases.POSITIVE.items():
            norms = sum(expected.values()) if expected else 1
            row = []
            for label, level in LEVELS.items():
                fused = ort_fuses(build(), norms, level, Path(tmp) / f"{name}.{label}.onnx")
                totals[label] += fused
                row.append(f"{label}={'fused' if fused else 'not fused'}")
            print(f"{name:48} {' '.join(row)}")
    summary = ", ".join(f"{totals[label]} at ORT_ENABLE_{label.upper()}" for label in LEVELS)
    print(f"{len(cases.POSITIVE)} positive cases; onnx-norm fuses all (the tests), ONNX Runtime {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
