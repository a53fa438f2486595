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
#include "cpu/row_convert.h"

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

// y = v * s + b, then y * sigmoid(y) with `silu`, in place. Compiled for AVX2 too, chosen at load time (GCC's
// target_clones): the sigmoid is arithmetic-bound, and twice as wide a vector halves its cost (no FMA: the same
// roundings on every machine).
__attribute__((target_clones("avx2", "default"))) void AffineSilu(const float* v, float* out, int64_t n, float s,
                                                                    float b, bool silu) {
  if (silu) {
    for (int64_t j = 0; j < n; ++j) {
      const float y = v[j] * s + b;
      out[j] = y * (1.0f / (1.0f + VectorisableExp(-y)));
    }
  } else {
    for (int64_t j = 0; j < n; ++j) out[j] = v[j] * s + b;
  }
}

void RoundTo(float* v, int64_t n, int type) {
  if (type == kFloat16) {
    for (int64_t j = 0; j < n; ++j) v[j] = Half2Float(Float2Half(v[j]));
  } else if (type == kBFloat16) {
    for (int64_t j = 0; j < n; ++j) v[j] = BFloat2Float(Float2BFloat(v[j]));
  }
}

// One channel of a group, normalised in `v`: y = round_m(y * scale), round_m(y + bias), then SiLU as
// round_m(y * round_m(sigmoid(y))); loops without branches inside, each one vectorised (-ffp-contract=off: the
// multiply and the add stay two roundings, as in the graph).
// `out`: where the result goes (Y itself when it is float32 and nothing is rounded; else `v`, in place).
void ChannelEpilogue(float* v, float* out, int64_t n, const float* scale, const float* bias, int activation, int m) {
  if (m == 0) {  // nothing rounded in between: one pass (a missing Scale is 1, a missing Bias 0: exact)
    AffineSilu(v, out, n, scale ? *scale : 1.0f, bias ? *bias : 0.0f, activation == 1);
    return;
  }
  if (scale != nullptr) {
    const float s = *scale;
    for (int64_t j = 0; j < n; ++j) v[j] *= s;
    RoundTo(v, n, m);
  }
  if (bias != nullptr) {
    const float b = *bias;
    for (int64_t j = 0; j < n; ++j) v[j] += b;
    RoundTo(v, n, m);
  }
  if (activation != 1) return;
  constexpr int64_t kBlock = 256;
  float sigmoid[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t count = std::min(kBlock, n - start);
    float* y = v + start;
    for (int64_t j = 0; j < count; ++j) sigmoid[j] = 1.0f / (1.0f + VectorisableExp(-y[j]));
    RoundTo(sigmoid, count, m);
    for (int64_t j = 0; j < count; ++j) y[j] *= sigmoid[j];
    RoundTo(y, count, m);
  }
}

// One group's row, normalised in `v`: the affine of each of its channels and the activation, into `out`.
void Epilogue(const GroupJob& job, int64_t group_row, float* v, float* out) {
  const GroupNormProblem& g = *job.g;
  const int m = g.rows.multiply_type == kFloat ? 0 : g.rows.multiply_type;
  const int64_t groups = g.channels / g.group_channels;
  const int64_t first_channel = (group_row % groups) * g.group_channels;
  for (int64_t c = 0; c < g.group_channels; ++c) {
    const float* scale = job.scale ? job.scale + first_channel + c : nullptr;
    const float* bias = job.bias ? job.bias + first_channel + c : nullptr;
    ChannelEpilogue(v + c * g.spatial, out + c * g.spatial, g.spatial, scale, bias, g.activation, m);
  }
}

void RunChunk(void* data, size_t index) {
  GroupJob& job = *static_cast<GroupJob*>(data);
  const NormProblem& p = job.g->rows;
  const int64_t first = static_cast<int64_t>(index) * job.chunk_rows;
  const int64_t count = std::min(job.chunk_rows, p.rows - first);
  float* rows = ThreadRows(count * p.cols);
  if (rows == nullptr) {
    job.failed = true;
    return;
  }
  NormProblem chunk = p;
  chunk.rows = count;
  chunk.x = static_cast<const char*>(p.x) + static_cast<size_t>(first * p.cols) * ElemSize(p.x_type);
  if (!RunIntoFloats(chunk, rows)) {
    job.failed = true;
    return;
  }
  void* y = static_cast<char*>(p.y) + static_cast<size_t>(first * p.cols) * ElemSize(p.y_type);
  // A float32 Y without rounding points is written by the epilogue itself: one pass less.
  const bool direct = p.y_type == kFloat && (p.multiply_type == 0 || p.multiply_type == kFloat);
  for (int64_t r = 0; r < count; ++r) {
    float* v = rows + r * p.cols;
    Epilogue(job, first + r, v, direct ? static_cast<float*>(y) + r * p.cols : v);
  }
  if (!direct) Store(rows, count * p.cols, p.y_type, y);
}

}  // namespace

OrtStatusPtr ComputeGroupNorm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  GroupNormProblem g;
  const std::string error = PrepareGroupNorm(ctx, attrs, &g);
  if (!error.empty()) return MakeError(op, error);
  const NormProblem& p = g.rows;
  if (p.rows == 0 || p.cols == 0) return nullptr;
  const std::vector<float> scale = ParameterFloats(g.scale, g.scale_type, g.channels);
  const std::vector<float> bias = ParameterFloats(g.bias, g.scale_type, g.channels);
  GroupJob job;
  job.g = &g;
  job.scale = g.scale ? scale.data() : nullptr;
  job.bias = g.bias ? bias.data() : nullptr;
  // Chunks of about 16K elements (one group at least): the float buffer stays in the L2 cache between cpu::Run
  // and the epilogue (64K, cpu::Run's own block, was slower on the development machine).
  constexpr int64_t kChunkElements = 1 << 14;
  job.chunk_rows = std::max<int64_t>(1, kChunkElements / p.cols);
  const size_t total = static_cast<size_t>((p.rows + job.chunk_rows - 1) / job.chunk_rows);
  return RunChunks(ctx, op, total, &RunChunk, &job, job.failed);
}

}  // namespace cpu
}  // namespace onnx_norm
