// The modulated ops' CUDA translation unit: their kernel's instantiations (modulated_kernels.cuh, one LaunchKernel
// per X type) and their launcher (registered as kModulatedRowOp, modulated_launch.h): the checks of the
// modulation and its argument block; the row configuration and the launch are the row ops' (row_op_launch.h).
#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

#include "modulated_kernels.cuh"
#include "modulated_launch.h"
#include "launch_common.h"
#include "norm_launch.cuh"
#include "row_op_launch.h"

namespace onnx_norm {
namespace cuda {

// The modulated kernel for every X type.
ONNX_NORM_INSTANTIATE_ROW_OP_LAUNCH(ModulatedArgs)

namespace {

using namespace launch;  // NOLINT(build/namespaces): launch_common.h, inside this file's anonymous namespace

int CheckModulated(const NormLaunchParams& p, const char** error) {
  const int64_t mod_batch = p.op_ints[kModBatchInt];
  const int64_t rows_per_sample = p.op_ints[kRowsPerSampleInt];
  const int x_size = ElementSize(p.x_type);
  const int y_size = ElementSize(OutputType(p));
  const int param_size = ElementSize(p.scale_type);
  if (p.skip != nullptr || p.sum != nullptr || p.mean != nullptr || p.inv_std != nullptr || (p.rms && p.bias)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: modulated: no Skip, Sum or statistics, and no Bias for RMSNorm",
                error);
  }
  if ((p.scale != nullptr || p.bias != nullptr) && (p.scale_size != p.cols || p.scale_groups != 1)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: modulated: Scale/Bias must cover the whole row", error);
  }
  if (rows_per_sample <= 0 || p.rows % rows_per_sample != 0 ||
      (mod_batch != 1 && mod_batch != p.rows / rows_per_sample)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: the modulation must have one row per sample, or one", error);
  }
  const int64_t y_bytes = p.rows * p.cols * y_size;
  const int64_t mod_bytes = mod_batch * p.cols * param_size;
  const int64_t param_bytes = p.cols * param_size;
  if (Overlap(p.y, y_bytes, p.x, p.rows * p.cols * x_size) || Overlap(p.y, y_bytes, p.op_inputs[kModScaleInput], mod_bytes) ||
      Overlap(p.y, y_bytes, p.op_inputs[kModShiftInput], mod_bytes) || Overlap(p.y, y_bytes, p.scale, param_bytes) ||
      Overlap(p.y, y_bytes, p.bias, param_bytes)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: modulated: Y may not overlap an input", error);
  }
  return 0;
}

// Checks the parameters of a modulated norm (rows == 0: types and sizes only) and fills `args`; `vector`: whether
// every tensor can be read in 16-byte units.
int PrepareModulated(const NormLaunchParams& p, ModulatedArgs* args, bool* vector, const char** error) {
  const void* mod_scale = p.op_inputs[kModScaleInput];
  const void* mod_shift = p.op_inputs[kModShiftInput];
  const int x_size = ElementSize(p.x_type);
  const int y_size = ElementSize(OutputType(p));
  const int param_size = ElementSize(p.scale_type);
  if (x_size == 0 || y_size == 0 || param_size == 0 || !IsRoundingType(p.normalized_type) ||
      !IsRoundingType(p.multiply_type)) {
    return Fail(kUnsupportedTypes,
                "LaunchNorm: modulated: X, Y, the modulation (and Scale/Bias, of its type) and the rounding types "
                "must be float32, float16 or bfloat16",
                error);
  }
  if (p.rows < 0 || p.rows > INT_MAX || p.cols <= 0 || p.cols > INT_MAX) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: modulated: rows must be in [0, 2^31 - 1] and cols in [1, 2^31 - 1]",
                error);
  }
  if (p.rows == 0) return 0;
  if (p.x == nullptr || p.y == nullptr || mod_scale == nullptr || mod_shift == nullptr) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: modulated: X, Y, ModScale and ModShift are required", error);
  }
  if (const int rc = CheckModulated(p, error)) return rc;
  const void* pointers[] = {p.x, p.y, p.scale, p.bias, mod_scale, mod_shift};
  const int sizes[] = {x_size, y_size, param_size, param_size, param_size, param_size};
  for (int i = 0; i < 6; ++i) {
    if (!UnitAligned(pointers[i], sizes[i], 1)) {
      return Fail(cudaErrorInvalidValue, "LaunchNorm: a tensor is not aligned to its element size", error);
    }
  }
  const int units = 16 / x_size;
  *vector = p.cols % units == 0;
  for (int i = 0; i < 6; ++i) *vector = *vector && UnitAligned(pointers[i], sizes[i], units);

  SetCommonArgs(p, args);
  args->mod_scale = mod_scale;
  args->mod_shift = mod_shift;
  args->rows_per_sample = p.op_ints[kRowsPerSampleInt];
  args->mod_broadcast = p.op_ints[kModBatchInt] == 1;
  return 0;
}

const RowOpRegistrar kModulatedLauncher{kModulatedRowOp, &RowOpLauncher<ModulatedArgs, &PrepareModulated>};

}  // namespace
}  // namespace cuda
}  // namespace onnx_norm
