"""Where tools/gpu_check.py runs a case: torch tensors on the GPU, host memory in the CPU emulator, or a fake that is
the reference (to show the comparison catches a wrong element)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gpu_build import Harness
from gpu_cases import (
    BF16,
    F16,
    F32,
    GUARD,
    IN_PLACE,
    Case,
    Inputs,
    layout_offsets,
    reference_outputs,
    requested_outputs,
)

from onnx_norm.ops.reference import np_dtype

# --------------------------------------------------------------------------------------------- torch backend


def case_attributes(case: Case) -> dict[str, Any]:
    """The launch arguments a case fixes whatever memory holds its tensors (Harness.launch's keywords)."""
    return {
        "scale_size": math.prod(case.param_shape()) // case.scale_groups if case.scale_type is not None else 0,
        "scale_groups": case.scale_groups if case.scale_type is not None else 1,
        "scale_type": case.scale_type or 0,
        "epsilon": case.epsilon,
        "rms": case.rms,
        "normalized_type": case.normalized_type,
        "multiply_type": case.multiply_type,
        "clusters": case.clusters,
        "op_ints": (1,) if case.epsilon_outside else (),  # the norms' op_ints[0] (custom_ops/src/cuda/launch.h)
    }


class TorchHarnessBackend:
    """Runs cases through LaunchNorm on torch CUDA tensors (side stream, guarded outputs)."""

    def __init__(self, harness: Harness, device: int = 0) -> None:
        import ml_dtypes
        import torch

        self.torch = torch
        self.harness = harness
        self.device = torch.device("cuda", device)
        self._bf16 = np.dtype(ml_dtypes.bfloat16)
        self._torch_types = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}

    # numpy <-> torch, bfloat16 through its bit pattern
    def to_device(self, a: np.ndarray, offset: int = 0) -> Any:
        torch = self.torch
        flat = np.ascontiguousarray(a).reshape(-1)
        if flat.dtype == self._bf16:
            src = torch.from_numpy(flat.view(np.int16).copy()).view(torch.bfloat16)
        else:
            src = torch.from_numpy(flat.copy())
        buf = torch.empty(offset + flat.size + GUARD, dtype=src.dtype, device=self.device)
        view = buf[offset : offset + flat.size]
        view.copy_(src)
        return view.view(a.shape)

    def to_host(self, t: Any) -> np.ndarray:
        torch = self.torch
        t = t.detach().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).cpu().numpy().view(self._bf16)
        return t.cpu().numpy()

    def guarded_empty(self, shape: tuple[int, ...], elem: int, offset: int) -> tuple[Any, Any]:
        """(buffer, view): the view starts `offset` elements in; everything else is NaN and must stay so."""
        count = math.prod(shape)
        buf = self.torch.full(
            (offset + count + GUARD,), float("nan"), dtype=self._torch_types[elem], device=self.device
        )
        return buf, buf[offset : offset + count].view(shape)

    def run(self, case: Case, inputs: Inputs, stream: Any = None, launch_only: bool = False) -> dict[str, np.ndarray]:
        torch = self.torch
        # Element offsets of each tensor from a 256-byte-aligned allocation: one common offset keeps the
        # vector path (with a scalar head), mixed offsets force the scalar fallback.
        offsets = layout_offsets(case)
        x = self.to_device(inputs.x, offsets["x"])
        skip = self.to_device(inputs.skip, offsets["skip"]) if inputs.skip is not None else None
        scale = self.to_device(inputs.scale, offsets["param"]) if inputs.scale is not None else None
        bias = self.to_device(inputs.bias, offsets["param"]) if inputs.bias is not None else None
        wanted = requested_outputs(case)
        guarded: dict[str, tuple[Any, Any]] = {"Y": self.guarded_empty(case.shape, case.y_type, offsets["y"])}
        if "Sum" in wanted:
            guarded["Sum"] = self.guarded_empty(case.shape, case.x_type, offsets["sum"])
        for stat in ("Mean", "InvStdDev", "InvRMS"):
            if stat in wanted:
                guarded[stat] = self.guarded_empty((case.rows,), F32, GUARD)
        if case.layout in IN_PLACE:
            # Sum's guarded buffer holds the input it replaces: the kernel reads it, then writes Sum over it.
            target = guarded["Sum"][1]
            if case.layout == "sum-on-x":
                target.copy_(x)
                x = target
            else:
                assert skip is not None
                target.copy_(skip)
                skip = target
        side = stream if stream is not None else torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.harness.launch(
                x=x.data_ptr(),
                y=guarded["Y"][1].data_ptr(),
                rows=case.rows,
                cols=case.cols,
                x_type=case.x_type,
                y_type=case.y_type,
                stream=side.cuda_stream,
                skip=skip.data_ptr() if skip is not None else None,
                scale=scale.data_ptr() if scale is not None else None,
                bias=bias.data_ptr() if bias is not None else None,
                sum_out=guarded["Sum"][1].data_ptr() if "Sum" in guarded else None,
                mean=guarded["Mean"][1].data_ptr() if "Mean" in guarded else None,
                inv_std=next((guarded[s][1].data_ptr() for s in ("InvStdDev", "InvRMS") if s in guarded), None),
                device=self.device.index,
                **case_attributes(case),
            )
        side.synchronize()
        results = {}
        for name, (buf, view) in guarded.items():
            outside = torch.cat([buf[: view.storage_offset()], buf[view.storage_offset() + view.numel() :]])
            if not bool(torch.isnan(outside.float()).all()):
                raise RuntimeError(f"{name}: the kernel wrote outside its output")
            results[name] = self.to_host(view)
        return results


class HostHarnessBackend:
    """Runs cases through LaunchNorm on host memory, for the CPU emulator of the kernels: the same launches,
    offsets and guard bands as TorchHarnessBackend, without a GPU."""

    def __init__(self, harness: Harness, device: int = 0) -> None:
        self.harness = harness
        self.device = device  # an emulated device (EMULATED_DEVICES)
        self.kernels: dict[str, int] = {}
        self._keep: list[np.ndarray] = []

    @staticmethod
    def _aligned(count: int, dtype: np.dtype, offset: int) -> tuple[np.ndarray, np.ndarray]:
        """(buffer, view of `count` elements starting `offset` elements after a 256-byte boundary)."""
        total = (offset + count + GUARD) * dtype.itemsize
        raw = np.empty(total + 256, dtype=np.uint8)
        start = (-raw.ctypes.data) % 256
        buf = raw[start : start + total].view(dtype)
        return buf, buf[offset : offset + count]

    def _input(self, a: np.ndarray | None, offset: int) -> int | None:
        if a is None:
            return None
        buf, view = self._aligned(a.size, a.dtype, offset)
        view[...] = a.reshape(-1)
        self._keep.append(buf)
        return view.ctypes.data

    def run(self, case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
        offsets = layout_offsets(case)
        self._keep = []
        wanted = requested_outputs(case)
        outputs: dict[str, tuple[np.ndarray, np.ndarray, tuple[int, ...]]] = {}
        kinds = {"Y": (case.y_type, case.shape, offsets["y"]), "Sum": (case.x_type, case.shape, offsets["sum"])}
        for stat in ("Mean", "InvStdDev", "InvRMS"):
            kinds[stat] = (F32, (case.rows,), GUARD)
        for name in wanted:
            elem, shape, offset = kinds[name]
            buf, view = self._aligned(math.prod(shape), np_dtype(elem), offset)
            buf[...] = np.asarray(np.nan, dtype=np.float32).astype(buf.dtype)
            outputs[name] = (buf, view, shape)
        x = self._input(inputs.x, offsets["x"]) or 0
        skip = self._input(inputs.skip, offsets["skip"])
        if case.layout in IN_PLACE:
            # Sum's guarded buffer holds the input it replaces: the kernel reads it, then writes Sum over it.
            target = outputs["Sum"][1]
            target[...] = (inputs.x if case.layout == "sum-on-x" else inputs.skip).reshape(-1)
            if case.layout == "sum-on-x":
                x = target.ctypes.data
            else:
                skip = target.ctypes.data
        self.harness.launch(
            x=x,
            y=outputs["Y"][1].ctypes.data,
            rows=case.rows,
            cols=case.cols,
            x_type=case.x_type,
            y_type=case.y_type,
            stream=0,
            skip=skip,
            scale=self._input(inputs.scale, offsets["param"]),
            bias=self._input(inputs.bias, offsets["param"]),
            sum_out=outputs["Sum"][1].ctypes.data if "Sum" in outputs else None,
            mean=outputs["Mean"][1].ctypes.data if "Mean" in outputs else None,
            inv_std=next((outputs[s][1].ctypes.data for s in ("InvStdDev", "InvRMS") if s in outputs), None),
            device=self.device,
            **case_attributes(case),
        )
        kernel = self.harness.last_kernel()
        if kernel and case.rows > 0:
            self.kernels[kernel] = self.kernels.get(kernel, 0) + 1
        results = {}
        for name, (buf, view, shape) in outputs.items():
            start = (view.ctypes.data - buf.ctypes.data) // buf.itemsize
            outside = np.concatenate([buf[:start], buf[start + view.size :]]).astype(np.float32)
            if not np.isnan(outside).all():
                raise RuntimeError(f"{name}: the kernel wrote outside its output")
            results[name] = view.reshape(shape).copy()
        return results


# --------------------------------------------------------------------------------------------- fake backend


class FakeBackend:
    """The reference itself, optionally with one element of one output nudged: checks the checker."""

    def __init__(self, perturb: str | None = None) -> None:
        self.perturb = perturb

    def run(self, case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            reference_values = reference_outputs(case, inputs)
        out = {k: v.copy() for k, v in reference_values.items() if k in requested_outputs(case)}
        if self.perturb and self.perturb in out and out[self.perturb].size:
            target = out[self.perturb].reshape(-1)
            finite = np.flatnonzero(np.isfinite(target.astype(np.float32)))
            if finite.size:
                i = int(finite[len(finite) // 2])
                value = np.float64(target[i].astype(np.float32))
                target[i] = np.asarray(value + 0.05 * max(1.0, abs(value)), dtype=np.float32).astype(target.dtype)
            else:
                target[0] = np.asarray(0.0, dtype=np.float32).astype(target.dtype)
        return out
