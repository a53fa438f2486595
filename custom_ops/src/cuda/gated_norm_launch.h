// How GatedRMSNorm's wrapper (gated_norm_cuda.cc) and any other caller of LaunchNorm (the tools' harness) pass its
// parameters: NormLaunchParams with row_op = kGatedNormRowOp, rows = elements / group_size (a row is one group of
// the last dim), cols = group_size, rms true, Scale (may be null) of scale_type with the last dim's D elements
// (scale_size = D: row r reads its group's part, from (r % (D / cols)) * cols), Z (X's shape, of scale_type) as
// op_inputs[kGateInput], and as op_ints whether the gate multiplies Y after the norm (1) or X before it (0).
#pragma once

namespace onnx_norm {
namespace cuda {

inline constexpr const char* kGatedNormRowOp = "GatedRMSNorm";
enum GatedNormLaunchInput : int { kGateInput = 0 };
enum GatedNormLaunchInt : int { kGateAfterInt = 0 };

}  // namespace cuda
}  // namespace onnx_norm
