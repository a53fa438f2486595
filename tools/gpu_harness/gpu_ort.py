"""tools/gpu_check.py through ONNX Runtime: our ops on the CUDA provider, and ONNX Runtime's own kernels timed
against ours."""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from gpu_cases import (
    BF16,
    F32,
    OPS,
    TYPE_NAMES,
    Case,
    Inputs,
    _as_f64,
    _default_case,
    make_inputs,
    measure_by_priority,
    requested_outputs,
)

from onnx_norm.ops.reference import np_dtype
from onnx_norm.ops.schema import OPS as SIGNATURES

# --------------------------------------------------------------------------------------------- ORT backend


class OrtBackend:
    """Runs cases through ONNX Runtime with the built onnx_norm library on one provider (CUDA on a GPU
    machine; the CPU provider in --self-test, to check the model building and the profile reading)."""

    def __init__(self, provider: str = "CUDAExecutionProvider") -> None:
        import onnxruntime as ort

        self.ort = ort
        self.provider = provider
        self.profiles_checked = 0
        # The Skip ops' CPU kernels normalise the float32 sum, the CUDA kernels the rounded one (docs/ops.md).
        self.rounded_sum = provider == "CUDAExecutionProvider"

    @staticmethod
    def available() -> str | None:
        """None when usable, else why not."""
        try:
            import onnxruntime as ort
        except ImportError:
            return "onnxruntime is not installed"
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu is not installed)"
        try:
            ort.preload_dlls()  # the CUDA/cuDNN libraries of the nvidia-* wheels, when they are installed
        except Exception as exc:  # older onnxruntime, or nothing to preload: the probe below decides
            print(f"(onnxruntime.preload_dlls: {exc})")
        # onnxruntime-gpu lists CUDA even when its CUDA libraries are missing, then silently runs on the CPU.
        from onnx import helper

        probe = helper.make_model(
            helper.make_graph(
                [helper.make_node("Add", ["a", "a"], ["b"])],
                "probe",
                [helper.make_tensor_value_info("a", F32, [4])],
                [helper.make_tensor_value_info("b", F32, [4])],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        )
        probe.ir_version = 10
        try:
            session = ort.InferenceSession(probe.SerializeToString(), providers=["CUDAExecutionProvider"])
        except Exception as exc:  # any failure to start the provider
            return f"onnxruntime's CUDA provider does not start here ({exc})"
        if session.get_providers()[0] != "CUDAExecutionProvider":
            return "onnxruntime-gpu is installed but its CUDA provider fell back to the CPU (CUDA/cuDNN libraries?)"
        try:
            import onnx_norm

            path = Path(onnx_norm.get_library_path())
        except Exception as exc:  # any failure means the library is not built/installed
            return f"the onnx_norm custom-op library is not available ({exc})"
        if not path.is_file():
            return f"the onnx_norm custom-op library is missing at {path}"
        return None

    def _session_options(self, profile: bool = True) -> Any:
        import onnx_norm

        try:
            options = onnx_norm.session_options()
        except TypeError:
            options = self.ort.SessionOptions()
            options.register_custom_ops_library(str(onnx_norm.get_library_path()))
        if profile:
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(tempfile.gettempdir()) / "onnx_norm_gpu_check")
        return options

    def _model(self, case: Case) -> bytes:
        from onnx import helper

        from onnx_norm.ops.schema import DOMAIN, OPSET_VERSION

        signature = SIGNATURES[case.op]
        inputs = [helper.make_tensor_value_info("X", case.x_type, case.shape)]
        names = ["X"]
        if case.skip:
            inputs.append(helper.make_tensor_value_info("Skip", case.x_type, case.shape))
            names.append("Skip")
        if case.scale_type is not None:
            inputs.append(helper.make_tensor_value_info("Scale", case.scale_type, case.param_shape()))
            names.append("Scale")
            if case.bias:
                inputs.append(helper.make_tensor_value_info("Bias", case.scale_type, case.param_shape()))
                names.append("Bias")
        wanted = requested_outputs(case)
        out_names = [name if name in wanted else "" for name in signature.outputs]
        while out_names and not out_names[-1]:
            out_names.pop()
        outputs = []
        for name in wanted:
            if name == "Y":
                outputs.append(helper.make_tensor_value_info("Y", case.y_type, case.shape))
            elif name == "Sum":
                outputs.append(helper.make_tensor_value_info("Sum", case.x_type, case.shape))
            else:
                first = case.axis % len(case.shape)
                stat_shape = [*case.shape[:first]] + [1] * (len(case.shape) - first)
                outputs.append(helper.make_tensor_value_info(name, F32, stat_shape))
        node = helper.make_node(case.op, names, out_names, domain=DOMAIN, name="fused", **case.attrs())
        graph = helper.make_graph([node], "gpu_check", inputs, outputs)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, OPSET_VERSION)]
        )
        model.ir_version = 10  # ONNX Runtime <= 1.31 rejects newer IR versions
        return model.SerializeToString()

    def run(self, case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
        ort = self.ort
        session = ort.InferenceSession(
            self._model(case), sess_options=self._session_options(), providers=[self.provider]
        )
        if session.get_providers()[0] != self.provider:
            raise RuntimeError(f"session fell back to {session.get_providers()}")
        feeds = {"X": inputs.x}
        if inputs.skip is not None:
            feeds["Skip"] = inputs.skip
        if inputs.scale is not None:
            feeds["Scale"] = inputs.scale
        if inputs.bias is not None:
            feeds["Bias"] = inputs.bias
        wanted = requested_outputs(case)
        values = session.run(list(wanted), feeds)
        profile = Path(session.end_profiling())
        try:
            events = json.loads(profile.read_text())
        finally:
            profile.unlink(missing_ok=True)
        providers = {
            e.get("args", {}).get("provider")
            for e in events
            if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == case.op
        }
        if providers != {self.provider}:
            raise RuntimeError(f"profile shows {case.op} on {sorted(map(str, providers))}, not {self.provider}")
        self.profiles_checked += 1
        results = {}
        for name, value in zip(wanted, values, strict=True):
            results[name] = value.reshape(-1) if name in ("Mean", "InvStdDev", "InvRMS") else value
        return results


def ort_cases(cases: Iterable[Case], limit: int = 80) -> list[Case]:
    """The subset that ONNX Runtime's numpy interface can feed (no bfloat16) with the default layout, thinned
    to `limit` sessions (each costs a session creation) while keeping every op."""
    usable = [
        c
        for c in cases
        if c.layout == "contiguous"
        and c.clusters
        and BF16 not in (c.x_type, c.scale_type, c.output_type)
        and c.rows > 0
        and c.cols <= 16384
    ]
    step = max(1, math.ceil(len(usable) / limit))
    return usable[::step]


# --------------------------------------------------------------------------------------------- ORT's kernels

# ONNX Runtime's own op for each of ours, from the op records (ORT registers SimplifiedLayerNormalization in the
# ONNX domain); the models below import opset 17.
ORT_EQUIVALENTS = {
    name: (native.op_type, native.domain) for name in OPS if (native := SIGNATURES[name].native("ort", 17)) is not None
}
ORT_SHAPES = ((1, 4096), (8192, 768), (8192, 4096), (32768, 1024), (4096, 16384))


def ort_native_model(case: Case) -> bytes:
    """ONNX Runtime's own kernel for `case` (last-axis norm, Scale and Bias in X's type), with Y (and, for the
    Skip ops, the sum) as outputs, like ours in OrtBackend._model with outputs=case.skip."""
    from onnx import helper

    name, domain = ORT_EQUIVALENTS[case.op]
    inputs = [helper.make_tensor_value_info("X", case.x_type, case.shape)]
    names = ["X"]
    if case.skip:
        inputs.append(helper.make_tensor_value_info("Skip", case.x_type, case.shape))
        names.append("Skip")
    inputs.append(helper.make_tensor_value_info("Scale", case.x_type, case.param_shape()))
    names.append("Scale")
    if case.bias:
        inputs.append(helper.make_tensor_value_info("Bias", case.x_type, case.param_shape()))
        names.append("Bias")
    outputs = [helper.make_tensor_value_info("Y", case.x_type, case.shape)]
    out_names = ["Y"]
    if case.skip:
        outputs.append(helper.make_tensor_value_info("Sum", case.x_type, case.shape))
        out_names += ["", "", "Sum"]  # output, mean, inv_std_var, input_skip_bias_sum
    attrs: dict[str, Any] = {"epsilon": case.epsilon}
    if not case.skip:
        attrs["axis"] = -1
    node = helper.make_node(name, names, out_names, domain=domain, name="native", **attrs)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph([node], "ort_native", inputs, outputs), opset_imports=opsets)
    model.ir_version = 10
    return model.SerializeToString()


def time_ort_session(
    ort: Any, model: bytes, options: Any, feeds: dict[str, np.ndarray], outputs: dict[str, tuple], provider: str,
    graphs: bool, runs: int,
) -> tuple[float, dict[str, np.ndarray]]:  # fmt: skip
    """Mean microseconds per run_with_iobinding over `runs` runs (inputs and outputs bound on the
    provider's device once; CUDA graphs on or off), and the outputs of the last run."""
    cuda = provider == "CUDAExecutionProvider"
    device = "cuda" if cuda else "cpu"
    provider_options = {"enable_cuda_graph": "1" if graphs else "0"} if cuda else {}
    session = ort.InferenceSession(model, sess_options=options, providers=[(provider, provider_options)])
    if session.get_providers()[0] != provider:
        raise RuntimeError(f"session fell back to {session.get_providers()}")
    binding = session.io_binding()
    keep = []
    for name, value in feeds.items():
        ort_value = ort.OrtValue.ortvalue_from_numpy(value, device, 0)
        keep.append(ort_value)
        binding.bind_ortvalue_input(name, ort_value)
    bound = {}
    for name, (shape, dtype) in outputs.items():
        bound[name] = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, device, 0)
        binding.bind_ortvalue_output(name, bound[name])
    for _ in range(3):  # warm-up; with CUDA graphs ORT captures during these
        session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    started = time.perf_counter()
    for _ in range(runs):
        session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    elapsed = (time.perf_counter() - started) * 1e6 / runs
    return elapsed, {name: value.numpy() for name, value in bound.items()}


def compare_with_ort_kernels(
    provider: str, shapes: Iterable[tuple[int, int]], dtypes: Iterable[int], runs: int, deadline: float
) -> list[list[str]]:
    """Our ops and ONNX Runtime's own kernels in ONNX Runtime, same inputs, same binding: time per run (CUDA
    graphs off and on) and the largest difference of Y. One row per op x dtype x shape, measured goals first
    (`by_priority`) until `deadline` and returned op by op; a failure (a capture that ORT refused, a missing
    kernel) is written into the row, not raised."""
    import onnxruntime as ort

    backend = OrtBackend(provider)
    plan = [(op, dtype, shape) for op in OPS for dtype in dtypes for shape in shapes]
    return measure_by_priority(plan, deadline, lambda *item: _ort_row(ort, backend, *item, provider, runs))


def _ort_row(
    ort: Any, backend: OrtBackend, op: str, dtype: int, shape: tuple[int, int], provider: str, runs: int
) -> list[str]:
    """One row of the comparison: ours and ORT's kernel, CUDA graphs off and on, their ratios and Y's difference."""
    case = dataclasses.replace(_default_case(op, dtype, shape), outputs=SIGNATURES[op].skip)
    inputs = make_inputs(case, seed=7)
    feeds = {"X": inputs.x, "Scale": inputs.scale}
    if inputs.skip is not None:
        feeds["Skip"] = inputs.skip
    if inputs.bias is not None:
        feeds["Bias"] = inputs.bias
    outputs = dict.fromkeys(requested_outputs(case), (case.shape, np_dtype(dtype)))
    cells = [op, TYPE_NAMES[dtype], "x".join(map(str, shape))]
    results: dict[str, dict[str, np.ndarray]] = {}
    for graphs in (False, True):
        for who, model, options in (
            ("ours", backend._model(case), backend._session_options(profile=False)),
            ("ort", ort_native_model(case), ort.SessionOptions()),
        ):
            if graphs and provider != "CUDAExecutionProvider":
                cells.append("-")
                continue
            try:
                us, got = time_ort_session(ort, model, options, feeds, outputs, provider, graphs, runs)
                results[who] = got
                cells.append(f"{us:.1f}")
            except Exception as exc:  # written into the table
                cells.append(f"failed: {type(exc).__name__}: {str(exc)[:80]}")
    ratios = []
    for i in (3, 5):
        try:
            ratios.append(f"{float(cells[i + 1]) / float(cells[i]):.2f}x")
        except ValueError:
            ratios.append("-")
    if "ours" in results and "ort" in results:
        ratios.append(f"{np.max(np.abs(_as_f64(results['ours']['Y']) - _as_f64(results['ort']['Y']))):.3g}")
    else:
        ratios.append("-")
    return cells + ratios


ORT_HEADER = [
    "op", "dtype", "shape", "ours us", "ORT us", "ours us (graph)", "ORT us (graph)", "ORT/ours", "ORT/ours (graph)",
    "max |Y diff|",
]  # fmt: skip
ORT_NOTE = (
    "Both through ONNX Runtime with IO binding (inputs and outputs on the device, bound once): mean time per "
    "run_with_iobinding over the runs, so each includes ORT's per-run overhead; (graph): the session's CUDA graph "
    "(enable_cuda_graph). ORT: LayerNormalization, SimplifiedLayerNormalization, SkipLayerNormalization, "
    "SkipSimplifiedLayerNormalization (com.microsoft); the Skip ops write Y and the sum."
)
