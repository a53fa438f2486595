// GroupNorm's validation, shared by the CPU and CUDA providers (semantics: docs/ops.md). X is [N, C, ...]; each
// group of C / num_groups channels of a sample is one contiguous row of the norm's row math (NormProblem with
// rows = N * G, cols = C / G * spatial), and its epilogue applies Scale/Bias per channel and the activation.
#pragma once

#include <cstdint>
#include <string>

#include "common/norm_attributes.h"
#include "common/ort_api.h"

namespace onnx_norm {

struct GroupNormProblem {
  NormProblem rows;           // the groups as rows, without Scale/Bias (rows.scale/bias stay null)
  const void* scale = nullptr;  // [C] or null
  const void* bias = nullptr;   // [C] or null
  int scale_type = 0;
  int64_t channels = 0;        // C
  int64_t spatial = 0;         // elements per channel: prod(shape(X)[2:])
  int64_t group_channels = 0;  // C / G
  int activation = 0;
};

// num_groups (required, >= 1) and activation (0 or 1): OpSignature::parse_attributes of GroupNorm.
std::string ParseGroupNormAttributes(const OrtKernelInfo* info, NormAttributes* attrs);

// Reads and checks X, Scale, Bias and the attributes, allocates Y and fills `problem`; returns an empty string or
// an error message naming the offending input.
std::string PrepareGroupNorm(Ort::KernelContext& ctx, const NormAttributes& attrs, GroupNormProblem* problem);

}  // namespace onnx_norm
