"""Run as a script by tests/integrations/test_integrations_torch_hf.py (a user's process: `torch_export.export` on
Hugging Face
models): exports each zoo model named on the command line into DIR and prints, per model, the norm calls in the
torch forward pass, our fused ops in the export, the decomposed norms left and what was logged, as JSON."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import onnx

from onnx_norm import zoo
from onnx_norm.integrations import torch_export
from onnx_norm.zoo import detect
from onnx_norm.zoo.export import TRACE_SHAPE, _call_options, _Flatten, output_names_of, to_torch


def _max_abs_vs_torch(path: Path, inputs: dict, expected: tuple) -> float:
    """The export run by ONNX Runtime with our library, against torch's outputs."""
    import numpy as np
    import onnxruntime as ort

    from onnx_norm.library import session_options

    session = ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
    got = session.run(None, inputs)
    return max(float(np.abs(a - b.numpy()).max()) for a, b in zip(got, expected, strict=True))


def main(directory: Path, names: list[str]) -> None:
    import torch

    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("onnx_norm.integrations.torch_export").addHandler(Collect())
    logging.getLogger("onnx_norm.integrations.torch_export").setLevel(logging.INFO)
    results = {}
    for name in names:
        spec = zoo.ZOO[name]
        model = zoo.build_model(spec)
        inputs = zoo.example_inputs(spec, *TRACE_SHAPE, seed=0)
        calls = zoo.count_norm_calls(model, {**to_torch(inputs, torch.float32), **_call_options(model)})
        wrapper = _Flatten.wrap(model, list(inputs))
        path = directory / f"{name}.onnx"
        records.clear()
        torch_export.export(wrapper, tuple(to_torch(inputs).values()), path, input_names=list(inputs))
        exported = onnx.load(str(path))
        with torch.no_grad():
            expected = wrapper(*to_torch(inputs).values())
        results[name] = {
            "max_abs_vs_torch": _max_abs_vs_torch(path, inputs, expected),
            "norm_calls": sum(calls.calls.values()),
            "fused": sum(detect.fused_norms(exported).values()),
            "decomposed_left": len(detect.decomposed_norms(exported)),
            "log": list(records),
            "outputs": output_names_of(model, to_torch(inputs, torch.float32)),
        }
    print(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
