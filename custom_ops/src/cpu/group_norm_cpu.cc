// GroupNorm on the CPU. A group of one sample is a contiguous row of X (its C / G channels times the spatial
// dims), so cpu::Run normalises chunks of groups, without an affine, into a float32 buffer that stays in cache
// (rounded to normalized_type where the attribute says); the epilogue then applies Scale and Bias per channel
// and SiLU, rounding each step to multiply_type, and writes Y in its type.
#include "cpu/group_norm_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/float_convert.h"
#include "common/group_norm.h"
#include "cpu/norm_cpu.h"

namespace onnx_norm {
namespace cpu {
namespace {

struct GroupJob {
  const GroupNormProblem* g;
  const float* scale;  // [C] as float, or null
  const float* bias;
  int64_t chunk_rows;
  std::atomic<bool> failed{false};
};

size_t ElemSize(int type) { return type == kFloat ? 4 : 2; }

void Store(const float* v, int64_t n, int type, void* out) {
  if (type == kFloat16) {
    auto* o = static_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = Float2Half(v[i]);
  } else if (type == kBFloat16) {
    auto* o = static_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = Float2BFloat(v[i]);
  } else {
    std::copy_n(v, n, static_cast<float*>(out));
  }
}

// One group's row, normalised in `v`: the affine of each of its channels, the activation, each step rounded.
void Epilogue(const GroupJob& job, int64_t group_row, float* v) {
  const GroupNormProblem& g = *job.g;
  const int m = g.rows.multiply_type == kFloat ? 0 : g.rows.multiply_type;
  const int64_t groups = g.channels / g.group_channels;
  const int64_t first_channel = (group_row % groups) * g.group_channels;
  for (int64_t c = 0; c < g.group_channels; ++c) {
    const float scale = job.scale ? job.scale[first_channel + c] : 1.0f;
    const float bias = job.bias ? job.bias[first_channel + c] : 0.0f;
    float* row = v + c * g.spatial;
    for (int64_t j = 0; j < g.spatial; ++j) {
      float y = row[j];
      if (job.scale) y = RoundTo(y * scale, m);
      if (job.bias) y = RoundTo(y + bias, m);
      if (g.activation == 1) y = RoundTo(y * RoundTo(1.0f / (1.0f + std::exp(-y)), m), m);
      row[j] = y;
    }
  }
}

void RunChunk(void* data, size_t index) {
  GroupJob& job = *static_cast<GroupJob*>(data);
  const NormProblem& p = job.g->rows;
  const int64_t first = static_cast<int64_t>(index) * job.chunk_rows;
  const int64_t count = std::min(job.chunk_rows, p.rows - first);
  // No exception may leave this function (it runs on ORT's thread pool).
  thread_local std::vector<float> rows;
  try {
    rows.resize(static_cast<size_t>(count * p.cols));
  } catch (...) {
    job.failed = true;
    return;
  }
  NormProblem chunk = p;
  chunk.rows = count;
  chunk.x = static_cast<const char*>(p.x) + static_cast<size_t>(first * p.cols) * ElemSize(p.x_type);
  chunk.y = rows.data();
  chunk.y_type = kFloat;
  if (!Run(chunk, nullptr, nullptr)) {
    job.failed = true;
    return;
  }
  for (int64_t r = 0; r < count; ++r) Epilogue(job, first + r, rows.data() + r * p.cols);
  void* y = static_cast<char*>(p.y) + static_cast<size_t>(first * p.cols) * ElemSize(p.y_type);
  Store(rows.data(), count * p.cols, p.y_type, y);
}

std::vector<float> AsFloat(const void* data, int type, int64_t n) {
  std::vector<float> out;
  if (data == nullptr) return out;
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (type == kFloat16) {
      out[i] = Half2Float(static_cast<const uint16_t*>(data)[i]);
    } else if (type == kBFloat16) {
      out[i] = BFloat2Float(static_cast<const uint16_t*>(data)[i]);
    } else {
      out[i] = static_cast<const float*>(data)[i];
    }
  }
  return out;
}

}  // namespace

OrtStatusPtr ComputeGroupNorm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  GroupNormProblem g;
  const std::string error = PrepareGroupNorm(ctx, attrs, &g);
  if (!error.empty()) return MakeError(op, error);
  const NormProblem& p = g.rows;
  if (p.rows == 0 || p.cols == 0) return nullptr;
  const std::vector<float> scale = AsFloat(g.scale, g.scale_type, g.channels);
  const std::vector<float> bias = AsFloat(g.bias, g.scale_type, g.channels);
  GroupJob job;
  job.g = &g;
  job.scale = g.scale ? scale.data() : nullptr;
  job.bias = g.bias ? bias.data() : nullptr;
  // Chunks of about 64K elements (one group at least), as cpu::Run's own blocks: the float buffer stays in cache.
  constexpr int64_t kChunkElements = 1 << 16;
  job.chunk_rows = std::max<int64_t>(1, kChunkElements / p.cols);
  const size_t total = static_cast<size_t>((p.rows + job.chunk_rows - 1) / job.chunk_rows);
  if (total == 1) {
    RunChunk(&job, 0);
  } else {
    ctx.ParallelFor(&RunChunk, total, 0, &job);
  }
  if (job.failed) return MakeError(op, "out of memory for the row buffers", ORT_RUNTIME_EXCEPTION);
  return nullptr;
}

}  // namespace cpu
}  // namespace onnx_norm
