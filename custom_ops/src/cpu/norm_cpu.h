// CPU kernels of the fused norm ops (semantics: docs/ops.md).
#pragma once

#include "common/norm_attributes.h"
#include "common/ort_api.h"

namespace onnx_norm {
namespace cpu {

// Validates the node's inputs, allocates its outputs and computes them on ORT's intra-op thread pool.
OrtStatusPtr Compute(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);

// The computation alone, for a validated problem; `parallel_for(total, fn, data)` runs fn(data, i)
// for i in [0, total), possibly concurrently. Returns false if scratch memory could not be allocated.
using ParallelForFn = void (*)(void* ctx, size_t total, void (*fn)(void*, size_t), void* data);
bool Run(const NormProblem& problem, ParallelForFn parallel_for, void* parallel_ctx);

// A float buffer of `count` elements owned by the calling thread (reused by its next call), or nullptr when it
// cannot be allocated: for the ops built on Run (modulated, GroupNorm), whose chunks run on ORT's thread pool,
// which no exception may leave.
float* ThreadRows(int64_t count);

}  // namespace cpu
}  // namespace onnx_norm
