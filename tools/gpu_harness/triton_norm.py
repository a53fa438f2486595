"""A one-row-per-program Triton LayerNorm / RMSNorm (+ Skip), the baseline of tools/gpu_check.py's bandwidth table.

The usual Triton recipe (one program per row, the whole row in one block of registers, fp32 statistics), written
here so that the comparison needs nothing beyond triton itself. Imported only where triton is installed.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

# Triton's tutorial limit for a row held in one block: 64 KB of the row's elements.
MAX_ROW_BYTES = 65536


@triton.jit
def _row_norm(
    x_ptr, skip_ptr, w_ptr, b_ptr, y_ptr, sum_ptr, cols, eps,
    HAS_SKIP: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * cols + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_SKIP:
        x = x + tl.load(skip_ptr + row * cols + offsets, mask=mask, other=0.0).to(tl.float32)
        rounded = x.to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * cols + offsets, rounded, mask=mask)
        x = rounded.to(tl.float32)
    if RMS:
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / cols + eps)
        y = x * inv
    else:
        mean = tl.sum(x, axis=0) / cols
        d = tl.where(mask, x - mean, 0.0)
        inv = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)
        y = d * inv
    y = y * tl.load(w_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * cols + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def supports(cols: int, element_size: int) -> bool:
    return cols * element_size <= MAX_ROW_BYTES


def norm(x: Any, skip: Any, weight: Any, bias: Any, y: Any, sum_out: Any, eps: float, rms: bool) -> None:
    """y = norm(x (+ skip)) * weight (+ bias) over the last dim of 2-D CUDA tensors; sum_out gets x + skip."""
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    num_warps = min(max(block // 256, 1), 16)
    _row_norm[(rows,)](
        x, skip if skip is not None else x, weight, bias if bias is not None else weight, y,
        sum_out if sum_out is not None else y, cols, eps,
        HAS_SKIP=skip is not None, RMS=rms, HAS_BIAS=bias is not None, BLOCK=block, num_warps=num_warps,
    )  # fmt: skip


def available() -> bool:
    """True when triton can run here (it needs a GPU and a working compiler)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False
