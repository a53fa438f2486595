// LaunchModulated (modulated_launch.h): validates, picks the configuration (vector or scalar units, row in
// registers or re-read) and launches on the given stream. Host code only, so that the CPU emulator of the kernels
// (tools/gpu_harness/modulated_emulator.cc) runs this very launcher.
#include "modulated_launch.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "launch_common.h"
#include "modulated_config.cuh"

namespace onnx_norm {
namespace cuda {
namespace {

// The pieces every launcher shares: sizes, errors, overlap, the device and its cached attributes.
using namespace launch;  // NOLINT(build/namespaces): launch_common.h, inside this file's anonymous namespace

// Aligned for units of `vector` elements (every row and modulation row starts at a multiple of cols, which the
// vector path needs to be a multiple of `vector`).
bool VectorAligned(const void* p, int size, int vector) { return launch::VectorAligned(p, size, 0, vector); }

// Up to kModulatedUnits units per thread in registers, 8 to 1024 threads per row (blocks of at least 128 threads);
// rows longer than 1024 * kModulatedUnits units are re-read, one row per 1024-thread block.
ModulatedConfig ChooseConfig(ModulatedArgs* args, bool vector, int element_size) {
  ModulatedConfig config;
  config.vector = vector;
  const int64_t units = vector ? args->cols / (16 / element_size) : args->cols;
  const int64_t group = std::max<int64_t>(8, NextPowerOfTwo((units + kModulatedUnits - 1) / kModulatedUnits));
  config.cached = group <= kModulatedMaxBlock;
  args->group = config.cached ? static_cast<int>(group) : kModulatedMaxBlock;
  config.block = std::max(args->group, 128);
  const int64_t rows_per_block = config.block / args->group;
  config.grid = static_cast<unsigned>(std::min<int64_t>((args->rows + rows_per_block - 1) / rows_per_block, INT_MAX));
  return config;
}

}  // namespace

int LaunchModulated(const ModulatedLaunchParams& mp, void* stream_handle, const char** error) {
  if (error != nullptr) *error = nullptr;
  const NormLaunchParams& p = mp.norm;
  const int y_type = p.y_type == 0 ? p.x_type : p.y_type;
  const int x_size = ElementSize(p.x_type);
  const int y_size = ElementSize(y_type);
  const int param_size = ElementSize(mp.mod_type);
  const bool has_parameters = p.scale != nullptr || p.bias != nullptr;
  if (x_size == 0 || y_size == 0 || param_size == 0 || (has_parameters && p.scale_type != mp.mod_type) ||
      !IsRoundingType(p.normalized_type) || !IsRoundingType(p.multiply_type)) {
    return Fail(-1,
                "LaunchModulated: X, Y, the modulation (and Scale/Bias, of its type) and the rounding types must be "
                "float32, float16 or bfloat16",
                error);
  }
  if (p.rows < 0 || p.rows > INT_MAX || p.cols <= 0 || p.cols > INT_MAX) {
    return Fail(cudaErrorInvalidValue, "LaunchModulated: rows must be in [0, 2^31 - 1] and cols in [1, 2^31 - 1]",
                error);
  }
  if (p.rows == 0) return 0;
  if (p.x == nullptr || p.y == nullptr || mp.mod_scale == nullptr || mp.mod_shift == nullptr) {
    return Fail(cudaErrorInvalidValue, "LaunchModulated: X, Y, ModScale and ModShift are required", error);
  }
  if (p.skip != nullptr || p.sum != nullptr || p.mean != nullptr || p.inv_std != nullptr || (p.rms && p.bias)) {
    return Fail(cudaErrorInvalidValue, "LaunchModulated: no Skip, Sum or statistics, and no Bias for RMSNorm", error);
  }
  if (has_parameters && p.scale_size != p.cols) {
    return Fail(cudaErrorInvalidValue, "LaunchModulated: Scale/Bias must cover the whole row", error);
  }
  if (mp.rows_per_sample <= 0 || p.rows % mp.rows_per_sample != 0 ||
      (mp.mod_batch != 1 && mp.mod_batch != p.rows / mp.rows_per_sample)) {
    return Fail(cudaErrorInvalidValue, "LaunchModulated: the modulation must have one row per sample, or one", error);
  }
  const int64_t y_bytes = p.rows * p.cols * y_size;
  const int64_t mod_bytes = mp.mod_batch * p.cols * param_size;
  const int64_t param_bytes = p.cols * param_size;
  if (Overlap(p.y, y_bytes, p.x, p.rows * p.cols * x_size) || Overlap(p.y, y_bytes, mp.mod_scale, mod_bytes) ||
      Overlap(p.y, y_bytes, mp.mod_shift, mod_bytes) || Overlap(p.y, y_bytes, p.scale, param_bytes) ||
      Overlap(p.y, y_bytes, p.bias, param_bytes)) {
    return Fail(cudaErrorInvalidValue, "LaunchModulated: Y may not overlap an input", error);
  }
  const void* pointers[] = {p.x, p.y, p.scale, p.bias, mp.mod_scale, mp.mod_shift};
  const int sizes[] = {x_size, y_size, param_size, param_size, param_size, param_size};
  for (int i = 0; i < 6; ++i) {
    if (!VectorAligned(pointers[i], sizes[i], 1)) {
      return Fail(cudaErrorInvalidValue, "LaunchModulated: a tensor is not aligned to its element size", error);
    }
  }
  const int vector = 16 / x_size;
  bool vector_ok = p.cols % vector == 0;
  for (int i = 0; i < 6; ++i) vector_ok = vector_ok && VectorAligned(pointers[i], sizes[i], vector);

  ModulatedArgs args{};
  args.x = p.x;
  args.scale = p.scale;
  args.bias = p.bias;
  args.mod_scale = mp.mod_scale;
  args.mod_shift = mp.mod_shift;
  args.y = p.y;
  args.rows = p.rows;
  args.rows_per_sample = mp.rows_per_sample;
  args.mod_broadcast = mp.mod_batch == 1;
  args.cols = static_cast<int>(p.cols);
  args.epsilon = p.epsilon;
  args.rms = p.rms;
  args.param_type = mp.mod_type;
  args.y_type = y_type;
  args.normalized_type = p.normalized_type;
  args.multiply_type = p.multiply_type;
  ModulatedConfig config = ChooseConfig(&args, vector_ok, x_size);

  (void)cudaGetLastError();  // an earlier call's error, already reported: not this launch's
  int device = 0;
  if (const int rc = MakeDeviceCurrent(p.x, p.device, &device, error)) return rc;
  int sm_count = 0;
  cudaError_t status = CachedAttribute(Info(device).sm_count, cudaDevAttrMultiProcessorCount, device, &sm_count);
  if (status != cudaSuccess) return FailCuda(status, error);
  // Blocks loop over rows: a few waves of resident blocks are enough.
  config.grid = std::min<unsigned>(config.grid, static_cast<unsigned>(sm_count * (2048 / config.block) * 4));

  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  switch (p.x_type) {
    case kFloat32:
      status = LaunchModulatedFloat32(args, config, stream);
      break;
    case kFloat16:
      status = LaunchModulatedFloat16(args, config, stream);
      break;
    default:
      status = LaunchModulatedBFloat16(args, config, stream);
      break;
  }
  return status == cudaSuccess ? 0 : FailCuda(status, error);
}

}  // namespace cuda
}  // namespace onnx_norm
