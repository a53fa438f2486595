// GatedRMSNorm on the CPU, built on the plain norm kernel (cpu::Run). Tasks take chunks of whole rows of X (about
// 16K elements); the groups of a chunk are the rows of one NormProblem.
//   - The gate before the norm is Run's input stage (NormProblem::input): GateRow computes x * silu(z) in float32
//     into Run's row buffer, and the statistic and the normalisation read it from there. Without groups, Scale is
//     Run's own affine and Run writes Y: one pass over X and Z, as a plain RMSNorm is one over X.
//   - With groups and a Scale, or with the gate after the norm, Run normalises the chunk into a float32 buffer that
//     stays in cache, and the epilogue applies the per-element Scale (rounded to multiply_type) and the gate in
//     float32, then writes Y in its type.
#include "cpu/gated_norm_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/float_convert.h"
#include "common/gated_norm.h"
#include "cpu/half_simd.h"
#include "cpu/norm_cpu.h"
#include "cpu/row_convert.h"

namespace onnx_norm {
namespace cpu {
namespace {

// v *= z * sigmoid(z), in float32. Compiled for AVX2 too, picked at load time: the sigmoid is arithmetic-bound
// (no FMA: the same roundings on every machine).
__attribute__((target_clones("avx2", "default"))) void MulGate(float* __restrict v, const float* __restrict z, int64_t n) {
  for (int64_t j = 0; j < n; ++j) v[j] *= z[j] * (1.0f / (1.0f + VectorisableExp(-z[j])));
}

// v *= silu(z) for a Z of any float type, converted in stack-sized blocks.
void MulGateAny(float* v, const void* z, int z_type, int64_t n) {
  if (z_type == kFloat) {
    MulGate(v, static_cast<const float*>(z), n);
    return;
  }
  constexpr int64_t kBlock = 256;
  float block[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    LoadFloats(static_cast<const char*>(z) + static_cast<size_t>(start) * 2, z_type, block, len);
    MulGate(v + start, block, len);
  }
}

// Z at the first element of the chunk whose NormProblem reads it through GateRow.
struct GateState {
  const void* z;
  int z_type;
};

// The input stage of the gate before the norm: the row at `offset` is x * silu(z), in float32, in `dst`.
const float* GateRow(const void* state, const NormProblem& p, size_t offset, float* dst) {
  const GateState& gate = *static_cast<const GateState*>(state);
  LoadFloats(static_cast<const char*>(p.x) + offset * ElemSize(p.x_type), p.x_type, dst, p.cols);
  MulGateAny(dst, static_cast<const char*>(gate.z) + offset * ElemSize(gate.z_type), gate.z_type, p.cols);
  return dst;
}

struct GatedJob {
  const GatedNormProblem* g;
  const float* scale;  // [D] as float, or null
  int64_t chunk_rows;  // rows of X per chunk
  int64_t x_rows;
  std::atomic<bool> failed{false};
};

// After Run: the per-element Scale of grouped rows, then the gate after the norm, then Y in its type.
void Epilogue(const GatedJob& job, float* rows, int64_t count, int64_t first_element, void* y) {
  const GatedNormProblem& g = *job.g;
  const NormProblem& p = g.rows;
  const int64_t elements = count * g.dim;
  if (job.scale != nullptr && g.group_size != g.dim) {
    const int m = p.multiply_type == kFloat ? 0 : p.multiply_type;
    for (int64_t r = 0; r < count; ++r) {
      float* v = rows + r * g.dim;
      for (int64_t j = 0; j < g.dim; ++j) v[j] *= job.scale[j];
      RoundFloats(v, g.dim, m);
    }
  }
  if (g.gate_after) {
    const char* z = static_cast<const char*>(g.z) + static_cast<size_t>(first_element) * ElemSize(g.z_type);
    MulGateAny(rows, z, g.z_type, elements);
  }
  StoreFloats(rows, p.y_type, y, elements);
}

void RunChunk(void* data, size_t index) {
  GatedJob& job = *static_cast<GatedJob*>(data);
  const GatedNormProblem& g = *job.g;
  const NormProblem& p = g.rows;
  const int64_t first_row = static_cast<int64_t>(index) * job.chunk_rows;
  const int64_t count = std::min(job.chunk_rows, job.x_rows - first_row);
  const int64_t first = first_row * g.dim;
  NormProblem chunk = p;
  chunk.rows = count * (g.dim / g.group_size);
  chunk.x = static_cast<const char*>(p.x) + static_cast<size_t>(first) * ElemSize(p.x_type);
  const GateState gate{static_cast<const char*>(g.z) + static_cast<size_t>(first) * ElemSize(g.z_type), g.z_type};
  if (!g.gate_after) {
    chunk.input = &GateRow;
    chunk.input_state = &gate;
  }
  const bool grouped = g.group_size != g.dim;
  if (job.scale != nullptr && !grouped) {  // one group per row: the Scale is Run's own affine
    chunk.scale = job.scale;
    chunk.scale_type = kFloat;
    chunk.scale_size = g.dim;
  }
  void* y = static_cast<char*>(p.y) + static_cast<size_t>(first) * ElemSize(p.y_type);
  if (!g.gate_after && (job.scale == nullptr || !grouped)) {  // nothing after the affine: Run writes Y
    chunk.y = y;
    if (!Run(chunk, nullptr, nullptr)) job.failed = true;
    return;
  }
  float* rows = ThreadRows(count * g.dim);
  if (rows == nullptr || !RunIntoFloats(chunk, rows)) {
    job.failed = true;
    return;
  }
  Epilogue(job, rows, count, first, y);
}

}  // namespace

OrtStatusPtr ComputeGatedNorm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  GatedNormProblem g;
  const std::string error = PrepareGatedNorm(ctx, attrs, &g);
  if (!error.empty()) return MakeError(op, error);
  const NormProblem& p = g.rows;
  if (p.rows == 0 || p.cols == 0) return nullptr;
  const std::vector<float> scale = ParameterFloats(g.scale, g.scale_type, g.dim);
  GatedJob job;
  job.g = &g;
  job.scale = g.scale ? scale.data() : nullptr;
  job.x_rows = p.rows / (g.dim / g.group_size);
  // Chunks of about 16K elements (one row at least): the float buffer stays in the L2 cache between cpu::Run and
  // the epilogue.
  constexpr int64_t kChunkElements = 1 << 14;
  job.chunk_rows = std::max<int64_t>(1, kChunkElements / g.dim);
  const size_t total = static_cast<size_t>((job.x_rows + job.chunk_rows - 1) / job.chunk_rows);
  return RunChunks(ctx, op, total, &RunChunk, &job, job.failed);
}

}  // namespace cpu
}  // namespace onnx_norm
