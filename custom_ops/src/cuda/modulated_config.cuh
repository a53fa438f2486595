// Arguments and launch configuration of the modulated (adaLN) kernels, shared by the host-side launcher
// (modulated_launch.cu, no device code, also built into the CPU emulator) and the kernels (modulated_kernels.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "norm_args.cuh"

namespace onnx_norm {
namespace cuda {

struct ModulatedArgs {
  const void* x;
  const void* scale;  // the norm's own Scale/Bias, param_type; may be null
  const void* bias;
  const void* mod_scale;  // [mod_batch or 1, cols], param_type
  const void* mod_shift;
  void* y;
  int64_t rows;
  int64_t rows_per_sample;
  bool mod_broadcast;  // one modulation row for every sample
  int cols;
  int group;  // threads per row, a power of two >= 8; when > 32 the block size (one row per block)
  float epsilon;
  bool rms;
  int param_type;  // Scale, Bias, ModScale, ModShift
  int y_type;
  int normalized_type;
  int multiply_type;
};

// The row is read in units of N elements: N = 16 / sizeof(X) (one 16-byte vector) when every tensor can be
// read so (kVector), else single elements. kCached: the row stays in registers, up to kModulatedUnits units per
// thread; longer rows are read again from global memory (L2) for the variance and the output.
constexpr int kModulatedUnits = 4;
constexpr int kModulatedMaxBlock = 1024;

struct ModulatedConfig {
  bool vector = false;
  bool cached = true;
  int block = 128;
  unsigned grid = 1;
};

cudaError_t LaunchModulatedFloat32(const ModulatedArgs& args, const ModulatedConfig& config, cudaStream_t stream);
cudaError_t LaunchModulatedFloat16(const ModulatedArgs& args, const ModulatedConfig& config, cudaStream_t stream);
cudaError_t LaunchModulatedBFloat16(const ModulatedArgs& args, const ModulatedConfig& config, cudaStream_t stream);

}  // namespace cuda
}  // namespace onnx_norm
