// GroupNorm's CUDA translation unit: its kernel's instantiations (group_norm_kernels.cuh, one LaunchKernel per X
// type) and its launcher (registered as kGroupNormRowOp, group_norm_launch.h): the checks of its parameters and
// its argument block; the row configuration and the launch are the row ops' (row_op_launch.h).
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

#include "group_norm_kernels.cuh"
#include "group_norm_launch.h"
#include "launch_common.h"
#include "norm_launch.cuh"
#include "row_op_launch.h"

namespace onnx_norm {
namespace cuda {

// GroupNorm's kernel for every X type.
ONNX_NORM_INSTANTIATE_ROW_OP_LAUNCH(GroupNormArgs)

namespace {

using namespace launch;  // NOLINT(build/namespaces): launch_common.h, inside this file's anonymous namespace

// Checks GroupNorm's parameters (rows == 0: types and sizes only) and fills `args`; `vector`: whether X and Y
// can be read and written in 16-byte units (Scale/Bias are read per element).
int PrepareGroupNorm(const NormLaunchParams& p, GroupNormArgs* args, bool* vector, const char** error) {
  const int64_t num_groups = p.op_ints[kGroupNormGroups];
  const int64_t spatial = p.op_ints[kGroupNormSpatial];
  const int64_t activation = p.op_ints[kGroupNormActivation];
  const int x_size = ElementSize(p.x_type);
  const int y_size = ElementSize(OutputType(p));
  const bool has_parameters = p.scale != nullptr || p.bias != nullptr;
  const int param_size = has_parameters ? ElementSize(p.scale_type) : 4;
  if (x_size == 0 || y_size == 0 || param_size == 0 || !IsRoundingType(p.normalized_type) ||
      !IsRoundingType(p.multiply_type)) {
    return Fail(kUnsupportedTypes, "LaunchNorm: GroupNorm: X, Y, Scale/Bias and the rounding types must be float32, "
                "float16 or bfloat16", error);
  }
  const int64_t channels = spatial > 0 && num_groups > 0 ? num_groups * (p.cols / spatial) : 0;
  if (p.rows < 0 || p.rows > INT_MAX || p.cols <= 0 || p.cols > INT_MAX || spatial <= 0 ||
      p.cols % spatial != 0 || num_groups <= 0 || p.rows % num_groups != 0 || channels > INT_MAX || activation < 0 ||
      activation > 1) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: GroupNorm: rows must be N * num_groups, cols a multiple of "
                "spatial, both below 2^31, and activation 0 or 1", error);
  }
  if (p.skip != nullptr || p.sum != nullptr || p.mean != nullptr || p.inv_std != nullptr || p.rms) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: GroupNorm: no Skip, Sum, statistics or RMS", error);
  }
  if (p.rows == 0) return 0;
  const int64_t y_bytes = p.rows * p.cols * y_size;
  if (p.x == nullptr || p.y == nullptr || Overlap(p.y, y_bytes, p.x, p.rows * p.cols * x_size) ||
      Overlap(p.y, y_bytes, p.scale, channels * param_size) || Overlap(p.y, y_bytes, p.bias, channels * param_size)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: GroupNorm: X and Y are required and Y may not overlap an input",
                error);
  }
  if (!UnitAligned(p.x, x_size, 1) || !UnitAligned(p.y, y_size, 1) || !UnitAligned(p.scale, param_size, 1) ||
      !UnitAligned(p.bias, param_size, 1)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: a tensor is not aligned to its element size", error);
  }
  const int units = 16 / x_size;
  *vector = p.cols % units == 0 && UnitAligned(p.x, x_size, units) && UnitAligned(p.y, y_size, units);
  SetCommonArgs(p, args);
  args->spatial = static_cast<int>(spatial);
  args->groups = static_cast<int>(num_groups);
  args->group_channels = static_cast<int>(p.cols / spatial);
  args->activation = static_cast<int>(activation);
  return 0;
}

const RowOpRegistrar kGroupNormLauncher{kGroupNormRowOp, &RowOpLauncher<GroupNormArgs, &PrepareGroupNorm>};

}  // namespace
}  // namespace cuda
}  // namespace onnx_norm
