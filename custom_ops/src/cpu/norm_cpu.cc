#include "cpu/norm_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/float_convert.h"
#include "cpu/half_simd.h"
#include "cpu/row_convert.h"
#include "cpu/row_math.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace onnx_norm {
namespace cpu {
namespace {

// The hot loops are also compiled for x86-64-v3 (AVX2) and picked at load time (ifunc): 8-wide
// instead of SSE2's 4-wide. FMA contraction is off (CMakeLists.txt), so both clones round alike.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ONNX_NORM_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ONNX_NORM_HOT
#endif

ONNX_NORM_HOT float SumRow(const float* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += x[i + k];
  }
  for (int k = 0; i < n; ++i, ++k) acc[k] += x[i];
  return ReduceLanes(acc);
}

ONNX_NORM_HOT float SumSquaresRow(const float* x, int64_t n, float center) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const float d = x[i + k] - center;
      acc[k] += d * d;
    }
  }
  for (int k = 0; i < n; ++i, ++k) {
    const float d = x[i] - center;
    acc[k] += d * d;
  }
  return ReduceLanes(acc);
}


// dst = a + b for non-overlapping rows: saying so lets GCC vectorise without run-time overlap checks, which
// it skipped before, leaving the fused Skip ops slower than a separate Add.
ONNX_NORM_HOT void AddFloatRows(const float* __restrict a, const float* __restrict b, float* __restrict dst,
                                int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
}

// acc += b, for Sum written over X or Skip (ORT reuses an input's buffer for Sum when it may, see norm_op.h).
ONNX_NORM_HOT void AddFloatRowsInPlace(float* __restrict acc, const float* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += b[i];
}

// s = x + skip in float32, the row returned for normalising; Sum (if requested) is s rounded to X's type. A
// float32 Sum is that row itself (the add goes straight into it and the row is read back from cache), else `dst`.
const float* AddSkip(const void* x, const void* skip, int type, void* sum, float* dst, int64_t n) {
  if (type == kFloat) {
    const float* a = static_cast<const float*>(x);
    const float* b = static_cast<const float*>(skip);
    float* s = sum != nullptr ? static_cast<float*>(sum) : dst;
    if (s == a) {
      AddFloatRowsInPlace(s, b, n);
    } else if (s == b) {
      AddFloatRowsInPlace(s, a, n);
    } else {
      AddFloatRows(a, b, s, n);
    }
    return s;
  }
  const bool half = type == kFloat16;
  const uint16_t* a = static_cast<const uint16_t*>(x);
  const uint16_t* b = static_cast<const uint16_t*>(skip);
  if (Fused16Available()) {
    AddSkip16(half, a, b, static_cast<uint16_t*>(sum), dst, n);
    return dst;
  }
  (half ? HalfToFloat : BFloatToFloat)(a, dst, n);
  // Skip is converted in stack-sized chunks, then added to the converted X.
  constexpr int64_t kChunk = 256;
  float tmp[kChunk];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t len = std::min(kChunk, n - start);
    (half ? HalfToFloat : BFloatToFloat)(b + start, tmp, len);
    for (int64_t i = 0; i < len; ++i) dst[start + i] += tmp[i];
  }
  // Sum is the float32 sum rounded to X's type; the row normalised stays float32 (docs/ops.md).
  if (sum) (half ? FloatToHalf : FloatToBFloat)(dst, static_cast<uint16_t*>(sum), n);
  return dst;
}

// y = (x - center) * r [* scale] [+ bias]: the fused path when no rounding attribute is set.
// Scale/Bias have `period` elements and repeat along the row.
template <bool kScale, bool kBias>
inline __attribute__((always_inline)) void NormalizeAffine(const float* x, float* y, int64_t n, float center, float r,
                                                           const float* scale, const float* bias, int64_t period) {
  for (int64_t start = 0; start < n; start += period) {
    const int64_t len = std::min(period, n - start);
    const float* xs = x + start;
    float* ys = y + start;
    for (int64_t j = 0; j < len; ++j) {
      float v = (xs[j] - center) * r;
      if (kScale) v *= scale[j];
      if (kBias) v += bias[j];
      ys[j] = v;
    }
  }
}

// One entry point per variant, so that each gets its x86-64-v3 clone with the loop inlined.
ONNX_NORM_HOT void NormalizeScaleBias(const float* x, float* y, int64_t n, float center, float r, const float* scale,
                                      const float* bias, int64_t period) {
  NormalizeAffine<true, true>(x, y, n, center, r, scale, bias, period);
}
ONNX_NORM_HOT void NormalizeScale(const float* x, float* y, int64_t n, float center, float r, const float* scale,
                                  int64_t period) {
  NormalizeAffine<true, false>(x, y, n, center, r, scale, nullptr, period);
}
ONNX_NORM_HOT void NormalizeBias(const float* x, float* y, int64_t n, float center, float r, const float* bias,
                                 int64_t period) {
  NormalizeAffine<false, true>(x, y, n, center, r, nullptr, bias, period);
}
ONNX_NORM_HOT void NormalizeOnly(const float* x, float* y, int64_t n, float center, float r) {
  NormalizeAffine<false, false>(x, y, n, center, r, nullptr, nullptr, n);
}

// Same, with the rounding points of docs/ops.md, as in-place passes over the row held in cache.
ONNX_NORM_HOT void NormalizeRounded(const float* x, float* y, int64_t n, float center, float r, const float* scale,
                      const float* bias, int64_t period, int normalized_type, int multiply_type) {
  for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - center) * r;
  RoundFloats(y, n, normalized_type);
  if (scale) {
    for (int64_t start = 0; start < n; start += period) {
      const int64_t len = std::min(period, n - start);
      for (int64_t j = 0; j < len; ++j) y[start + j] *= scale[j];
    }
    RoundFloats(y, n, multiply_type);
  }
  if (bias) {
    for (int64_t start = 0; start < n; start += period) {
      const int64_t len = std::min(period, n - start);
      for (int64_t j = 0; j < len; ++j) y[start + j] += bias[j];
    }
    RoundFloats(y, n, multiply_type);
  }
}

// Outputs larger than the caches are written with non-temporal stores: a plain store first reads the
// destination line into the cache (read-for-ownership), a third memory pass the kernel does not need.
constexpr int64_t kStreamingBytes = int64_t{32} << 20;

void StreamFloats(const float* src, float* dst, int64_t n) {
#if defined(__SSE2__)
  int64_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15) != 0; ++i) dst[i] = src[i];
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
#else
  std::copy_n(src, n, dst);
#endif
}

void FinishStreaming() {
#if defined(__SSE2__)
  _mm_sfence();  // non-temporal stores are weakly ordered: publish them before the block is done
#endif
}

// Whether the problem's float32 outputs (Y, Sum) are written with non-temporal stores.
bool Streams(const NormProblem& p) { return p.rows * p.cols * int64_t{4} >= kStreamingBytes; }

size_t ElemSize(int type) { return type == kFloat ? 4 : 2; }

// The Skip ops' input stage: the row at `offset` is x + skip in float32 (AddSkip), writing Sum when asked; a
// large float32 Sum is streamed out from the row instead of written in place.
const float* SkipRow(const void* /*input_state*/, const NormProblem& p, size_t offset, float* dst) {
  const size_t elem = ElemSize(p.x_type);
  const void* x_row = static_cast<const char*>(p.x) + offset * elem;
  const void* skip_row = static_cast<const char*>(p.skip) + offset * elem;
  void* sum_row = p.sum ? static_cast<char*>(p.sum) + offset * elem : nullptr;
  const bool stream_sum = sum_row != nullptr && p.x_type == kFloat && Streams(p);
  const float* x = AddSkip(x_row, skip_row, p.x_type, stream_sum ? nullptr : sum_row, dst, p.cols);
  if (stream_sum) StreamFloats(x, static_cast<float*>(sum_row), p.cols);
  return x;
}

struct Job {
  const NormProblem* p;
  const float* scale;  // float copies (or the original float buffers)
  const float* bias;
  int64_t rows_per_block;
  int normalized_type;  // 0 when rounding to it is a no-op (FLOAT)
  int multiply_type;
  bool streaming;  // float32 Y / Sum written with non-temporal stores
  std::atomic<bool> failed{false};
};

// Row `row`'s Scale (or Bias) row: a per-row-group Scale (docs/ops.md) holds scale_groups rows of cols values and
// row r reads row r % scale_groups; one row otherwise.
const float* RowParameter(const float* params, const NormProblem& p, int64_t row) {
  return params == nullptr || p.scale_groups <= 1 ? params : params + (row % p.scale_groups) * p.cols;
}

// What the rows of a block share, worked out once per block.
struct RowPlan {
  const Job& job;
  size_t x_elem;
  size_t y_elem;
  bool rounded;      // rounding attributes set: NormalizeRounded
  int64_t period;    // Scale's (and Bias') period along the row
  bool fused16_out;  // fp16/bf16 Y can be rounded and stored from registers
};

// The row at element `offset` as floats: the op's input stage's row when it has one (NormProblem::input: the Skip
// ops' residual add, the gate before a gated norm), else X itself (float32), else converted into `xbuf`.
const float* ReadRow(const RowPlan& plan, size_t offset, float* xbuf) {
  const NormProblem& p = *plan.job.p;
  // The Skip ops' stage called directly, so that it can be inlined into the row loop: through the pointer the fp16
  // Skip ops measured 3-8% slower than when the residual add had a branch of its own here; called directly, within
  // the run-to-run spread (about 7% at one thread).
  if (p.input == &SkipRow) return SkipRow(p.input_state, p, offset, xbuf);
  if (p.input != nullptr) return p.input(p.input_state, p, offset, xbuf);
  const void* x_row = static_cast<const char*>(p.x) + offset * plan.x_elem;
  if (p.x_type == kFloat) return static_cast<const float*>(x_row);
  LoadFloats(x_row, p.x_type, xbuf, p.cols);
  return xbuf;
}

// Y's row at element `offset` from the float row x: normalised, scaled and shifted (with the rounding attributes;
// `scale` and `bias` the row's own, RowParameter), stored directly where Y is float32 or fp16/bf16 can be rounded
// in registers, else through `ybuf`.
void NormalizeRow(const RowPlan& plan, size_t offset, const float* x, float center, float r, const float* scale,
                  const float* bias, float* ybuf) {
  const Job& job = plan.job;
  const NormProblem& p = *job.p;
  const int64_t n = p.cols;
  void* y_row = static_cast<char*>(p.y) + offset * plan.y_elem;
  if (p.y_type != kFloat && plan.fused16_out) {
    // fp16/bf16 Y from a float row (Skip's sum, a converted X, the Cast-wrapped norms' rounding points): round
    // in registers and store Y directly instead of normalising into a buffer and converting it afterwards.
    NormalizeRounded16(p.y_type == kFloat16, x, static_cast<uint16_t*>(y_row), n, center, r, scale, bias,
                       plan.period, job.normalized_type, job.multiply_type);
    return;
  }
  const bool stream_y = job.streaming && p.y_type == kFloat;
  float* y = p.y_type == kFloat && !stream_y ? static_cast<float*>(y_row) : ybuf;
  if (plan.rounded) {
    NormalizeRounded(x, y, n, center, r, scale, bias, plan.period, job.normalized_type, job.multiply_type);
  } else if (scale && bias) {
    NormalizeScaleBias(x, y, n, center, r, scale, bias, plan.period);
  } else if (scale) {
    NormalizeScale(x, y, n, center, r, scale, plan.period);
  } else if (bias) {
    NormalizeBias(x, y, n, center, r, bias, plan.period);
  } else {
    NormalizeOnly(x, y, n, center, r);
  }
  if (stream_y) {
    StreamFloats(y, static_cast<float*>(y_row), n);
  } else if (p.y_type != kFloat) {
    StoreFloats(y, p.y_type, y_row, n);
  }
}

void RunBlock(void* data, size_t block) {
  Job& job = *static_cast<Job*>(data);
  const NormProblem& p = *job.p;
  const int64_t n = p.cols;
  const int64_t begin = static_cast<int64_t>(block) * job.rows_per_block;
  const int64_t end = std::min(p.rows, begin + job.rows_per_block);
  // Per-thread row buffers: the row is converted (or summed with Skip) once into `xbuf` and every
  // later pass reads it from cache. No exception may leave this function (it runs on ORT's pool).
  thread_local std::vector<float> xbuf;
  thread_local std::vector<float> ybuf;
  try {
    if (static_cast<int64_t>(xbuf.size()) < n) xbuf.resize(n);
    if (static_cast<int64_t>(ybuf.size()) < n) ybuf.resize(n);
  } catch (...) {
    job.failed = true;
    return;
  }
  const bool rounded = job.normalized_type != 0 || job.multiply_type != 0;
  const RowPlan plan{job, ElemSize(p.x_type), ElemSize(p.y_type), rounded, p.scale_size > 0 ? p.scale_size : n,
                     Fused16Available()};
  // fp16 -> fp16 and bf16 -> bf16 without Skip or rounding attributes: fused kernels that convert in
  // registers, where the CPU has the instructions.
  const bool fused16 = p.input == nullptr && !rounded && p.x_type != kFloat && p.y_type == p.x_type && Fused16Available();

  for (int64_t row = begin; row < end; ++row) {
    const size_t offset = static_cast<size_t>(row) * static_cast<size_t>(n);
    const float* scale = RowParameter(job.scale, p, row);
    const float* bias = RowParameter(job.bias, p, row);
    if (fused16) {
      float mean = 0.0f;
      float inv = 0.0f;
      NormRow16(p.x_type == kFloat16, static_cast<const uint16_t*>(p.x) + offset, static_cast<uint16_t*>(p.y) + offset,
                n, p.rms, p.epsilon, p.epsilon_outside, scale, bias, plan.period, &mean, &inv);
      if (p.mean) p.mean[row] = mean;
      if (p.inv_std) p.inv_std[row] = inv;
      continue;
    }
    const float* x = ReadRow(plan, offset, xbuf.data());
    float center = 0.0f;
    float var;
    if (p.rms) {
      var = SumSquaresRow(x, n, 0.0f) / static_cast<float>(n);
    } else {
      center = SumRow(x, n) / static_cast<float>(n);
      var = SumSquaresRow(x, n, center) / static_cast<float>(n);
    }
    const float r = InverseRoot(var, p);
    if (p.mean) p.mean[row] = center;
    if (p.inv_std) p.inv_std[row] = r;
    NormalizeRow(plan, offset, x, center, r, scale, bias, ybuf.data());
  }
  if (job.streaming) FinishStreaming();
}

// Scale/Bias as float: the original buffer if already float32, else a converted copy in `storage`.
const float* AsFloat(const void* data, int type, int64_t n, std::vector<float>& storage) {
  if (data == nullptr) return nullptr;
  if (type == kFloat) return static_cast<const float*>(data);
  storage.resize(static_cast<size_t>(n));
  LoadFloats(data, type, storage.data(), n);
  return storage.data();
}

void ParallelForWithContext(void* ctx, size_t total, void (*fn)(void*, size_t), void* data) {
  static_cast<Ort::KernelContext*>(ctx)->ParallelFor(fn, total, 0, data);
}

}  // namespace

float* ThreadRows(int64_t count) {
  thread_local std::vector<float> rows;
  try {
    rows.resize(static_cast<size_t>(count));
  } catch (...) {
    return nullptr;
  }
  return rows.data();
}

bool RunIntoFloats(NormProblem chunk, float* rows) {
  chunk.y = rows;
  chunk.y_type = kFloat;
  return Run(chunk, nullptr, nullptr);
}

OrtStatusPtr RunChunks(Ort::KernelContext& ctx, const OpSignature& op, size_t total, void (*fn)(void*, size_t),
                       void* job, const std::atomic<bool>& failed) {
  if (total == 1) {
    fn(job, 0);
  } else {
    ctx.ParallelFor(fn, total, 0, job);
  }
  return failed ? MakeError(op, "out of memory for the row buffers", ORT_RUNTIME_EXCEPTION) : nullptr;
}

bool Run(const NormProblem& problem, ParallelForFn parallel_for, void* parallel_ctx) {
  if (problem.rows == 0 || problem.cols == 0) return true;
  NormProblem p = problem;
  if (p.skip != nullptr && p.input == nullptr) p.input = &SkipRow;  // the residual add is the Skip ops' input stage
  std::vector<float> scale_storage;
  std::vector<float> bias_storage;
  Job job;
  job.p = &p;
  job.scale = AsFloat(p.scale, p.scale_type, p.scale_size * p.scale_groups, scale_storage);
  job.bias = AsFloat(p.bias, p.scale_type, p.scale_size * p.scale_groups, bias_storage);
  job.normalized_type = p.normalized_type == kFloat ? 0 : p.normalized_type;
  job.multiply_type = p.multiply_type == kFloat ? 0 : p.multiply_type;
  job.streaming = Streams(p);
  // Blocks of about 64K elements: enough work per task to amortise scheduling, enough tasks to balance.
  constexpr int64_t kBlockElements = 1 << 16;
  job.rows_per_block = std::max<int64_t>(1, kBlockElements / p.cols);
  const int64_t blocks = (p.rows + job.rows_per_block - 1) / job.rows_per_block;
  if (blocks == 1 || parallel_for == nullptr) {
    for (int64_t b = 0; b < blocks; ++b) RunBlock(&job, static_cast<size_t>(b));
  } else {
    parallel_for(parallel_ctx, static_cast<size_t>(blocks), &RunBlock, &job);
  }
  return !job.failed;
}

OrtStatusPtr Compute(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem problem;
  const std::string error = PrepareProblem(ctx, op, attrs, &problem);
  if (!error.empty()) return MakeError(op, error);
  if (!Run(problem, &ParallelForWithContext, &ctx)) {
    return MakeError(op, "out of memory for the row buffers", ORT_RUNTIME_EXCEPTION);
  }
  return nullptr;
}

}  // namespace cpu
}  // namespace onnx_norm
