// The modulated ops on the CPU, built on the plain norm kernel (cpu::Run) rather than beside it: the rows of one
// sample share their modulation, so each task hands a chunk of rows of one sample to cpu::Run.
//   - No Scale/Bias of the norm (DiT, PixArt, SD3, Flux: LayerNorm without affine): the modulation *is* the
//     chunk's affine, Scale = round_m(1 + ModScale[b]) and Bias = ModShift[b], and cpu::Run computes
//     round_m(round_m(round_n(n) * Scale) + Bias) -- the op's definition, step for step, in one pass.
//   - With the norm's own Scale/Bias: cpu::Run normalises the chunk (with its affine and rounding points) into a
//     float32 buffer that stays in cache, and the modulation is applied from there as Y is written.
#include "cpu/modulated_cpu.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "common/float_convert.h"
#include "common/modulation.h"
#include "cpu/half_simd.h"
#include "cpu/norm_cpu.h"
#include "cpu/row_convert.h"

namespace onnx_norm {
namespace cpu {
namespace {

struct ModulatedJob {
  const NormProblem* p;
  const Modulation* m;
  const float* factors;  // [m->batch, cols]: round_m(1 + ModScale)
  const float* shifts;   // [m->batch, cols]: ModShift
  int64_t chunk_rows;
  int64_t chunks_per_sample;
  std::atomic<bool> failed{false};
};

// Y rows from normalised float rows: y = round_m(y * factor), y = round_m(y + shift), stored in Y's type.
void ModulateRows(const NormProblem& p, float* rows, int64_t count, void* y, const float* factor,
                  const float* shift) {
  const int64_t n = p.cols;
  const int m = p.multiply_type == kFloat ? 0 : p.multiply_type;
  for (int64_t r = 0; r < count; ++r) {
    float* v = rows + r * n;
    for (int64_t j = 0; j < n; ++j) v[j] *= factor[j];
    RoundFloats(v, n, m);
    for (int64_t j = 0; j < n; ++j) v[j] += shift[j];
    RoundFloats(v, n, m);
  }
  StoreFloats(rows, p.y_type, y, count * n);
}

void RunChunk(void* data, size_t index) {
  ModulatedJob& job = *static_cast<ModulatedJob*>(data);
  const NormProblem& p = *job.p;
  const int64_t sample = static_cast<int64_t>(index) / job.chunks_per_sample;
  const int64_t first = (static_cast<int64_t>(index) % job.chunks_per_sample) * job.chunk_rows;
  const int64_t count = std::min(job.chunk_rows, job.m->rows_per_sample - first);
  const int64_t row = sample * job.m->rows_per_sample + first;
  const int64_t offset = (job.m->batch == 1 ? 0 : sample) * p.cols;

  NormProblem chunk = p;
  chunk.rows = count;
  chunk.x = static_cast<const char*>(p.x) + static_cast<size_t>(row * p.cols) * ElemSize(p.x_type);
  void* y = static_cast<char*>(p.y) + static_cast<size_t>(row * p.cols) * ElemSize(p.y_type);
  if (p.scale == nullptr && p.bias == nullptr) {
    chunk.scale = job.factors + offset;
    chunk.bias = job.shifts + offset;
    chunk.scale_type = kFloat;
    chunk.scale_size = p.cols;
    chunk.y = y;
    if (!Run(chunk, nullptr, nullptr)) job.failed = true;
    return;
  }
  float* rows = ThreadRows(count * p.cols);
  if (rows == nullptr) {
    job.failed = true;
    return;
  }
  if (!RunIntoFloats(chunk, rows)) {
    job.failed = true;
    return;
  }
  ModulateRows(p, rows, count, y, job.factors + offset, job.shifts + offset);
}

}  // namespace

OrtStatusPtr ComputeModulated(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem p;
  Modulation m;
  const std::string error = PrepareModulated(ctx, op, attrs, &p, &m);
  if (!error.empty()) return MakeError(op, error);
  if (p.rows == 0 || p.cols == 0 || m.rows_per_sample == 0) return nullptr;

  const int multiply_type = p.multiply_type == kFloat ? 0 : p.multiply_type;
  std::vector<float> factors(static_cast<size_t>(m.batch * p.cols));
  std::vector<float> shifts(factors.size());
  ModulationFactors(m, p.cols, multiply_type, factors.data(), shifts.data());

  ModulatedJob job;
  job.p = &p;
  job.m = &m;
  job.factors = factors.data();
  job.shifts = shifts.data();
  // Chunks of about 64K elements, as cpu::Run's own blocks: the float buffer of the affine path stays in cache.
  constexpr int64_t kChunkElements = 1 << 16;
  job.chunk_rows = std::max<int64_t>(1, kChunkElements / p.cols);
  job.chunks_per_sample = (m.rows_per_sample + job.chunk_rows - 1) / job.chunk_rows;
  const int64_t samples = p.rows / m.rows_per_sample;
  const size_t total = static_cast<size_t>(samples * job.chunks_per_sample);
  return RunChunks(ctx, op, total, &RunChunk, &job, job.failed);
}

}  // namespace cpu
}  // namespace onnx_norm
