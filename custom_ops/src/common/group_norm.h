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

// GroupNorm's own attributes, NormAttributes::op_ints in the order of its signature's attribute list.
enum GroupNormInt : size_t {
  kNumGroups = 0,   // required, >= 1: the groups the channels (dim 1) are split into
  kActivation = 1,  // 0 none, 1 SiLU after the affine
};

// Reads and checks X, Scale, Bias and the attributes, allocates Y and fills `problem`; returns an empty string or
// an error message naming the offending input.
std::string PrepareGroupNorm(Ort::KernelContext& ctx, const NormAttributes& attrs, GroupNormProblem* problem);

}  // namespace onnx_norm
