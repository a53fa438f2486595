// GatedRMSNorm's CUDA translation unit: its kernel's instantiations (gated_norm_kernels.cuh, one LaunchKernel per X
// type) and its launcher (registered as kGatedNormRowOp, gated_norm_launch.h): the checks of its parameters and its
// argument block; the row configuration and the launch are the row ops' (row_op_launch.h).
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

#include "gated_norm_kernels.cuh"
#include "gated_norm_launch.h"
#include "launch_common.h"
#include "norm_launch.cuh"
#include "row_op_launch.h"

namespace onnx_norm {
namespace cuda {

// GatedRMSNorm's kernel for every X type.
ONNX_NORM_INSTANTIATE_ROW_OP_LAUNCH(GatedNormArgs)

namespace {

using namespace launch;  // NOLINT(build/namespaces): launch_common.h, inside this file's anonymous namespace

// The sizes and the overlaps: rows of whole groups, a Scale of one row of X, Y apart from every input.
int CheckGatedShapes(const NormLaunchParams& p, const char** error) {
  if (p.rows < 0 || p.rows > INT_MAX || p.cols <= 0 || p.cols > INT_MAX || !(p.epsilon >= 0.0f) || !p.rms) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: GatedRMSNorm: rows and cols must be below 2^31, epsilon >= 0 and "
                "rms set", error);
  }
  if (p.scale != nullptr && (p.scale_size <= 0 || p.scale_size % p.cols != 0 || p.scale_size / p.cols > INT_MAX ||
                             p.rows % (p.scale_size / p.cols) != 0)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: GatedRMSNorm: Scale must hold a whole row of X (scale_size a "
                "multiple of cols whose groups divide rows)", error);
  }
  if (p.skip != nullptr || p.sum != nullptr || p.bias != nullptr || p.mean != nullptr || p.inv_std != nullptr ||
      p.scale_groups != 1 || (p.op_ints[kGateAfterInt] != 0 && p.op_ints[kGateAfterInt] != 1)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: GatedRMSNorm: no Skip, Sum, Bias, statistics or scale groups, "
                "and the gate's order 0 or 1", error);
  }
  if (p.rows == 0) return 0;
  const void* z = p.op_inputs[kGateInput];
  const int64_t y_bytes = p.rows * p.cols * ElementSize(OutputType(p));
  const int64_t x_bytes = p.rows * p.cols * ElementSize(p.x_type);
  if (p.x == nullptr || p.y == nullptr || z == nullptr) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: GatedRMSNorm: X, Z and Y are required", error);
  }
  if (Overlap(p.y, y_bytes, p.x, x_bytes) || Overlap(p.y, y_bytes, z, p.rows * p.cols * ElementSize(p.scale_type)) ||
      Overlap(p.y, y_bytes, p.scale, p.scale_size * ElementSize(p.scale_type))) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: GatedRMSNorm: Y may not overlap an input", error);
  }
  return 0;
}

// Checks GatedRMSNorm's parameters (rows == 0: types and sizes only) and fills `args`; `vector`: whether X, Z, Y
// and Scale can be read and written in 16-byte units.
int PrepareGatedNorm(const NormLaunchParams& p, GatedNormArgs* args, bool* vector, const char** error) {
  const int x_size = ElementSize(p.x_type);
  const int y_size = ElementSize(OutputType(p));
  const int z_size = ElementSize(p.scale_type);
  if (x_size == 0 || y_size == 0 || z_size == 0 || !IsRoundingType(p.normalized_type) ||
      !IsRoundingType(p.multiply_type)) {
    return Fail(kUnsupportedTypes, "LaunchNorm: GatedRMSNorm: X, Y, Z (and Scale, of Z's type) and the rounding types "
                "must be float32, float16 or bfloat16", error);
  }
  if (const int rc = CheckGatedShapes(p, error)) return rc;
  if (p.rows == 0) return 0;
  const void* z = p.op_inputs[kGateInput];
  if (!UnitAligned(p.x, x_size, 1) || !UnitAligned(p.y, y_size, 1) || !UnitAligned(z, z_size, 1) ||
      !UnitAligned(p.scale, z_size, 1)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: a tensor is not aligned to its element size", error);
  }
  const int units = 16 / x_size;
  *vector = p.cols % units == 0 && UnitAligned(p.x, x_size, units) && UnitAligned(p.y, y_size, units) &&
            UnitAligned(z, z_size, units) && UnitAligned(p.scale, z_size, units);
  args->x = p.x;
  args->z = z;
  args->scale = p.scale;
  args->y = p.y;
  args->rows = p.rows;
  args->cols = static_cast<int>(p.cols);
  args->epsilon = p.epsilon;
  args->rms = true;
  args->gate_after = p.op_ints[kGateAfterInt] == 1;
  args->groups = p.scale != nullptr ? static_cast<int>(p.scale_size / p.cols) : 1;
  args->scale_type = p.scale_type;
  args->y_type = OutputType(p);
  args->normalized_type = p.normalized_type;
  args->multiply_type = p.multiply_type;
  return 0;
}

const RowOpRegistrar kGatedNormLauncher{kGatedNormRowOp, &RowOpLauncher<GatedNormArgs, &PrepareGatedNorm>};

}  // namespace
}  // namespace cuda
}  // namespace onnx_norm
