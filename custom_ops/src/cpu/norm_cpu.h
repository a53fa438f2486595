// CPU kernels of the fused norm ops (semantics: docs/ops.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

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
// cannot be allocated: for the ops built on Run (an epilogue of their own per chunk), whose chunks run on ORT's
// thread pool, which no exception may leave.
float* ThreadRows(int64_t count);

// `chunk` normalised (with its own affine and rounding points) into the float32 `rows`; false when Run ran out of
// scratch memory.
bool RunIntoFloats(NormProblem chunk, float* rows);

// Runs fn(job, i) for i in [0, total) on ORT's intra-op pool (inline when total is 1), then the error of an op
// whose chunks set `failed` (out of memory), or null.
OrtStatusPtr RunChunks(Ort::KernelContext& ctx, const OpSignature& op, size_t total, void (*fn)(void*, size_t),
                       void* job, const std::atomic<bool>& failed);

}  // namespace cpu
}  // namespace onnx_norm
