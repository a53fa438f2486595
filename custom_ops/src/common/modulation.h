// The modulated (adaLN) ops of docs/ops.md, ModulatedLayerNorm and ModulatedRMSNorm: a norm, then per sample
// y = round_m(y * round_m(1 + ModScale)) and y = round_m(y + ModShift). What the CPU and CUDA wrappers share:
// the validation of ModScale/ModShift (the last two inputs; the signatures are the op table's rows in modulation.cc).
// The norm part (X, Scale, Bias, Y, attributes) is validated by PrepareProblem (norm_attributes.h) exactly as for the
// plain ops: the modulated signatures have no Skip and no statistics outputs, so it reads X, Scale and Bias at the
// same input positions.
#pragma once

#include <cstdint>
#include <string>

#include "common/norm_attributes.h"
#include "common/ort_api.h"

namespace onnx_norm {

struct Modulation {
  const void* scale = nullptr;  // ModScale, [batch, cols] in memory (any accepted shape is that, contiguous)
  const void* shift = nullptr;  // ModShift, same
  int type = 0;                 // element type of both
  int64_t batch = 0;            // rows of ModScale: 1 (one modulation for every sample) or X's first dim
  int64_t rows_per_sample = 0;  // norm rows per sample of X: prod(shape(X)[1:axis])
};

// Validates one call of a modulated op: the norm part into `p` (PrepareProblem, which also allocates Y), then
// ModScale/ModShift into `m`. Returns an empty string or an error message naming the input.
std::string PrepareModulated(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs,
                             NormProblem* p, Modulation* m);

// round_m(1 + ModScale) and ModShift as float32, [batch, cols] each, for kernels that apply them per row.
void ModulationFactors(const Modulation& m, int64_t cols, int multiply_type, float* factors, float* shifts);

}  // namespace onnx_norm
