// How GroupNorm's wrapper (group_norm_cuda.cc) and any other caller of LaunchNorm (the tools' harness) pass its
// parameters: NormLaunchParams with row_op = kGroupNormRowOp, rows = N * num_groups (a row is one group of one
// sample), cols = (C / num_groups) * spatial (spatial: the elements of one channel), Scale/Bias [C] of scale_type
// (either may be null), and as op_ints num_groups, spatial and activation (1: SiLU after the affine).
#pragma once

namespace onnx_norm {
namespace cuda {

inline constexpr const char* kGroupNormRowOp = "GroupNorm";
enum GroupNormLaunchInt : int { kGroupNormGroups = 0, kGroupNormSpatial = 1, kGroupNormActivation = 2 };

}  // namespace cuda
}  // namespace onnx_norm
