// L2Norm on the CPU. Rows in chunks on ORT's intra-op pool; a row of a 16-bit X is widened into a float32 buffer
// owned by the thread (cpu::ThreadRows), its sum of squares taken over kLanes partial sums (row_math.h, the order
// the other kernels sum in), and written back rounded once (or at normalized_type/multiply_type when set).
#include "cpu/l2_norm_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/float_convert.h"
#include "common/l2_norm.h"
#include "cpu/half_simd.h"
#include "cpu/norm_cpu.h"
#include "cpu/row_convert.h"
#include "cpu/row_math.h"

namespace onnx_norm {
namespace cpu {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ONNX_NORM_L2_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ONNX_NORM_L2_HOT
#endif

struct L2Job {
  const NormProblem* p;
  const float* scale;  // scale_size floats, or null
  int normalized_type;  // 0 when nothing is rounded there
  int multiply_type;
  int64_t chunk_rows;
  std::atomic<bool> failed{false};
};

size_t ElemSize(int type) { return type == kFloat ? 4 : 2; }

ONNX_NORM_L2_HOT float SumSquares(const float* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += x[i + k] * x[i + k];
  }
  for (int k = 0; i < n; ++i, ++k) acc[k] += x[i] * x[i];
  return ReduceLanes(acc);
}

// out = x * r, then times the scale (element j uses scale[j % scale_size]); no rounding in between.
ONNX_NORM_L2_HOT void Scaled(const float* x, float* out, int64_t n, float r, const float* scale, int64_t size) {
  if (scale == nullptr) {
    for (int64_t j = 0; j < n; ++j) out[j] = x[j] * r;
    return;
  }
  for (int64_t start = 0; start < n; start += size) {
    const int64_t count = std::min(size, n - start);
    for (int64_t j = 0; j < count; ++j) out[start + j] = x[start + j] * r * scale[j];
  }
}


// One row, float32 in `x` (X itself for a float32 X), into `out` (Y itself for a float32 Y, else `x`).
void Row(const L2Job& job, const float* x, float* out) {
  const NormProblem& p = *job.p;
  const int64_t n = p.cols;
  const float norm = std::sqrt(SumSquares(x, n));
  // 1 / max(norm, eps): a zero row with epsilon 0 is 0 * inf = NaN, as x / ||x|| is.
  const float r = 1.0f / std::max(norm, p.epsilon);
  if (job.normalized_type == 0 && job.multiply_type == 0) {
    Scaled(x, out, n, r, job.scale, p.scale_size);
    return;
  }
  Scaled(x, out, n, r, nullptr, 0);
  RoundFloats(out, n, job.normalized_type);
  if (job.scale == nullptr) return;
  for (int64_t start = 0; start < n; start += p.scale_size) {
    const int64_t count = std::min(p.scale_size, n - start);
    for (int64_t j = 0; j < count; ++j) out[start + j] *= job.scale[j];
  }
  RoundFloats(out, n, job.multiply_type);
}

void RunChunk(void* data, size_t index) {
  L2Job& job = *static_cast<L2Job*>(data);
  const NormProblem& p = *job.p;
  const int64_t first = static_cast<int64_t>(index) * job.chunk_rows;
  const int64_t count = std::min(job.chunk_rows, p.rows - first);
  const bool float_in = p.x_type == kFloat;
  const bool float_out = p.y_type == kFloat;
  float* buffer = float_in && float_out ? nullptr : ThreadRows(p.cols);
  if (!(float_in && float_out) && buffer == nullptr) {
    job.failed = true;
    return;
  }
  for (int64_t r = first; r < first + count; ++r) {
    const size_t offset = static_cast<size_t>(r * p.cols);
    const void* x = static_cast<const char*>(p.x) + offset * ElemSize(p.x_type);
    void* y = static_cast<char*>(p.y) + offset * ElemSize(p.y_type);
    const float* row = float_in ? static_cast<const float*>(x) : buffer;
    if (!float_in) LoadFloats(x, p.x_type, buffer, p.cols);
    float* out = float_out ? static_cast<float*>(y) : buffer;
    Row(job, row, out);
    if (!float_out) StoreFloats(buffer, p.y_type, y, p.cols);
  }
}

}  // namespace

OrtStatusPtr ComputeL2Norm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem p;
  const std::string error = PrepareL2Norm(ctx, op, attrs, &p);
  if (!error.empty()) return MakeError(op, error);
  if (p.rows == 0 || p.cols == 0) return nullptr;
  const std::vector<float> scale = ParameterFloats(p.scale, p.scale_type, p.scale_size);
  L2Job job;
  job.p = &p;
  job.scale = p.scale ? scale.data() : nullptr;
  job.normalized_type = p.normalized_type == kFloat ? 0 : p.normalized_type;
  job.multiply_type = p.multiply_type == kFloat ? 0 : p.multiply_type;
  // Chunks of about 64K elements (one row at least): enough work per task to amortise ORT's scheduling.
  constexpr int64_t kChunkElements = 1 << 16;
  job.chunk_rows = std::max<int64_t>(1, kChunkElements / p.cols);
  const size_t total = static_cast<size_t>((p.rows + job.chunk_rows - 1) / job.chunk_rows);
  return RunChunks(ctx, op, total, &RunChunk, &job, job.failed);
}

}  // namespace cpu
}  // namespace onnx_norm
