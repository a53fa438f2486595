// L2Norm's CUDA translation unit: its kernel's instantiations (l2_norm_kernels.cuh, one LaunchKernel per X type)
// and its launcher (registered as kL2NormRowOp, l2_norm_launch.h): the checks of its parameters and its argument
// block; the row configuration and the launch are the row ops' (row_op_launch.h).
#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "l2_norm_kernels.cuh"
#include "l2_norm_launch.h"
#include "launch_common.h"
#include "norm_launch.cuh"
#include "row_op_launch.h"

namespace onnx_norm {
namespace cuda {

// L2Norm's kernel for every X type.
ONNX_NORM_INSTANTIATE_ROW_OP_LAUNCH(L2NormArgs)

namespace {

using namespace launch;  // NOLINT(build/namespaces): launch_common.h, inside this file's anonymous namespace

// Checks L2Norm's parameters (rows == 0: types and sizes only) and fills `args`; `vector`: whether X, Y and Scale
// can be read and written in 16-byte units (a Scale shorter than the row is read per element).
int PrepareL2Norm(const NormLaunchParams& p, L2NormArgs* args, bool* vector, const char** error) {
  const int x_size = ElementSize(p.x_type);
  const int y_size = ElementSize(OutputType(p));
  const int scale_size = p.scale != nullptr ? ElementSize(p.scale_type) : 4;
  if (x_size == 0 || y_size == 0 || scale_size == 0 || !IsRoundingType(p.normalized_type) ||
      !IsRoundingType(p.multiply_type)) {
    return Fail(kUnsupportedTypes, "LaunchNorm: L2Norm: X, Y, Scale and the rounding types must be float32, "
                "float16 or bfloat16", error);
  }
  const int64_t scale_count = p.scale != nullptr ? p.scale_size : 0;
  if (p.rows < 0 || p.rows > INT_MAX || p.cols <= 0 || p.cols > INT_MAX ||
      (p.scale != nullptr && (scale_count <= 0 || p.cols % scale_count != 0)) || !(p.epsilon >= 0.0f)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: L2Norm: rows and cols must be below 2^31, scale_size must divide "
                "cols and epsilon be >= 0", error);
  }
  if (p.skip != nullptr || p.sum != nullptr || p.bias != nullptr || p.mean != nullptr || p.inv_std != nullptr ||
      p.rms) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: L2Norm: no Skip, Sum, Bias, statistics or RMS", error);
  }
  if (p.rows == 0) return 0;
  const int64_t y_bytes = p.rows * p.cols * y_size;
  if (p.x == nullptr || p.y == nullptr || Overlap(p.y, y_bytes, p.x, p.rows * p.cols * x_size) ||
      Overlap(p.y, y_bytes, p.scale, scale_count * scale_size)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: L2Norm: X and Y are required and Y may not overlap an input",
                error);
  }
  if (!UnitAligned(p.x, x_size, 1) || !UnitAligned(p.y, y_size, 1) || !UnitAligned(p.scale, scale_size, 1)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: a tensor is not aligned to its element size", error);
  }
  const int units = 16 / x_size;
  *vector = p.cols % units == 0 && UnitAligned(p.x, x_size, units) && UnitAligned(p.y, y_size, units) &&
            (p.scale == nullptr || scale_count != p.cols || UnitAligned(p.scale, scale_size, units));
  args->x = p.x;
  args->scale = p.scale;
  args->y = p.y;
  args->rows = p.rows;
  args->cols = static_cast<int>(p.cols);
  args->epsilon = 0.0f;  // RowStatistics: the mean square alone
  args->rms = true;
  args->scale_type = p.scale_type;
  args->scale_size = static_cast<int>(scale_count);
  args->y_type = OutputType(p);
  args->normalized_type = p.normalized_type;
  args->multiply_type = p.multiply_type;
  args->l2_epsilon = p.epsilon;
  args->sqrt_cols = std::sqrt(static_cast<float>(p.cols));
  return 0;
}

const RowOpRegistrar kL2NormLauncher{kL2NormRowOp, &RowOpLauncher<L2NormArgs, &PrepareL2Norm>};

}  // namespace
}  // namespace cuda
}  // namespace onnx_norm
