// GatedRMSNorm's validation, shared by the providers (semantics: docs/ops.md). X and Z are [..., D]; each group of
// group_size elements of a row of X (the whole row when group_size is 0) is one row of the norm's row math
// (NormProblem with rows = elements / group_size, cols = group_size). The gate silu(Z) = Z * sigmoid(Z), in
// float32, multiplies X before the statistic (norm_before_gate 0: the op's input stage) or Y after the Scale
// (norm_before_gate 1: its epilogue).
#pragma once

#include <cstdint>
#include <string>

#include "common/norm_attributes.h"
#include "common/ort_api.h"

namespace onnx_norm {

struct GatedNormProblem {
  NormProblem rows;             // the groups as rows, without Scale (rows.scale stays null)
  const void* z = nullptr;      // Z, X's shape
  int z_type = 0;
  const void* scale = nullptr;  // [D] or null
  int scale_type = 0;
  int64_t dim = 0;              // D: the last dim of X
  int64_t group_size = 0;       // D when the attribute is 0
  bool gate_after = false;      // norm_before_gate = 1
};

// GatedRMSNorm's own attributes, NormAttributes::op_ints in the order of its signature's attribute list.
enum GatedNormInt : size_t {
  kGroupSize = 0,       // >= 0; 0: the whole last dim; else a divisor of it
  kNormBeforeGate = 1,  // 0: gate X before the statistic; 1: gate Y after the Scale
};

// Reads and checks X, Z, Scale and the attributes, allocates Y and fills `problem`; returns an empty string or an
// error message naming the offending input.
std::string PrepareGatedNorm(Ort::KernelContext& ctx, const NormAttributes& attrs, GatedNormProblem* problem);

}  // namespace onnx_norm
